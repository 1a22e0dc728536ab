"""Evidence reused by content: the mutation test. A candidate's signed statement is reused only when it proves
the very content key asked for (layers, runtime config, validator set, and for a GPU run the GPU models and driver)
and is green, complete, and signed in its own run. Each mutation re-runs; no false reuse.

The registry read (attest.verified_statements) is replaced by the statements it would return: what is under test
here is the decision. The real path (cosign, a registry, two engines' images) runs in
tests/integration/publish/test_engine_matrix.py."""

from __future__ import annotations

import copy

import pytest
from fleet_reports import base_from_h200_run, gpu_report

from gpuforge.errors import RegistryError
from gpuforge.evidence import reuse, signed_run
from gpuforge.registry import attest
from gpuforge.validate import evidence
from gpuforge.validate.report_model import Report

SRC = "127.0.0.1:5000/gpuforge/a@sha256:" + "1" * 64
COPY = "127.0.0.1:5001/gpuforge/a@sha256:" + "1" * 64
LAYERS = ["sha256:" + "a" * 64, "sha256:" + "b" * 64]
CONFIG = "sha256:" + "c" * 64
INPUTS = "sha256:" + "d" * 64
SIGNED_AT = "2026-11-20T12:00:00+00:00"
VERIFIER = attest.Verifier(key="cosign.pub")


def image_report(*, layers=LAYERS, config=CONFIG, inputs=INPUTS) -> dict:
    rep = base_from_h200_run()
    rep["gpu"] = False
    rep["checks"] = [c for c in rep["checks"] if not c.get("skip")]  # a run without GPUs meets no one-GPU skip
    rep["evidence"] = evidence.stamp(rep, required=tuple(c["id"] for c in rep["checks"]), gpu=False,
                                     content={"diff_ids": list(layers), "config": config, "inputs": inputs})
    rep["run"] = {"signed_in_run": True, "signed_at": SIGNED_AT, "subject": SRC}
    assert not evidence.problems(rep)
    return rep


def key(layers=LAYERS, config=CONFIG, inputs=INPUTS) -> str:
    return reuse.content_key(diff_ids=layers, config=config, inputs=inputs, validator_set=evidence.validator_set_hash())


@pytest.fixture
def registry(monkeypatch):
    """ref -> the predicates verify-attestation would return, oldest first (an exception: the read fails)."""
    held: dict[str, list | Exception] = {}

    def verified(ref, type_uri, verifier):
        assert type_uri == attest.VALIDATION_TYPE and verifier is VERIFIER
        got = held.get(ref, [])
        if isinstance(got, Exception):
            raise got
        return [attest.Signed(predicate=copy.deepcopy(p), layer=f"sha256:{i:064x}", index=i) for i, p in enumerate(got)]
    monkeypatch.setattr(attest, "verified_statements", verified)
    return held


def test_the_same_content_is_reused(registry):
    registry[SRC] = [image_report()]
    found, why = reuse.find(key(), [SRC], VERIFIER, skip=COPY)
    assert found is not None and found.source == SRC and why == []


def test_a_digest_never_reuses_itself_and_a_bad_hint_is_passed_over(registry):
    registry[SRC] = [image_report()]
    tagged = SRC.replace("@", ":v1@")  # the same digest named with a tag
    assert reuse.find(key(), [tagged, "not a ref", "127.0.0.1:5000/x:v1"], VERIFIER, skip=SRC) == (None, [])


