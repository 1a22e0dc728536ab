"""Every build is pushed under a version tag of its own, so a pipeline pushes each commit's build (and the weekly
rebuild of the same commit) after the one before without --replace, and a version tag never moves: against the
run's htpasswd docker-registry, with the real CLI and engine.

The builds are small: one 2 MB layer imported here (`docker import`), labelled with a revision as gpuforge's build
labels it, so two revisions are two images of the same layer (re-labelled images, as the next commit's build
of unchanged files is). Each is recorded as the build stage records it (gpuforge.builder.runner.build_id, the
target's version tag) in a state folder of the test's own, under a matrix copy's own repository: the push path
does not care how big the image is, and no torch image is built for this module.

The promotion test stands in for the evidence gate (promote.judge): that gate needs the validated torch image and is
test_registry.py's. Here it is the tags that are checked: each build's `<version>-dev` stays on that build, while
`<tag>-dev` and the aliases follow promotions and the rollback, with no --replace, and the signed promotion records
(real cosign, the run's key) name each build's version."""

from __future__ import annotations

import datetime as dt
import io
import os
import subprocess
import tarfile
import time

import docker.errors
import pytest
import state_here
from devel_canary import set_env
from registries import PASSWORD, USER, run_registry
from second_engine import matrix_copy

from conftest import ROOT, gpuforge
from gpuforge.builder.runner import build_id
from gpuforge.errors import PromotionRefused
from gpuforge.plan.matrix import load_matrix
from gpuforge.plan.version import BuildId
from gpuforge.publish import history, promote, rollback, status
from gpuforge.push import pusher
from gpuforge.registry.client import Registry, RegistryAuth
from gpuforge.state import records as records_module
from gpuforge.state.promotions import Evidence
from gpuforge.state.records import Records

pytestmark = pytest.mark.docker
REVISION = "org.opencontainers.image.revision"


def _layer() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("data/blob")
        info.size = 2_000_000
        tar.addfile(info, io.BytesIO(os.urandom(info.size)))
    return buf.getvalue()


class Builds:
    """The matrix default target of a matrix copy pointed at a repository of this test's own, and its builds."""

    def __init__(self, docker_engine, tmp_path, name: str):
        self.engine, self.host = docker_engine, run_registry()
        self.repo = f"gpuforge-test/versions-{os.getpid()}-{name}"
        self.matrix = matrix_copy(ROOT, tmp_path / "matrix.yaml", self.host, self.repo)
        self.target = load_matrix(self.matrix).select(None)[0]
        self.records = Records(tmp_path / "state")
        self.env = {"GPUFORGE_STATE_DIR": str(tmp_path / "state"), "GPUFORGE_LOG_DIR": str(tmp_path / "logs"),
                    "GPUFORGE_REGISTRY_USER": USER, "GPUFORGE_REGISTRY_PASSWORD": PASSWORD}
        self.layer = _layer()
        self.made: list[str] = []

    def build(self, revision: str) -> records_module.BuildRecord:
        """An image of this revision recorded as `gpuforge build` records one: a new identifier for another image."""
        iid = subprocess.run(["docker", "import", "--change", f"LABEL {REVISION}={revision}", "-"], input=self.layer,
                             capture_output=True, check=True).stdout.decode().strip()
        self.made.append(iid)
        before = self.records.build(self.target.id)
        now = dt.datetime.now(dt.UTC)
        while before and before.build == str(BuildId.at_time(now)):  # two builds are seconds apart, not less
            time.sleep(0.2)
            now = dt.datetime.now(dt.UTC)
        build = build_id(before, iid, now)
        stale = {} if before and before.image_id == iid else dict.fromkeys(records_module.IMAGE_FACTS)
        return self.records.update_build(self.target.id, image_id=iid, tags=list(self.target.tags), revision=revision,
                                         built_at=now.isoformat(timespec="seconds"), build=str(build),
                                         version=self.target.version(build), **stale)

    def push(self, *args: str):
        return gpuforge("--matrix", str(self.matrix), "push", *args, env=self.env, timeout=600)

    def at(self, tag: str) -> str | None:
        m = Registry(RegistryAuth(USER, PASSWORD)).manifest(self.target.ref.with_tag(tag))
        return m.digest if m else None

    def remove(self) -> None:
        for iid in self.made:
            subprocess.run(["docker", "rmi", "-f", iid], capture_output=True, check=False)


@pytest.fixture
def builds(docker_engine, tmp_path, request):
    b = Builds(docker_engine, tmp_path, request.node.name.removeprefix("test_")[:20].strip("_"))
    yield b
    b.remove()


