"""Real builds on a real engine: the default target, layer reuse, failure isolation, secrets, errors."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import uuid

import pytest
import state_here
from second_engine import checkout_snapshot
from state_here import records

from conftest import ROOT, ctrl_c_able, gpuforge
from gpuforge.builder import runner as build
from gpuforge.engine import client as engine
from gpuforge.errors import BuildError, ConfigError
from gpuforge.plan.matrix import load_matrix
from gpuforge.render import dockerfile as render

pytestmark = pytest.mark.docker

PROBE = ("import json, torch, triton; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
         "'cudnn': torch.backends.cudnn.version(), 'nccl': '.'.join(map(str, torch.cuda.nccl.version())), "
         "'triton': triton.__version__}))")


def test_default_target_has_the_matrix_versions(default_build, docker_engine):
    t, rec = default_build
    out = docker_engine.containers.run(rec["image_id"], ["python3", "-c", PROBE], remove=True, stderr=False)
    got = json.loads(out.decode().strip().splitlines()[-1])
    want = t.expected().as_dict()
    assert got["torch"] == want["torch"] == "2.7.1+cu126"
    assert got["cuda"] == want["cuda"] == "12.6"
    assert str(got["cudnn"]).startswith("905") and want["cudnn"].startswith("9.5.")
    assert got["nccl"] == want["nccl"] and got["nccl"].startswith("2.26.")
    assert got["triton"] == want["triton"] == "3.3.1"


def test_build_record_and_tags(default_build, docker_engine):
    t, rec = default_build
    for key in ("image_id", "tags", "size", "seconds", "driver", "log", "recipe", "revision"):
        assert rec.get(key), key
    img = docker_engine.images.get(t.tags[0])
    assert img.id == rec["image_id"]
    assert img.labels["io.gpuforge.recipe"] == rec["recipe"]
    assert img.labels["org.opencontainers.image.revision"] == rec["revision"]


def _copy_context(tmp_path, *targets):
    """A scratch copy of the one build context with these targets generated into it."""
    ctx = render.copy_context(tmp_path / "ctx")
    for t in targets:
        render.write(t, ctx / "images" / "dist")
    return ctx


@pytest.fixture
def scratch_records(tmp_path, monkeypatch):
    """Builds of scratch contexts record into their own state dir, so the default build's record stays."""
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(tmp_path / "state"))


def _steps(log: str) -> dict[int, tuple[str, bool]]:
    """Dockerfile step number -> (instruction, cached?) from a plain-progress BuildKit log."""
    vertex, steps = {}, {}
    for line in log.splitlines():
        if m := re.match(r"#(\d+) \[(?:\S+ +)?\s*(\d+)/\d+\] (.*)", line):  # [stage-0  2/13] (buildx) or [ 2/13]
            vertex[m[1]] = int(m[2])
            steps[int(m[2])] = (m[3], False)
        elif (m := re.match(r"#(\d+) CACHED", line)) and m[1] in vertex:
            steps[vertex[m[1]]] = (steps[vertex[m[1]]][0], True)
    return steps


def test_entrypoint_only_change_reuses_the_torch_layer(default_build, docker_engine, tmp_path, test_ca, scratch_records):
    # What is asserted is BuildKit's own account: every step before the entrypoint COPY is served from cache
    # and only that step runs. Layer digests are not compared with the default image: an engine that has
    # run a --no-cache build of the same commit holds two equivalent results per cache key and may serve
    # either (CI failed that way once on a reused engine).
    t, rec = default_build
    ctx = _copy_context(tmp_path, t)
    marker = f"# an entrypoint-only change {uuid.uuid4().hex}"  # unique, so that step cannot come from an old run
    with (ctx / "images" / "context" / "entrypoint.sh").open("a") as f:
        f.write(marker + "\n")
    t2 = dataclasses.replace(t, tags=("gpuforge-test/rebuild:entrypoint",))  # same id: same COPY paths, same cache keys
    [res] = build.build_targets([t2], build.BuildOptions(**state_here.build_kw(log_dir=tmp_path), context_root=ctx, extra_ca=str(test_ca["bundle"]), progress="plain"))
    print(f"\nwarm rebuild after an entrypoint-only change: {res.seconds:.1f} s")
    steps = _steps(res.log.read_text())
    [entry] = [k for k, (instr, _) in steps.items() if instr.startswith("COPY images/context/entrypoint.sh")] or [None]
    assert entry, f"no entrypoint COPY step in the build log: {sorted(steps.items())}"
    assert not steps[entry][1], "the changed entrypoint was not copied again"
    rebuilt = [f"{k}: {instr[:60]}" for k, (instr, cached) in sorted(steps.items())
               if not cached and 1 < k and (k < entry or instr.startswith("RUN"))]
    assert not rebuilt, f"steps ran again (only the entrypoint COPY and later metadata may): {rebuilt}"
    a = docker_engine.images.get(rec["image_id"]).attrs["RootFS"]["Layers"]
    b = docker_engine.images.get(res.image_id).attrs["RootFS"]["Layers"]
    assert len(a) == len(b) and a[0] == b[0] and a != b  # same base, same shape, a new entrypoint layer
    out = docker_engine.containers.run(res.image_id, ["tail", "-n1", "/usr/local/bin/gpuforge-entrypoint"],
                                       entrypoint=[], remove=True)
    assert out.decode().strip() == marker
    docker_engine.images.remove("gpuforge-test/rebuild:entrypoint")