@pytest.mark.parametrize(("mutation", "change"), [
    ("a layer", lambda r: r["evidence"]["diff_ids"].__setitem__(1, "sha256:" + "e" * 64)),
    ("a layer more", lambda r: r["evidence"]["diff_ids"].append("sha256:" + "e" * 64)),
    ("the runtime config, platform or history", lambda r: r["evidence"].__setitem__("config", "sha256:" + "f" * 64)),
    ("the target.json or CA it was checked against", lambda r: r["evidence"].__setitem__("inputs", "sha256:" + "f" * 64)),
    ("no signing time", lambda r: r["run"].pop("signed_at")),
    ("the validator set", lambda r: r["evidence"].__setitem__("validator_set", "sha256:" + "0" * 64)),
    ("no content named (an older gpuforge)", lambda r: r["evidence"].pop("diff_ids")),
    ("a failed check", lambda r: r["checks"][0].__setitem__("outcome", "failed")),
    ("a partial run", lambda r: r["evidence"].__setitem__("partial", True)),
    ("signed after the fact", lambda r: r["run"].__setitem__("signed_in_run", False)),
    ("itself a reuse", lambda r: r["run"].__setitem__("reused_from", {"source": SRC, "key": key()})),
])
def test_each_mutation_re_runs(registry, mutation, change):
    rep = image_report()
    change(rep)
    registry[SRC] = [rep]
    found, why = reuse.find(key(), [SRC], VERIFIER)
    assert found is None, f"{mutation}: reused"
    assert len(why) == 1 and why[0].startswith(SRC), why


def test_the_newest_statement_decides_a_red_after_a_green_is_not_reused(registry):
    red = image_report()
    red["checks"][0]["outcome"] = "failed"
    registry[SRC] = [image_report(), red]
    assert reuse.find(key(), [SRC], VERIFIER)[0] is None


def test_a_gpu_runs_key_names_its_pool_and_driver():
    h200 = Report.of(_gpu(model="H200", driver="580.159.04"))
    assert reuse.key_of(h200) == reuse.key_of(Report.of(_gpu(model="H200", driver="580.159.04")))
    assert reuse.key_of(h200) != reuse.key_of(Report.of(_gpu(model="H200", driver="575.57.08")))  # the driver
    assert reuse.key_of(h200) != reuse.key_of(Report.of(_gpu(model="A100", driver="580.159.04")))  # the pool's GPU
    assert reuse.key_of(h200) != reuse.key_of(Report.of(image_report()))  # a GPU run is not an image run


def _gpu(*, model: str, driver: str) -> dict:
    rep = gpu_report(base_from_h200_run(), model=model, driver=driver)
    rep["evidence"].update(diff_ids=list(LAYERS), config=CONFIG, inputs=INPUTS)
    return rep


def test_no_key_to_verify_with_means_run(registry):
    registry[SRC] = [image_report()]
    found, why = reuse.find(key(), [SRC], None)
    assert found is None and "no public key" in why[0]


def test_an_unreadable_candidate_is_passed_over_for_the_next(registry):
    other = "127.0.0.1:5002/gpuforge/a@sha256:" + "1" * 64
    registry[SRC] = RegistryError("cannot reach registry 127.0.0.1:5000 to verify attestations")
    registry[other] = [image_report()]
    found, why = reuse.find(key(), [SRC, other], VERIFIER)
    assert found is not None and found.source == other and "cannot reach" in why[0]


def test_the_reused_statement_names_its_source_and_keeps_its_age(registry, monkeypatch):
    registry[SRC] = [image_report()]
    found, _ = reuse.find(key(), [SRC], VERIFIER)
    image_id = "sha256:" + "9" * 64
    stmt = signed_run.statement(reuse.statement(found, image_id=image_id), COPY)
    assert stmt.run.reused_from.source == SRC and stmt.run.reused_from.key == key()
    assert stmt.run.signed_in_run and stmt.run.subject == COPY
    assert stmt.evidence.image_id == image_id and not evidence.problems(stmt)
    assert stmt.validated_at() == SIGNED_AT  # the time to live counts from the run that made the evidence
    assert reuse.key_of(stmt) == key()


def test_the_index_is_a_hint_newest_first_and_unreadable_means_none(tmp_path):
    reuse.remember(tmp_path, SRC, key())
    reuse.remember(tmp_path, COPY, key())
    reuse.remember(tmp_path, "127.0.0.1:5002/x@sha256:" + "2" * 64, key(config="sha256:" + "f" * 64))
    reuse.remember(tmp_path, "no-registry/x:tag", key())  # a hand-edited row: passed over, never a traceback
    assert reuse.hinted(tmp_path, key()) == [COPY, SRC]
    (tmp_path / reuse.INDEX).write_text("{not json")
    assert reuse.hinted(tmp_path, key()) == []


