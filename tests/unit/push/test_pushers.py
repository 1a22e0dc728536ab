"""The pushers' table: one pusher for each --compression choice, an unknown choice refused in one line before the
engine is asked anything, and push_targets running the pusher it looked up (no engine, no registry)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import BASE_MATRIX
from gpuforge import options
from gpuforge.engine import client as engine
from gpuforge.errors import ConfigError
from gpuforge.plan.matrix import load_matrix
from gpuforge.push import pusher
from gpuforge.push.pusher import Pushed, PushJob
from gpuforge.registry.client import RegistryAuth
from gpuforge.state.models import BuildRecord
from gpuforge.state.records import Records

IMG = "sha256:" + "a" * 64
INFO = engine.EngineInfo(version="26.1.5", store="containerd/overlayfs")


@dataclass
class _Fake:
    """A pusher that records what it was asked and answers with `digest` under `key`."""

    name: str
    key: str = "digest"
    why: str | None = None
    seen: list[str] = field(default_factory=list)

    def refusal(self, recs: Mapping[str, BuildRecord], info: engine.EngineInfo) -> str | None:
        self.seen.append(f"refusal {','.join(recs)}")
        return self.why

    def push(self, job: PushJob) -> tuple[Pushed, ...]:
        self.seen.append(f"push {job.target.id} {job.ref.tag}")
        return (Pushed(self.key, "sha256:" + "d" * 64),)


def test_every_compression_choice_has_its_pusher_under_its_name():
    assert set(pusher.PUSHERS) == set(options.SETTINGS["compression"].choices)
    assert all(p.name == name for name, p in pusher.PUSHERS.items())
    assert pusher.pusher_for("gzip") is pusher.GZIP


def test_an_unknown_compression_is_refused_in_one_line_before_the_engine_is_asked(monkeypatch, tmp_path: Path):
    def no_engine() -> None:
        msg = "the engine was asked before the compression was checked"
        raise AssertionError(msg)

    monkeypatch.setattr(engine, "client", no_engine)
    with pytest.raises(ConfigError) as e:
        pusher.push_targets([], records=Records(tmp_path), auth=RegistryAuth(), log_dir=tmp_path, compression="lz4")
    msg = str(e.value)
    assert "\n" not in msg and "'lz4'" in msg, msg
    assert msg.endswith(f"allowed: {', '.join(options.SETTINGS['compression'].choices)}"), msg


def test_both_is_the_zstd_copy_then_gzip_refused_by_either():
    both = pusher.PUSHERS["both"]
    assert isinstance(both, pusher.InTurn) and both.parts == (pusher.ZSTD, pusher.GZIP)
    first, second = _Fake("zstd", key="digest_zstd"), _Fake("gzip")
    in_turn = pusher.InTurn("both", (first, second))
    assert in_turn.refusal({"t": BuildRecord(image_id=IMG)}, INFO) is None
    second.why = "t: no"
    assert in_turn.refusal({"t": BuildRecord(image_id=IMG)}, INFO) == "t: no"


class _Images:
    def get(self, image_id: str) -> str:
        return image_id


class _Engine:
    images = _Images()


class _Registry:
    def __init__(self, _auth: RegistryAuth) -> None:
        pass

    def manifest(self, _ref: object) -> None:  # the version tag holds nothing yet
        return None


def test_push_targets_runs_the_pusher_of_the_choice_after_every_refusal(monkeypatch, tmp_path: Path, write_matrix):
    t = load_matrix(write_matrix(BASE_MATRIX)).select(None)[0].on("registry.example.com")
    records = Records(tmp_path)
    records.update_build(t.id, image_id=IMG, build="20261206T203015Z", version=f"{t.tag}-20261206T203015Z")
    fake = _Fake("gzip")
    monkeypatch.setitem(pusher.PUSHERS, "gzip", fake)
    monkeypatch.setattr(engine, "client", _Engine)
    monkeypatch.setattr(engine, "engine_info", lambda: INFO)
    monkeypatch.setattr(pusher, "Registry", _Registry)
    [res] = pusher.push_targets([t], records=records, auth=RegistryAuth(), log_dir=tmp_path)
    assert fake.seen == [f"refusal {t.id}", f"push {t.id} {t.tag}-20261206T203015Z"]
    assert res == {"target": t.id, "ref": f"registry.example.com/gpuforge/pytorch:{t.tag}-20261206T203015Z",
                   "digest": "sha256:" + "d" * 64}
    fake.why, fake.seen = f"{t.id}: cannot here", []
    with pytest.raises(ConfigError, match="cannot here"):
        pusher.push_targets([t], records=records, auth=RegistryAuth(), log_dir=tmp_path)
    assert fake.seen == [f"refusal {t.id}"]  # refused before anything was pushed


GZ, ZS, IDX = ("sha256:" + c * 64 for c in "123")


@pytest.mark.parametrize(("compression", "pushed", "keys"), [
    ("gzip", ["gzip"], ["digest"]),
    ("zstd", ["zstd"], ["digest_zstd"]),
    ("both", ["zstd", "gzip"], ["digest_zstd", "digest"]),
    ("soci", ["gzip", "soci"], ["digest", "soci_index"]),
])
def test_each_choice_pushes_and_records_what_it_pushed(monkeypatch, tmp_path: Path, write_matrix, compression, pushed,
                                                       keys):
    """The real pushers of the table, their registry-facing steps stood in for: the order of the pushes, the fields
    recorded and the result."""
    t = load_matrix(write_matrix(BASE_MATRIX)).select(None)[0].on("registry.example.com")
    records = Records(tmp_path)
    records.update_build(t.id, image_id=IMG, build="20261206T203015Z", version=f"{t.tag}-20261206T203015Z")
    seen: list[str] = []
    monkeypatch.setattr(engine, "client", _Engine)
    monkeypatch.setattr(engine, "engine_info", lambda: INFO)
    monkeypatch.setattr(pusher, "Registry", _Registry)
    monkeypatch.setattr(pusher, "_push_gzip", lambda *a: seen.append("gzip") or GZ)
    monkeypatch.setattr(pusher.compress, "refusal", lambda rec, info: None)
    monkeypatch.setattr(pusher.compress, "push_zstd", lambda *a: seen.append("zstd") or ZS)
    monkeypatch.setattr(pusher.soci, "refusal", lambda: None)
    monkeypatch.setattr(pusher.soci, "index_pushed",
                        lambda ref, digest, *a: seen.append("soci") or pusher.soci.SociIndex(IDX, digest, 3))
    [res] = pusher.push_targets([t], records=records, auth=RegistryAuth(), log_dir=tmp_path, compression=compression)
    assert seen == pushed
    assert list(res) == ["target", "ref", *keys]
    rec = records.require_build(t.id)
    version = f"registry.example.com/gpuforge/pytorch:{t.tag}-20261206T203015Z"
    assert (rec.digest, rec.pushed_ref) == ((GZ, version) if "digest" in keys else (None, None))
    assert (rec.digest_zstd, rec.pushed_ref_zstd) == ((ZS, f"{version}-zstd") if "digest_zstd" in keys else (None, None))
    assert rec.soci_index == (IDX if "soci_index" in keys else None)
