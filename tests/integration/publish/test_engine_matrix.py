"""The engine matrix: the build -> record -> validate -> push -> attest -> promote path on Debian
trixie's Docker 26.1.5 with the containerd image store, with BuildKit's provenance attestation at its
default (the image is then an index holding an attestation manifest) and off. The rest of the suite runs
the same path on bookworm's 20.10 (graphdriver overlay2, BuildKit 0.8: no attestations).

The 26.1.5 engine is a second dockerd (tools/second_engine.py) with its own empty data root, started from
trixie's packages unpacked into a private folder; the machine's engine stays 20.10. Every step runs the
real CLI against it (DOCKER_HOST) with a state directory of its own, so no record of the main suite moves.

What must hold on that engine: the recorded image id is the engine's own id of the image, the digest
pushed is that id (the containerd store pushes the bytes it holds), cosign signs exactly that digest,
and promotion copies exactly that digest. Its cold build is also the run's second full build of the commit: every
package it installs is pinned, and its `pip freeze` equals the main engine's default build's.

Cost: one cold build of the default image on the empty engine, shared by both provenance settings (the second
build runs every step from this module's engine's cache and only exports), one full validation (the second
setting is another digest of the same layers and config: the first's signed evidence is reused by content, and
the reuse is signed onto its digest, which promotion then reads), pushes that reuse the exported blobs, a zstd
push, and the classic devel build on the cold build's cache (~50 s). The build exports its layers at gzip level 1
(`--compression-level`), and its torch layer must be larger than the same files gzipped by the run's push on 20.10. Run
alone, it also makes the main engine's default build and the run's push and signed validation, which it compares with.
Every step's seconds are printed, and a table of them at the end (docs/measurements/ci-suite.md has the figures).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pins
import pytest
import state_here
import steps
from devel_canary import DEVEL
from fleet_reports import KIND, gpu_report
from registries import PASSWORD, USER, LocalRegistry
from second_engine import SecondEngine, StartError, matrix_copy, run_steps, trixie_engine
from state_here import records

from conftest import ROOT, gpuforge, need
from gpuforge.evidence import signed_run
from gpuforge.plan.matrix import load_matrix
from gpuforge.plan.target import ImageRef
from gpuforge.registry import attest
from gpuforge.registry.client import Registry
from gpuforge.state.models import BuildRecord
from gpuforge.validate import evidence
from gpuforge.validate.report_model import Report

# CI runs it (`nox -s tests`); `-m "not heavy"` leaves it out of a local run (docs/ci.md)
pytestmark = [pytest.mark.docker, pytest.mark.heavy]
KEY_PASSWORD = "engine-matrix-key-pass"
GZIP_LEVEL = 1  # `build --compression-level`: the exported layers' gzip level


REGISTRY_LOG: list[Path] = []  # the module registry's log: a failed step shows its last 5xx answers
TIMES: list[tuple[str, float]] = []  # (step, seconds) of this module, printed at its end


@contextmanager
def timed(step: str):
    t0 = time.monotonic()
    try:
        with steps.step(f"engine matrix: {step}"):
            yield
    finally:
        TIMES.append((step, time.monotonic() - t0))
        print(f"engine matrix: {step}: {TIMES[-1][1]:.0f} s", flush=True)


@pytest.fixture(scope="module")
def engine26(docker_engine):
    try:
        with timed("start trixie's dockerd 26.1.5 (containerd store)"):
            eng = SecondEngine(outbound=True, prefix="gf21-", binaries=trixie_engine(), containerd_store=True)
    except (StartError, OSError, subprocess.CalledProcessError) as e:
        need(f"needs trixie's dockerd 26.1.5 as a second engine: {e}")
    print(f"\nengine matrix: second engine {eng.describe()}")
    yield eng
    eng.stop()
    print("\nengine matrix timings:\n" + "\n".join(f"  {s:<60} {t:6.0f} s" for s, t in TIMES)
          + f"\n  {'total':<60} {sum(t for _, t in TIMES):6.0f} s")


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = LocalRegistry(tmp_path_factory.mktemp("reg-engines"), None)
    REGISTRY_LOG.append(Path(reg.log.name))
    yield reg.host
    reg.stop()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    if not shutil.which("cosign"):
        need("needs cosign (Debian trixie's; tools/start-engine.sh installs it)")
    d = tmp_path_factory.mktemp("cosign-engines")
    subprocess.run(["cosign", "generate-key-pair", "--output-key-prefix", str(d / "k")], check=True,
                   capture_output=True, env={**os.environ, "COSIGN_PASSWORD": KEY_PASSWORD})
    return {"key": str(d / "k.key"), "pub": str(d / "k.pub")}


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    """One state dir for both provenance settings, as one CI runner has: the second finds where the first signed
    evidence for the same content (evidence-index.json) and reuses it."""
    return tmp_path_factory.mktemp("engines-state")


SIGNED: dict[str, str] = {}  # provenance -> the ref its validation was signed onto (the default case runs first)


def layers(engine26, ref_or_id: str) -> list[str]:
    """An image's rootfs.diff_ids as the engine holds it (on the containerd store a pushed digest is its id)."""
    return engine26.client.images.get(ref_or_id.rsplit("@", 1)[-1]).attrs["RootFS"]["Layers"]