def test_the_copy_carries_the_sources_newest_inventory_under_its_own_image_id(monkeypatch):
    held = {SRC: [{"target": "t", "image_id": "sha256:" + "1" * 64, "packages": {"torch": "2.7.1"}},
                  {"target": "t", "image_id": "sha256:" + "1" * 64, "packages": {"torch": "2.7.1+cu126"}}]}
    monkeypatch.setattr(attest, "verified_predicates", lambda ref, type_uri, verifier: held.get(ref, []))
    got = reuse.inventory(SRC, VERIFIER, target_id="u", image_id="sha256:" + "9" * 64)
    assert got == {"target": "u", "image_id": "sha256:" + "9" * 64, "packages": {"torch": "2.7.1+cu126"}}
    assert reuse.inventory(COPY, VERIFIER, target_id="u", image_id="sha256:" + "9" * 64) is None  # none signed there


def test_the_copys_own_red_run_is_not_papered_over(registry):
    red = image_report()
    red["checks"][0]["outcome"] = "failed"
    registry[COPY] = [red]
    assert reuse.own_newest_is_red(COPY, VERIFIER) == "its own newest signed statement is not green"
    registry[COPY] = []
    assert reuse.own_newest_is_red(COPY, VERIFIER) == ""
    registry[COPY] = RegistryError("cannot reach registry")
    assert "could not be read" in reuse.own_newest_is_red(COPY, VERIFIER)


def test_promotion_judges_the_reused_statement_and_the_test_result_keeps_the_sources_time(registry, tmp_path,
                                                                                          monkeypatch):
    from fleet_reports import BASE

    from gpuforge.evidence import statements
    from gpuforge.plan.matrix import load_matrix
    from gpuforge.publish import promote

    registry[SRC] = [image_report()]
    found, _ = reuse.find(key(), [SRC], VERIFIER)
    image_id = "sha256:" + "9" * 64
    stmt = signed_run.statement(reuse.statement(found, image_id=image_id), COPY)
    registry[COPY] = [stmt.dump()]
    ev = promote.judge(COPY, image_id, VERIFIER, require_gpu=False, who="t")
    assert ev.green and ev.validated_at == SIGNED_AT
    (tmp_path / "matrix.yaml").write_text(BASE)
    target = load_matrix(tmp_path / "matrix.yaml").select(None)[0]
    signed: list[tuple[str, dict]] = []
    monkeypatch.setattr(attest, "attest_data", lambda ref, data, type_uri, signer: signed.append((type_uri, data)))
    signed_run.sign_report(COPY, stmt, signer=None, target=target)
    results = [d for t, d in signed if t == statements.TEST_RESULT_TYPE]
    runs = [c for r in results for c in r["configuration"] if c["name"] == statements.RUN]
    assert runs and all(c["annotations"]["signedAt"] == SIGNED_AT for c in runs), runs  # the source's time, not now


# --- GPU runs of the same bytes (a zstd copy or a mirror promotes with no new GPU run) -----------------------------
FACTS = {"diff_ids": list(LAYERS), "config": CONFIG, "inputs": INPUTS}


def _signed_gpu(*, model: str = "H200", driver: str = "580.159.04", **change) -> dict:
    rep = _gpu(model=model, driver=driver)
    rep["run"] = {"signed_in_run": True, "signed_at": SIGNED_AT, "subject": SRC}
    rep["evidence"].update(change)
    return rep


