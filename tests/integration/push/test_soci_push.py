"""`push --compression soci` with the real CLI, engine, registry (the run's htpasswd one), containerd and soci CLI:
the gzip image is pushed, then a SOCI index of that very digest, found where the snapshotter looks (the OCI referrers
tag), its zTOC naming the image's big layer; nothing is left behind (no containerd, no socket folder, no index in the
soci CLI's store). The image is a small one made here (one 12 MB layer: over soci's 10 MiB zTOC floor) under a
matrix copy's own repository, recorded as the default target's build in a state folder of the test's own: the push
path does not care how big the image is, and the default image's SOCI index takes minutes
(`nox -s bench -- --ready` makes it with the same code and times lazy pulls of it through the SOCI snapshotter)."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from registries import PASSWORD, USER, run_registry
from second_engine import matrix_copy

from conftest import ROOT, gpuforge, need
from gpuforge.plan.matrix import load_matrix
from gpuforge.plan.target import ImageRef
from gpuforge.plan.version import BuildId
from gpuforge.push import soci
from gpuforge.registry.client import Registry, RegistryAuth
from gpuforge.state.records import Records

pytestmark = pytest.mark.docker


def _image(docker_engine, size: int) -> str:
    """A one-layer image of `size` random bytes (random: gzip cannot shrink it under the zTOC floor)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("data/blob")
        info.size = size
        tar.addfile(info, io.BytesIO(os.urandom(size)))
    r = subprocess.run(["docker", "import", "-"], input=buf.getvalue(), capture_output=True, check=True)
    return r.stdout.decode().strip()


@pytest.fixture
def setup(docker_engine, tmp_path, request):
    if why := soci.refusal():
        need(f"needs the SOCI tools: {why}")
    host = run_registry()
    repo = f"gpuforge-test/soci-{os.getpid()}-{request.node.name.removeprefix('test_')[:24].strip('_')}"  # a test's own
    matrix = matrix_copy(ROOT, tmp_path / "matrix.yaml", host, repo)
    tid = load_matrix().select(None)[0].id
    env = {"GPUFORGE_STATE_DIR": str(tmp_path / "state"), "GPUFORGE_LOG_DIR": str(tmp_path / "logs"),
           "GPUFORGE_REGISTRY_USER": USER, "GPUFORGE_REGISTRY_PASSWORD": PASSWORD}
    made: list[str] = []

    t = load_matrix(matrix).select(None)[0]
    build = BuildId.at_time(dt.datetime.now(dt.UTC))

    def record(size: int) -> str:
        iid = _image(docker_engine, size)
        made.append(iid)
        Records(tmp_path / "state").update_build(tid, image_id=iid, build=str(build), version=t.version(build))
        return iid

    yield {"matrix": matrix, "env": env, "tid": tid, "record": record, "state": tmp_path / "state",
           "ref": ImageRef(host, repo, t.version(build))}  # what push pushes: the build's version tag
    for iid in made:
        subprocess.run(["docker", "rmi", "-f", iid], capture_output=True, check=False)


def test_push_soci_pushes_gzip_and_an_index_of_that_digest(setup):
    setup["record"](12_000_000)
    r = gpuforge("--matrix", str(setup["matrix"]), "push", "--compression", "soci", env=setup["env"], timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rec = Records(setup["state"]).require_build(setup["tid"])
    assert rec.digest and rec.soci_index, rec
    assert f"pushed SOCI index {rec.soci_index}" in r.stdout and "(1 layers lazily served)" in r.stdout, r.stdout
    reg = Registry(RegistryAuth(USER, PASSWORD))
    ref = setup["ref"]
    # where the snapshotter looks: the referrers tag of the pushed digest, listing the recorded index
    listing = json.loads(reg.manifest(ref.with_tag(soci.referrers_tag(rec.digest))).body)
    assert [(d["digest"], d["artifactType"]) for d in listing["manifests"]] == [(rec.soci_index, soci.INDEX_TYPE)]
    index = json.loads(reg.manifest(ref.pinned(rec.soci_index)).body)
    image = json.loads(reg.manifest(ref.pinned(rec.digest)).body)
    assert index["subject"]["digest"] == rec.digest
    assert [x["annotations"][soci.LAYER_DIGEST] for x in index["layers"]] == [x["digest"] for x in image["layers"]]
    # the gzip image is the one `gzip` pushes: the version tag names the recorded digest
    assert reg.manifest(ref).digest == rec.digest
    # the registry has no referrers API (distribution 2.8): gpuforge's client says so, and the tag above is the way
    assert reg.referrers(ref, rec.digest, soci.INDEX_TYPE) is None
    # nothing left: no private containerd, no work folder, no blob of this index in the soci CLI's store
    logs = Path(setup["env"]["GPUFORGE_LOG_DIR"])
    assert not list(logs.glob("soci-*/")), list(logs.glob("soci-*"))
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    left = [x for x in ps.splitlines() if "containerd" in x and str(logs) in x]
    assert not left, left
    made = [rec.soci_index, *(x["digest"] for x in index["layers"])]
    assert not [d for d in made if (soci.STORE_BLOBS / d.split(":", 1)[1]).exists()], "the index's blobs were left"


def test_image_with_no_big_layer_is_refused_in_one_line(setup):
    setup["record"](1_000_000)
    r = gpuforge("--matrix", str(setup["matrix"]), "push", "--compression", "soci", env=setup["env"], timeout=600)
    assert r.returncode == 6, r.stdout[-2000:] + r.stderr[-2000:]
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "no layer of 10 MiB or more" in err[0], err
    assert "Traceback" not in r.stderr
    assert Records(setup["state"]).require_build(setup["tid"]).soci_index is None