def test_failed_target_gets_no_tag_and_others_still_build(default_build, docker_engine, tmp_path, test_ca, capsys,
                                                          scratch_records):
    t, rec = default_build
    bad = dataclasses.replace(t, id="pt2799-cu126-broken", tags=("gpuforge-test/broken:latest",),
                              variant=dataclasses.replace(t.variant, torch="2.7.99"))
    good = dataclasses.replace(t, tags=("gpuforge-test/good:latest",))
    ctx = _copy_context(tmp_path, bad, good)
    base = docker_engine.images.get(t.base_image)
    base.tag("gpuforge-test/broken", "latest")  # an existing tag that a failed build must not move
    with pytest.raises(BuildError, match="1 of 2 target"):
        build.build_targets([bad, good], build.BuildOptions(**state_here.build_kw(log_dir=tmp_path / "logs"), context_root=ctx, jobs=2, keep_going=True, progress="plain",
                                                            extra_ca=str(test_ca["bundle"])))
    err = capsys.readouterr().err
    log = tmp_path / "logs" / f"{bad.id}.log"
    assert f"log: {log}" in err
    assert "a pinned Python package version is not on the index" in err  # the cause, not the log's last line
    assert "2.7.99" in log.read_text()
    assert docker_engine.images.get("gpuforge-test/broken:latest").id == base.id, "the failed build moved a tag"
    assert records.build(bad.id) is None
    assert docker_engine.images.get("gpuforge-test/good:latest").id == records.require_build(good.id).image_id
    for tag in ("gpuforge-test/broken:latest", "gpuforge-test/good:latest"):
        docker_engine.images.remove(tag)


def contains(stream, needle: bytes) -> bool:
    """Whether a byte stream holds `needle`, also across chunk boundaries."""
    tail = b""
    for chunk in stream:
        if needle in tail + chunk:
            return True
        tail = chunk[-len(needle):]
    return False


def test_scanner_finds_a_needle_across_chunks():
    assert contains([b"xxxxABC", b"DEFyyy"], b"ABCDEF")
    assert not contains([b"xxxxABC", b"DEyyy"], b"ABCDEF")


def layers_hold(img, needle: bytes) -> bool:
    """Whether any layer of `img` holds `needle`. On overlay2 (as root) each layer is a folder of the engine's, searched
    in place by grep: 4.6 s for the default image, against 35 s to stream `docker save` through the API and scan it here.
    Another graph driver: its `docker save` stream. Either way a file a later layer deletes is still in its own layer."""
    gd = img.attrs.get("GraphDriver") or {}
    data = gd.get("Data") or {}
    # bottom layer first (LowerDir lists them top down): the base's files are found without reading torch's layer
    dirs = [*reversed(list(filter(None, data.get("LowerDir", "").split(":")))), data.get("UpperDir", "")]
    if gd.get("Name") != "overlay2" or os.geteuid() != 0 or not all(os.path.isdir(d) for d in dirs):
        return contains(img.save(chunk_size=8 << 20), needle)  # another driver, or the engine's folders not here
    assert len(dirs) == len(img.attrs["RootFS"]["Layers"]), f"{len(dirs)} layer folders for {len(img.attrs['RootFS']['Layers'])} layers"
    r = subprocess.run(["grep", "-rqF", "-D", "skip", "-e", needle.decode(), "--", *dirs], capture_output=True, text=True,
                       env={**os.environ, "LC_ALL": "C"}, timeout=600)
    assert r.returncode in (0, 1), f"grep failed: {r.stderr[-500:]}"
    return r.returncode == 0