@pytest.mark.parametrize("provenance", ["default", "false"])
def test_digests_agree_on_docker26_with_the_containerd_store(engine26, registry, keys, test_ca, state, tmp_path,
                                                             provenance, monkeypatch, request):
    env = {"DOCKER_HOST": engine26.host, "GPUFORGE_STATE_DIR": str(state),
           "GPUFORGE_LOG_DIR": str(tmp_path / "logs"), "COSIGN_PASSWORD": KEY_PASSWORD}
    reports = tmp_path / "reports"
    t = load_matrix().select(None)[0]
    # a repository of its own per provenance setting: both build the same tag, and a version tag names one digest
    matrix = matrix_copy(ROOT, tmp_path / "matrix.yaml", registry, f"gpuforge/engines-provenance-{provenance}")

    def cli(*args: str):
        shown = [args[0], *(f"--compression {args[i + 1]}" for i, a in enumerate(args[:-1]) if a == "--compression")]
        with timed(f"[{provenance}] {' '.join(shown)}"):
            r = gpuforge("--matrix", str(matrix), *args, env=env)
        if r.returncode != 0:
            # its own failures only: distribution logs every 404 (a blob not there yet) at level=error too
            errors = [ln for ln in REGISTRY_LOG[0].read_text(errors="replace").splitlines()
                      if "http.response.status=5" in ln]
            pytest.fail(f"gpuforge {' '.join(args)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-3000:]}\n"
                        "the registry's last 5xx answers:\n" + ("\n".join(errors[-5:])[-3000:] or "(none)"))
        return r

    run_state = os.environ["GPUFORGE_STATE_DIR"]  # the run's (tests/conftest.py), where once-per-run results are
    monkeypatch.setenv("GPUFORGE_STATE_DIR", env["GPUFORGE_STATE_DIR"])  # records.require_build reads the CLI's state

    def record() -> BuildRecord:
        return records.require_build(t.id)

    # gzip level 1 for the layers this store keeps and pushes (--compression-level: gzip at 1 took 2.4x less CPU than at
    # 6 for 6.6 % more bytes over torch's libraries, docs/cli.md); the end of the default case shows it reached the exporter
    out = cli("build", "--extra-ca", str(test_ca["bundle"]), "--progress", "plain", "--provenance", provenance,
              "--compression-level", str(GZIP_LEVEL)).stdout
    rec = record()
    cached = run_steps(Path(rec.log).read_text())  # the build's plain BuildKit log
    print(f"\n{sum(cached.values())} of {len(cached)} RUN steps from BuildKit's cache")
    print(f"{t.id} (provenance {provenance}) built on engine {rec.engine}, image store {rec.image_store}: "
          f"{rec.image_id}{' (an image index)' if rec.image_index else ''}")
    assert f"image store {rec.image_store}" in out
    assert rec.engine.startswith("26.1.5") and rec.image_store.startswith("containerd/")
    assert engine26.client.images.get(rec.image_id).id == rec.image_id  # the engine's own id, not the iidfile's
    assert rec.image_index is (provenance == "default")
    if provenance == "default":  # the module's engine starts empty: a cold build, every step run
        assert not any(cached.values()), f"steps from a cache on an empty engine: {[h[:80] for h, c in cached.items() if c]}"
    else:  # the cold build's cache: the devel target through classic BuildKit shares its layers below the devel steps
        classic_devel_build(engine26, test_ca, tmp_path, monkeypatch)

    cli("push", "--registry", registry)
    rec = record()
    pushed = ImageRef.parse(rec.pushed_ref)
    host, repo, tag = pushed.registry, pushed.repository, pushed.tag
    digest = rec.digest
    assert digest == rec.image_id, "the containerd store pushes the very manifest/index it names the image by"
    m = Registry(state_here.auth()).manifest(pushed.pinned(digest))
    assert m is not None and m.digest == digest and m.is_index is (provenance == "default")
    if m.is_index:  # the image manifest plus BuildKit's attestation manifest (platform unknown/unknown)
        plats = [d.get("platform", {}).get("os") for d in json.loads(m.body)["manifests"]]
        assert "linux" in plats and "unknown" in plats, plats

    # the validating run signs its result onto the pushed digest (the only signing path). With provenance off the
    # image is the same layers and config as the first case's (its index's image manifest): that run's signed
    # evidence is reused by content, and no validator runs
    out = cli("validate", "--reports", str(reports), "--attest", "--registry", registry, "--sign-key", keys["key"],
              "--key", keys["pub"]).stdout
    signed, *gpu_signed = attest.verified_predicates(f"{host}/{repo}@{digest}", attest.VALIDATION_TYPE,
                                                     state_here.verifier(keys["pub"]))  # subject == this digest, or none
    assert signed["evidence"]["image_id"] == rec.image_id and not signed["gpu"]
    if provenance == "false":
        source = SIGNED.get("default")
        assert source, "the provenance-off case reuses the default case's evidence: run the module whole"
        assert "gpuforge: reused: the image checks" in out and "gpuforge: validating" not in out, out[-3000:]
        assert signed["run"]["reused_from"]["source"] == source
        # the same layers, as this engine holds each image: the reuse was of this very content
        assert signed["evidence"]["diff_ids"] == layers(engine26, rec.image_id) == layers(engine26, source)
        # and the source's GPU run of these bytes (the fixture below), one statement per GPU host, with no GPU here
        assert "gpuforge: reused: the GPU checks" in out and "of H200 on driver 580.159.04" in out, out[-3000:]
        [gpu] = gpu_signed
        assert gpu["gpu"] and gpu["run"]["reused_from"]["source"] == source
        assert gpu["evidence"]["image_id"] == rec.image_id and gpu["evidence"]["diff_ids"] == signed["evidence"]["diff_ids"]
        print(f"reused {source}'s signed validation and GPU run for {rec.image_id[:19]}: no validator ran")
    else:
        assert "gpuforge: validating" in out and "reused_from" not in signed["run"] and not gpu_signed
        assert signed["evidence"]["diff_ids"] and signed["evidence"]["config"]
        # FIXTURE (no GPU here): a GPU run of these very bytes, signed through the one signing path: this run's checks
        # with the GPU checks of the real H200 run (docs/measurements/smoke-cdi-h200.json), labelled inside
        rep = gpu_report(signed, required=evidence.required_checks(KIND))
        rep["facts"]["fixture"] = "FIXTURE (test_engine_matrix.py): the H200 run's GPU checks on this image's report"
        rep["evidence"].update({k: signed["evidence"][k] for k in ("diff_ids", "config", "inputs")})
        rep.pop("run")
        monkeypatch.setenv("COSIGN_PASSWORD", KEY_PASSWORD)
        signed_run.sign_report(f"{host}/{repo}@{digest}", Report.of(rep), signer=state_here.signer(keys["key"]), target=t)
    SIGNED[provenance] = f"{host}/{repo}@{digest}"

    cli("promote", "--env", "dev", "--registry", registry, "--reports", str(reports), "--key", keys["pub"],
        "--sign-key", keys["key"])
    dev = Registry(state_here.auth()).manifest(pushed.with_tag(f"{tag}-dev"))
    assert dev is not None and dev.digest == digest
    print(f"recorded == pushed == signed == promoted: {digest}")
    if provenance == "false":  # another digest of the same bytes reaches prod with no validator run of its own
        cli("promote", "--env", "prod", "--registry", registry, "--reports", str(reports), "--key", keys["pub"],
            "--sign-key", keys["key"])
        prod = Registry(state_here.auth()).manifest(pushed.with_tag(f"{tag}-prod"))
        assert prod is not None and prod.digest == digest
    if provenance != "default":
        return
    # zstd layers (the containerd store's builder can export them): <tag>-zstd beside the gzip <tag>
    out = cli("push", "--registry", registry, "--compression", "both").stdout
    rec = record()
    assert rec.digest == digest, "the gzip push is the same bytes again"
    zdigest = rec.digest_zstd
    zm = Registry(state_here.auth()).manifest(pushed.with_tag(f"{tag}-zstd"))
    assert zm is not None and zm.digest == zdigest != digest
    zcfg, gcfg = Registry(state_here.auth()).config(pushed.pinned(zdigest)), Registry(state_here.auth()).config(pushed.pinned(digest))
    assert zcfg["rootfs"]["diff_ids"] == gcfg["rootfs"]["diff_ids"]  # same files, compressed otherwise
    assert f"{tag}-zstd@{zdigest} (zstd" in out
    # not signed: `validate --attest` signs the gzip digest it validated; promotion moves only that one
    # the cold build above is the run's second full build of this commit, on another engine and BuildKit: the same
    # packages, every one pinned. The main engine's default build and the run's push of it (the same files, gzipped by
    # 20.10) are asked last, not as arguments, so that the cold build runs beside them instead of waiting; under the
    # run's state dir, where that worker leaves its results (under this module's, the fixtures would build and push the
    # default again and record it here)
    frozen = pins.freeze(engine26.client, rec.image_id)
    assert pins.unpinned(frozen, t) == {}, "installed but not pinned"
    mine = max(layer_sizes(Registry(state_here.auth()), pushed.pinned(digest)))
    with monkeypatch.context() as mp:  # the run's once-per-run results, and its registry's credentials
        mp.setenv("GPUFORGE_STATE_DIR", run_state)
        main_t, main_rec = request.getfixturevalue("default_build")
        run_push = request.getfixturevalue("validated")["push"]
        mp.setenv("GPUFORGE_REGISTRY_USER", USER)
        mp.setenv("GPUFORGE_REGISTRY_PASSWORD", PASSWORD)
        theirs = max(layer_sizes(Registry(state_here.auth()), ImageRef.parse(run_push["ref"]).pinned(run_push["digest"])))
    assert main_t.id == t.id
    assert frozen == pins.freeze(request.getfixturevalue("docker_engine"), main_rec["image_id"]), (
        "two builds of one commit installed different packages")
    # the same files, gzipped at level 1 here and at 20.10's own level (Go's default, 6) by the run's push: the level
    # reached the exporter when the torch layer is the larger by more than the spread of two builds' files
    print(f"the torch layer gzipped at level {GZIP_LEVEL}: {mine / 1e9:.3f} GB; by 20.10's push: {theirs / 1e9:.3f} GB "
          f"({mine / theirs - 1:+.1%})")
    assert mine > 1.03 * theirs, f"level {GZIP_LEVEL} did not reach the exporter: {mine} bytes against {theirs}"


