"""The engine matrix (#21): the build -> record -> validate -> push -> attest -> promote path on Debian
trixie's Docker 26.1.5 with the containerd image store, with BuildKit's provenance attestation at its
default (the image is then an index holding an attestation manifest) and off. The rest of the suite runs
the same path on bookworm's 20.10 (graphdriver overlay2, BuildKit 0.8: no attestations).

The 26.1.5 engine is a second dockerd (tools/second_engine.py) with its own empty data root, started from
trixie's packages unpacked into a private folder; the machine's engine stays 20.10. Every step runs the
real CLI against it (DOCKER_HOST) with a state directory of its own, so no record of the main suite moves.

What must hold on that engine: the recorded image id is the engine's own id of the image, the digest
pushed is that id (the containerd store pushes the bytes it holds), cosign signs exactly that digest,
and promotion copies exactly that digest.

Cost on 2 cores: one cold build of the default image (no cache on the new engine), two validations,
two pushes (the second reuses every layer), cosign and skopeo calls of seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from registries import LocalRegistry
from second_engine import SecondEngine, StartError, trixie_engine

from conftest import gpuforge, need
from gpuforge.plan.matrix import load_matrix
from gpuforge.plan.target import ImageRef
from gpuforge.publish import attest
from gpuforge.publish.registry import Registry

# 24-36 min on this 2-core machine (a cold build on a second engine, twice): opt-in, `nox -s tests -- -m heavy`
pytestmark = [pytest.mark.docker, pytest.mark.heavy]
KEY_PASSWORD = "engine-matrix-key-pass"


@pytest.fixture(scope="module")
def engine26(docker_engine):
    try:
        eng = SecondEngine(outbound=True, prefix="gf21-", binaries=trixie_engine(), containerd_store=True)
    except (StartError, OSError, subprocess.CalledProcessError) as e:
        need(f"needs trixie's dockerd 26.1.5 as a second engine: {e}")
    print(f"\nengine matrix: second engine {eng.describe()}")
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = LocalRegistry(tmp_path_factory.mktemp("reg-engines"), None)
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


@pytest.mark.parametrize("provenance", ["default", "false"])
def test_digests_agree_on_docker26_with_the_containerd_store(engine26, registry, keys, test_ca, tmp_path, provenance):
    env = {"DOCKER_HOST": engine26.host, "GPUFORGE_STATE_DIR": str(tmp_path / "state"),
           "GPUFORGE_LOG_DIR": str(tmp_path / "logs"), "COSIGN_PASSWORD": KEY_PASSWORD}
    reports = tmp_path / "reports"
    t = load_matrix().select(None)[0]

    def cli(*args: str):
        r = gpuforge(*args, env=env)
        assert r.returncode == 0, f"gpuforge {' '.join(args)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-3000:]}"
        return r

    def record() -> dict:
        return json.loads((tmp_path / "state" / "builds.json").read_text())[t.id]

    out = cli("build", "--extra-ca", str(test_ca["bundle"]), "--progress", "plain", "--provenance", provenance).stdout
    rec = record()
    print(f"\n{t.id} (provenance {provenance}) built on engine {rec['engine']}, image store {rec['image_store']}: "
          f"{rec['image_id']}{' (an image index)' if rec['image_index'] else ''}")
    assert f"image store {rec['image_store']}" in out
    assert rec["engine"].startswith("26.1.5") and rec["image_store"].startswith("containerd/")
    assert engine26.client.images.get(rec["image_id"]).id == rec["image_id"]  # the engine's own id, not the iidfile's
    assert rec["image_index"] is (provenance == "default")

    cli("push", "--registry", registry)
    rec = record()
    pushed = ImageRef.parse(rec["pushed_ref"])
    host, repo, tag = pushed.registry, pushed.repository, pushed.tag
    digest = rec["digest"]
    assert digest == rec["image_id"], "the containerd store pushes the very manifest/index it names the image by"
    m = Registry(host).manifest(repo, digest)
    assert m is not None and m.digest == digest and m.is_index is (provenance == "default")
    if m.is_index:  # the image manifest plus BuildKit's attestation manifest (platform unknown/unknown)
        plats = [d.get("platform", {}).get("os") for d in json.loads(m.body)["manifests"]]
        assert "linux" in plats and "unknown" in plats, plats

    # the validating run signs its result onto the pushed digest (the only signing path)
    cli("validate", "--reports", str(reports), "--attest", "--registry", registry, "--key", keys["key"])
    [signed] = attest.verified_predicates(f"{host}/{repo}@{digest}", attest.VALIDATION_TYPE,
                                          attest.Verifier(key=keys["pub"]))  # subject == this digest, or none
    assert signed["evidence"]["image_id"] == rec["image_id"]

    cli("promote", "--to", "dev", "--registry", registry, "--reports", str(reports), "--key", keys["pub"])
    dev = Registry(host).manifest(repo, f"{tag}-dev")
    assert dev is not None and dev.digest == digest
    print(f"recorded == pushed == signed == promoted: {digest}")
    if provenance != "default":
        return
    # zstd layers (the containerd store's builder can export them): <tag>-zstd beside the gzip <tag>
    out = cli("push", "--registry", registry, "--compression", "both").stdout
    rec = record()
    assert rec["digest"] == digest, "the gzip push is the same bytes again"
    zdigest = rec["digest_zstd"]
    zm = Registry(host).manifest(repo, f"{tag}-zstd")
    assert zm is not None and zm.digest == zdigest != digest
    zcfg, gcfg = Registry(host).config(repo, zdigest), Registry(host).config(repo, digest)
    assert zcfg["rootfs"]["diff_ids"] == gcfg["rootfs"]["diff_ids"]  # same files, compressed otherwise
    assert f"{tag}-zstd@{zdigest} (zstd" in out
    # not signed: `validate --attest` signs the gzip digest it validated; promotion moves only that one