def test_layer_scanner_finds_what_a_layer_holds(default_build, docker_engine):
    img = docker_engine.images.get(default_build[1]["image_id"])
    assert layers_hold(img, b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"')  # /usr/lib/os-release, in the base layer


def test_ca_bundle_in_no_layer_and_not_in_history(default_build, docker_engine, test_ca):
    t, rec = default_build
    img = docker_engine.images.get(rec["image_id"])
    needle = test_ca["needle"]
    assert not any(needle.decode() in (h.get("CreatedBy") or "") for h in img.history()), "CA bytes in docker history"
    assert needle.decode() not in json.dumps(img.attrs["Config"]), "CA bytes in the image config (ENV, labels, ...)"
    assert not layers_hold(img, needle), "the CA bundle's bytes are in an image layer"


def test_missing_engine_is_one_clear_message():
    r = gpuforge("build", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert r.returncode == 3, r.stderr
    assert "cannot reach the Docker engine at unix:///nonexistent/docker.sock" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_extra_ca_file_is_refused():
    r = gpuforge("build", "--extra-ca", "/nonexistent/ca.pem")
    assert r.returncode == 2 and "--extra-ca: /nonexistent/ca.pem: no such file" in r.stderr
    r = gpuforge("build", env={"GPUFORGE_EXTRA_CA": "/nonexistent/env.pem"})
    assert r.returncode == 2 and "GPUFORGE_EXTRA_CA: /nonexistent/env.pem: no such file" in r.stderr


def test_extra_ca_from_the_matrix_is_blamed_on_the_matrix_line_and_resolved_next_to_it(tmp_path):
    matrix = (ROOT / "matrix.yaml").read_text() + "extra_ca: certs/corp.pem\n"
    line = matrix.count("\n")
    (tmp_path / "matrix.yaml").write_text(matrix)
    r = gpuforge("--matrix", str(tmp_path / "matrix.yaml"), "build", env={"GPUFORGE_EXTRA_CA": ""})
    assert r.returncode == 2, r.stderr
    assert f"{tmp_path / 'matrix.yaml'}:{line}: extra_ca: {tmp_path / 'certs' / 'corp.pem'}: no such file" in r.stderr


def test_driver_choice_is_reported():
    d = engine.choose_driver()
    assert d.name in ("buildx", "classic")
    assert d.describe().startswith(f"build driver: {d.name}")


def test_cache_flags_on_the_classic_driver_are_refused_not_dropped():
    """Classic `docker build` has no --cache-from/--cache-to: asked for with it, the build stops with one line
    (before touching the engine) instead of silently building without the cache."""
    t = load_matrix().select(None)[0]
    for opts in ({"cache_to": "type=inline"}, {"cache_from": ("type=registry,ref=127.0.0.1:5999/x:y",)}):
        with pytest.raises(ConfigError, match=r"--cache-from/--cache-to need buildx, but the build driver is classic"):
            build.build_targets([t], build.BuildOptions(driver="classic", **opts, **state_here.build_kw()))


def test_stale_generated_files_block_a_build(tmp_path):
    # on a copy of the checkout (GPUFORGE_ROOT): the suite never writes into the real one
    snap = checkout_snapshot(ROOT, tmp_path / "checkout")
    f = snap / "images" / "dist" / records_default_id() / "target.json"
    f.write_bytes(f.read_bytes() + b"# drift\n")
    r = gpuforge("build", env={"GPUFORGE_ROOT": str(snap)}, cwd=snap)
    assert r.returncode == 2 and "stale" in r.stderr, r.stderr


def records_default_id() -> str:
    from gpuforge.plan.matrix import load_matrix

    return load_matrix().select(None)[0].id


def test_interrupted_build_creates_no_tag(default_build, docker_engine, tmp_path, test_ca):
    import os
    import signal
    import subprocess
    import sys
    import time

    from docker.errors import ImageNotFound

    t, _ = default_build
    try:
        docker_engine.images.remove("gpuforge-test/interrupted:latest")
    except ImageNotFound:
        pass
    ctx = _copy_context(tmp_path, t)
    df = ctx / "images" / "dist" / t.id / "Dockerfile"
    import uuid

    # a step that is never cached (unique per run) and slow enough to be interrupted
    df.write_text(df.read_text().replace("\nEXPOSE 22 8888", f"\nRUN echo {uuid.uuid4().hex} && sleep 120\nEXPOSE 22 8888"))
    # the run's settings, resolved here as for every build of the suite: its pinned system-layer key keeps every layer
    # but the slow step in the cache (a key resolved afresh differs once a suite publishes during the run, and the
    # whole image is then rebuilt)
    kw = state_here.build_kw(log_dir=tmp_path)
    assert kw["apt_state"], "the run pins no system-layer key (tests/conftest.py sets GPUFORGE_APT_STATE)"
    code = (
        "import dataclasses; from pathlib import Path; from gpuforge.builder import runner as build; from gpuforge.plan.matrix import load_matrix\n"
        "from gpuforge.state.records import Records; from gpuforge.builder import aptstate\n"
        "t = dataclasses.replace(load_matrix().select(None)[0], tags=('gpuforge-test/interrupted:latest',))\n"
        f"build.build_targets([t], build.BuildOptions(context_root=Path({str(ctx)!r}), progress='plain', "
        f"extra_ca={str(test_ca['bundle'])!r}, log_dir=Path({str(kw['log_dir'])!r}), "
        f"apt_state=aptstate.pinned({kw['apt_state'].value!r}, 'GPUFORGE_APT_STATE'), "
        f"records=Records(Path({str(kw['records'].state_dir)!r}))))\n")
    # its output to a file, not a pipe read only at the end: a build that prints more than the pipe holds would stall
    out_file = tmp_path / "out.txt"
    with out_file.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, start_new_session=True, preexec_fn=ctrl_c_able,
                                stdout=sink, stderr=subprocess.STDOUT)
    log = tmp_path / f"{t.id}.log"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (log.exists() and "sleep 120" in log.read_text()) and proc.poll() is None:
        time.sleep(0.5)
    reached = log.exists() and "sleep 120" in log.read_text()
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    out = out_file.read_text()
    assert reached, f"the build never reached its slow step: {out[-2000:]}"
    assert proc.returncode != 0, out[-2000:]
    assert "build interrupted; no tag was created or moved" in out, out[-2000:]
    with pytest.raises(ImageNotFound):
        docker_engine.images.get("gpuforge-test/interrupted:latest")


def test_untrusted_proxy_certificate_is_named_in_the_error(default_build, docker_engine, tmp_path, test_ca, capsys,
                                                           scratch_records):
    """A CA bundle that lacks the TLS proxy's CA (here: only a fresh test CA): pip fails to verify PyPI, and the
    error line says so and how to fix it. The pip step gets a unique no-op so it really runs (a secret is
    not part of the cache key)."""
    import uuid

    t, _ = default_build
    only_fresh = tmp_path / "fresh-ca.pem"
    only_fresh.write_text(_last_cert(test_ca["bundle"].read_text()))
    t2 = dataclasses.replace(t, tags=("gpuforge-test-13/untrusted:latest",))
    ctx = _copy_context(tmp_path, t2)
    df = ctx / "images" / "dist" / t.id / "Dockerfile"
    df.write_text(df.read_text().replace("python3 -m venv /opt/venv", f"python3 -m venv /opt/venv && : {uuid.uuid4().hex}", 1))
    with pytest.raises(BuildError):
        build.build_targets([t2], build.BuildOptions(**state_here.build_kw(log_dir=tmp_path / "logs"), context_root=ctx, extra_ca=str(only_fresh), progress="plain"))
    err = capsys.readouterr().err
    assert "TLS certificate verification failed" in err and "--extra-ca" in err, err[-2000:]


def _last_cert(bundle: str) -> str:
    begin = bundle.rindex("-----BEGIN CERTIFICATE-----")
    return bundle[begin:]


def test_two_clones_of_one_commit_build_one_image_id(default_build, docker_engine, tmp_path, test_ca):
    """The source label once held each clone's own remote (a path, `unknown`, ssh or https), so two clones of one
    commit built two image ids and the second push was refused as a moved tag. Now: one normalised URL, one id."""
    ids = {}
    for name, remote in (("ssh", "git@github.com:acme/gpuforge.git"), ("https", "https://ci:t0k3n@github.com/acme/gpuforge.git")):
        clone = tmp_path / name
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, capture_output=True)
        subprocess.run(["git", "-C", str(clone), "remote", "set-url", "origin", remote], check=True, capture_output=True)
        env = {"GPUFORGE_STATE_DIR": str(tmp_path / f"state-{name}"), "GPUFORGE_ROOT": str(clone),
               "GPUFORGE_REGISTRY": "127.0.0.1:5999"}  # tags of their own: the default build's tag stays
        for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY"):
            env[k] = ""  # the clone's own remote decides, as on a developer's machine
        r = gpuforge("build", "--extra-ca", str(test_ca["bundle"]), "--progress", "plain",
                     env=env, cwd=clone)
        assert r.returncode == 0, f"build in the {name} clone failed:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
        builds = json.loads((tmp_path / f"state-{name}" / "builds.json").read_text())["builds"]
        ids[name] = builds[default_build[0].id]["image_id"]
        labels = docker_engine.images.get(ids[name]).labels
        assert labels.get("org.opencontainers.image.source") == "https://github.com/acme/gpuforge", labels
    assert ids["ssh"] == ids["https"], ids
    for tag in {t for i in set(ids.values()) for t in docker_engine.images.get(i).tags if t.startswith("127.0.0.1:5999/")}:
        docker_engine.images.remove(tag)