def test_two_builds_of_one_target_are_each_pushed_under_their_own_version_tag(builds):
    """The pipeline: build and push at one revision, then at the next; both pushes succeed, each under its own
    version tag, and the first one's still names the first digest."""
    first = builds.build("1111111111111111111111111111111111111111")
    r = builds.push()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    one = builds.records.require_build(builds.target.id)
    ref1 = builds.target.version_ref(first.version)
    assert first.version == f"{builds.target.tag}-{first.build}" and one.pushed_ref == str(ref1)
    assert f"gpuforge: pushed {ref1}@{one.digest} (gzip" in r.stdout, r.stdout

    second = builds.build("2222222222222222222222222222222222222222")
    assert second.image_id != first.image_id and second.digest is None  # another image: not pushed yet
    assert second.version != first.version and sorted([second.version, first.version]) == [first.version, second.version]
    r = builds.push()  # no --replace: another build, another tag
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    two = builds.records.require_build(builds.target.id)
    assert two.digest != one.digest and two.pushed_ref == str(builds.target.version_ref(second.version))
    assert not two.replaced
    assert builds.at(first.version) == one.digest and builds.at(second.version) == two.digest
    assert builds.at(builds.target.tag) is None  # the target's tag names no build in the registry
    # the engine keeps the target's tag, never a version tag: old builds' images are not held alive by them
    for version in (first.version, second.version):
        with pytest.raises(docker.errors.ImageNotFound):
            builds.engine.images.get(str(builds.target.version_ref(version)))


def test_a_version_tag_moves_only_with_replace_and_that_is_recorded(builds):
    """The same build identifier pushed with other bytes (a record edited by hand, two runners in the same second) is
    a genuine re-push: refused without --replace, moved and recorded with it."""
    first = builds.build("1111111111111111111111111111111111111111")
    assert builds.push().returncode == 0
    d1 = builds.records.require_build(builds.target.id).digest
    iid = subprocess.run(["docker", "import", "--change", f"LABEL {REVISION}=3333333333333333333333333333333333333333",
                          "-"], input=builds.layer, capture_output=True, check=True).stdout.decode().strip()
    builds.made.append(iid)
    builds.records.update_build(builds.target.id, image_id=iid, digest=None)  # the version of the first, other bytes
    r = builds.push()
    assert r.returncode == 7, r.stdout[-2000:] + r.stderr[-2000:]
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and f"{builds.repo}:{first.version} already holds {d1}" in err[0], err
    assert "version tags are immutable: pass --replace" in err[0]
    assert builds.at(first.version) == d1
    r = builds.push("--replace")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"--replace: moving version tag {builds.repo}:{first.version} off {d1}" in r.stderr
    rec = builds.records.require_build(builds.target.id)
    assert builds.at(first.version) == rec.digest != d1
    assert rec.replaced[-1]["tag"] == first.version and rec.replaced[-1]["from"] == d1


def test_promotions_of_two_builds_move_the_environment_and_keep_each_builds_own_tag(
        builds, cosign_keys, monkeypatch, tmp_path):
    set_env(monkeypatch, cosign_keys, USER, PASSWORD)
    monkeypatch.setattr(promote, "judge", lambda *a, **kw: Evidence(validation="sha256:" + "0" * 64, green=True))
    t = builds.target
    kw = {"auth": state_here.auth(), "verifier": state_here.verifier(cosign_keys["pub"]),
          "signer": state_here.signer(cosign_keys["key"])}
    moving = promote.env_tags(t, "dev").moving
    assert moving[0] == f"{t.tag}-dev" and "latest-dev" in moving

    def build_push_promote(revision: str) -> tuple[str, str]:
        b = builds.build(revision)
        [pushed] = pusher.push_targets([t], records=builds.records, log_dir=tmp_path / "logs", auth=kw["auth"])
        [res] = promote.promote_targets([t], env="dev", records=builds.records, **kw)  # never --replace
        assert res["replaced"] == [] and f"{b.version}-dev" in res["moved"], res
        return b.version, pushed["digest"]

    v1, d1 = build_push_promote("1111111111111111111111111111111111111111")
    v2, d2 = build_push_promote("2222222222222222222222222222222222222222")
    assert d1 != d2 and builds.at(f"{v1}-dev") == d1 and builds.at(f"{v2}-dev") == d2
    assert all(builds.at(tg) == d2 for tg in moving)
    # prod takes a build that went through dev, by that build's own dev tag (not by what dev holds now)
    b3 = builds.build("3333333333333333333333333333333333333333")
    [p3] = pusher.push_targets([t], records=builds.records, log_dir=tmp_path / "logs", auth=kw["auth"])
    with pytest.raises(PromotionRefused, match=f"{b3.version}-dev does not point to {p3['digest']}; promote this build"):
        promote.promote_targets([t], env="prod", records=builds.records, allow_no_gpu=True, **kw)
    assert builds.at(f"{t.tag}-prod") is None
    # a rollback moves the environment's tags back, and no version tag
    res = rollback.rollback(t, env="dev", to=None, steps=1, **{k: kw[k] for k in ("verifier", "signer")})
    assert res["digest"] == d1 and res["replaced"] == [] and set(res["moved"]) == set(moving), res
    assert all(builds.at(tg) == d1 for tg in moving)
    assert builds.at(f"{v1}-dev") == d1 and builds.at(f"{v2}-dev") == d2
    h = history.load(Registry(kw["auth"]), t.ref.bare(), kw["verifier"], target=t.id, env="dev")
    assert [(r.kind, r.version) for r in h.done()] == [("promote", v1), ("promote", v2), ("rollback", v1)]
    [row] = status.collect([t], envs=("dev",), verifier=kw["verifier"], records=builds.records)
    assert row["digest"] == d1 and row["version"] == v1 and row["tags"][f"{v1}-dev"] == d1
    assert row["local"]["differs"] and row["local"]["build"]["version"] == b3.version