def layer_sizes(reg: Registry, ref: ImageRef) -> list[int]:
    """The compressed sizes of an image's layers as the registry holds them (an index: its linux image manifest's)."""
    m = reg.manifest(ref)
    assert m is not None, ref
    body = json.loads(m.body)
    if m.is_index:
        [linux] = [d["digest"] for d in body["manifests"] if d.get("platform", {}).get("os") == "linux"]
        return layer_sizes(reg, ref.pinned(linux))
    return [layer["size"] for layer in body["layers"]]


def classic_devel_build(engine26, test_ca, tmp_path: Path, monkeypatch) -> None:
    """Classic BuildKit (`DOCKER_BUILDKIT=1 docker build` through this machine's docker 20.10 client: the fallback
    where buildx is absent) builds the devel target on this module's engine, which no other run shares, so the devel
    image's own steps always run through it: apt with cache mounts, the toolkit wheels with the CA build secret and a
    tmpfs. A driver that dropped a mount, the secret or a build argument fails here. Every package it installs is
    pinned. The layers it shares with the default (the torch step's included) come from this module's build cache: the
    provenance-off case runs it (a test of its own would keep xdist from giving this worker test_buildx next:
    tests/conftest.py). The classic driver's other engine, 20.10 without buildx, is not run: its client is this one.

    It was a classic `--no-cache` build of the default on a 20.10 engine of its own: a cold torch install that the
    cold build of this module already is (the second full build of the commit, whose `pip freeze` is compared there)."""
    [t] = load_matrix().select(DEVEL)
    state = tmp_path / "classic-state"
    with timed("classic devel build"):
        r = gpuforge("build", *DEVEL, "--driver", "classic", "--progress", "plain",
                     "--extra-ca", str(test_ca["bundle"]),
                     env={"DOCKER_HOST": engine26.host, "GPUFORGE_STATE_DIR": str(state),
                          "GPUFORGE_LOG_DIR": str(tmp_path / "classic-logs")})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "build driver: classic (DOCKER_BUILDKIT=1 docker build)" in r.stdout
    with monkeypatch.context() as mp:
        mp.setenv("GPUFORGE_STATE_DIR", str(state))
        rec = records.require_build(t.id)
    print(f"{t.id}: built by {rec.driver} via {rec.client or '?'} in {rec.seconds} s")
    assert rec.driver == "classic" and engine26.client.images.get(rec.image_id).id == rec.image_id
    steps = run_steps(Path(rec.log).read_text())
    torch_steps = [h for h in steps if "uv pip install" in h]
    assert torch_steps and all(steps[h] for h in torch_steps), f"the torch step ran again: {steps}"
    ran = [h for h, cached in steps.items() if not cached]
    assert any("--mount=type=secret,id=ca" in h and "nvidia-cuda-nvcc" in h for h in ran) and any(
        "--mount=type=cache" in h and "build-essential" in h for h in ran), (
        f"the devel image's own steps did not run through the classic driver: {[h[:80] for h in ran]}")
    assert pins.unpinned(pins.freeze(engine26.client, rec.image_id), t) == {}, "installed but not pinned"