def test_each_gpu_hosts_newest_green_run_of_these_bytes_is_reused(registry):
    registry[SRC] = [image_report(), _signed_gpu(), _signed_gpu(model="A100", driver="570.133.20")]
    found, why = reuse.gpu_runs(SRC, COPY, FACTS, VERIFIER)
    assert why == [] and [(f.report.host_of().gpu_models, f.report.host_of().driver) for f in found] == [
        (["H200"], "580.159.04"), (["A100"], "570.133.20")]
    h200 = found[0]
    assert h200.key == reuse.key_of(Report.of(_signed_gpu()))  # the key names the GPU host it was proven on
    stmt = signed_run.statement(reuse.statement(h200, image_id="sha256:" + "9" * 64), COPY)
    assert stmt.gpu_run() and stmt.run.reused_from.source == SRC and stmt.host_of().driver == "580.159.04"
    assert stmt.validated_at() == SIGNED_AT and not evidence.problems(stmt)


@pytest.mark.parametrize(("mutation", "facts", "change"), [
    ("a layer of the copy", {**FACTS, "diff_ids": [LAYERS[0], "sha256:" + "e" * 64]}, {}),
    ("the copy's runtime config", {**FACTS, "config": "sha256:" + "f" * 64}, {}),
    ("the GPU run's validator set", FACTS, {"validator_set": "sha256:" + "0" * 64}),
    ("the GPU run named no content", FACTS, {"diff_ids": []}),
])
def test_each_gpu_mutation_re_runs(registry, mutation, facts, change):
    registry[SRC] = [image_report(), _signed_gpu(**change)]
    found, why = reuse.gpu_runs(SRC, COPY, facts, VERIFIER)
    assert found == [], f"{mutation}: reused"
    assert len(why) == 1 and why[0].startswith(f"{SRC} (GPU H200, driver 580.159.04): "), why


def test_a_gpu_hosts_newest_red_run_is_not_papered_over_and_another_hosts_green_still_counts(registry):
    red = _signed_gpu()
    red["checks"][0]["outcome"] = "failed"
    registry[SRC] = [_signed_gpu(), _signed_gpu(model="A100", driver="570.133.20"), red]
    found, why = reuse.gpu_runs(SRC, COPY, FACTS, VERIFIER)
    assert [f.report.host_of().gpu_models for f in found] == [["A100"]]
    assert len(why) == 1 and "H200" in why[0] and "not evidence" in why[0]


def test_a_gpu_reuse_is_never_reused_again_and_an_unreadable_source_means_run(registry):
    again = _signed_gpu()
    again["run"]["reused_from"] = {"source": COPY, "key": key()}
    registry[SRC] = [again]
    found, why = reuse.gpu_runs(SRC, COPY, FACTS, VERIFIER)
    assert found == [] and "itself a reuse" in why[0]
    registry[SRC] = RegistryError("cannot reach registry 127.0.0.1:5000")
    found, why = reuse.gpu_runs(SRC, COPY, FACTS, VERIFIER)
    assert found == [] and "could not be read" in why[0]


def test_a_gpu_run_signed_after_the_image_run_does_not_hide_it(registry):
    registry[SRC] = [image_report(), _signed_gpu()]
    found, why = reuse.find(key(), [SRC], VERIFIER, skip=COPY)
    assert found is not None and not found.report.gpu_run() and why == []
    red = image_report()
    red["checks"][0]["outcome"] = "failed"
    registry[SRC] = [image_report(), red, _signed_gpu()]  # the newest image run is red: not reused
    assert reuse.find(key(), [SRC], VERIFIER)[0] is None


def test_the_copys_own_red_gpu_run_on_a_host_is_not_papered_over(registry):
    red = _signed_gpu()
    red["checks"][0]["outcome"] = "failed"
    registry[SRC] = [image_report(), _signed_gpu(), _signed_gpu(model="A100", driver="570.133.20")]
    registry[COPY] = [red, image_report()]  # a red H200 run of the copy, then a green image run
    found, why = reuse.gpu_runs(SRC, COPY, FACTS, VERIFIER)
    assert [f.report.host_of().gpu_models for f in found] == [["A100"]]
    assert len(why) == 1 and "H200" in why[0] and "the copy's own newest GPU run on this host is not green" in why[0]
