"""`gpuforge attach BUNDLE [SEL] [--pool NAME]`: the evidence a GPU runner with no registry signed into a bundle
(`validate --gpu --bundle`), checked and attached to the pushed digest on a machine that reaches the registry.

Every check comes before anything is attached, and each refusal is one line (BundleRefused, exit 11; a file that is no
bundle: StateError, exit 8). In order:
  1. the file is a bundle (gpuforge.evidence.bundle.read: JSON of the right shape, each payload an in-toto statement);
  2. every envelope's signature verifies with the public key (--key): one that does not, or carries none, refuses it;
  3. the signed table of contents lists exactly the other envelopes, in order, and agrees with the validation
     statement it heads (image id, layers, config, validator set, GPU host, content key, pools);
  4. the statements are about the target's pushed digest (its build record's), and that target is the one selected;
  5. the validator set is this gpuforge's (the rule reuse by content holds evidence to);
  6. no statement is older than prod's evidence time to live (GPUFORGE_EVIDENCE_TTL_DAYS, --max-age-days);
  7. the pool asked (--pool) is one the run's GPU host is a node of;
  8. the registry's manifest at the digest is the bundle's image: its image id, and its config's diff_ids;
  9. the digest does not already carry a newer GPU statement from the same GPU host: attached after it, older
     evidence would become the newest in registry order and hide it (a red canary, say).
Statements already on the digest (a second attach of one bundle) are said and not attached again. Then the envelopes
go onto the digest with `cosign attach attestation`, in the order they were signed, which is where `validate --gpu
--attest` would have put them: promotion, status and history read them as they read any signed statement.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

from gpuforge.errors import BundleRefused, ConfigError, RegistryError, StateError
from gpuforge.evidence import age, bundle, reuse, statements
from gpuforge.plan.target import ImageRef, Target
from gpuforge.registry import attest
from gpuforge.registry.client import Registry, RegistryAuth
from gpuforge.state.records import Records
from gpuforge.validate import evidence
from gpuforge.validate.report_model import Report


def _refuse(path: Path, why: str) -> NoReturn:
    msg = f"{path}: attach refused: {why}; nothing was attached"
    raise BundleRefused(msg)


def attach_bundle(path: Path, candidates: list[Target], *, selected: bool, records: Records,
                  verifier: attest.Verifier | None, auth: RegistryAuth, pool: str | None,
                  max_age_days: float) -> list[str]:
    """Check the bundle at `path` and attach its statements to its target's pushed digest. `candidates`: the selected
    targets (`selected`), else every target of the matrix; the bundle names its own. Returns the lines printed."""
    verifier = _key_verifier(verifier)
    b = bundle.read(path)
    verify_signatures(b, verifier)
    c = b.contents()
    rep = agreeing(b, c)
    t = _target(b, c, candidates, selected=selected)
    ref = _subject(b, c, t, records)
    judge(b, c, rep, t, pool=pool, max_age_days=max_age_days)
    _registry_holds(b, c, ref, Registry(auth))
    todo, there = _not_yet_there(b, rep, ref, verifier)
    if todo:
        attest.attach(ref, [s.envelope.line() for s in todo], auth=auth)
    lines = [f"gpuforge: attached {t.id}'s {_what(s)} onto {ref}" for s in todo]
    lines += [f"gpuforge: {t.id}'s {_what(s)} is already on {ref}; not attached again" for s in there]
    for line in lines:
        print(line, flush=True)
    return lines


def _key_verifier(verifier: attest.Verifier | None) -> attest.Verifier:
    if verifier is None or not verifier.key:
        msg = ("attach verifies a bundle with the public key of the pair that signed it: give --key cosign.pub (or "
               "GPUFORGE_COSIGN_PUBLIC_KEY); bundles are signed with a key pair, never keyless")
        raise ConfigError(msg)
    if verifier.tlog:
        msg = ("GPUFORGE_COSIGN_TLOG=1: a bundle is signed offline, so its statements are not in the Rekor log, and "
               "verification that checks the log would refuse them after attach; unset it for bundle evidence")
        raise ConfigError(msg)
    return verifier


def verify_signatures(b: bundle.Bundle, verifier: attest.Verifier) -> None:
    """Every envelope (the table of contents first) verifies with the key; else refused naming the first that does not."""
    for i, s in enumerate((b.head, *b.body), start=1):
        if not s.envelope.signatures:
            _refuse(b.path, f"envelope {i} ({s.type_uri}) carries no signature")
        why = attest.envelope_verifies(s.envelope.line(), s.type_uri, verifier)
        if why:
            _refuse(b.path, f"envelope {i} ({s.type_uri}) does not verify with {verifier.key} ({why}): signed by "
                            "another key, or edited after it was signed")


def agreeing(b: bundle.Bundle, c: bundle.Contents) -> Report:
    """The bundle's GPU validation statement, when the signed table lists exactly the envelopes there are and agrees
    with what that statement proves; else refused."""
    listed = [(x.type, x.sha256) for x in c.statements]
    if listed != [(s.type_uri, s.payload_sha256) for s in b.body]:
        _refuse(b.path, f"its envelopes are not the {len(listed)} its signed table of contents lists (added, dropped "
                        "or reordered after signing)")
    if b.body[0].type_uri != attest.VALIDATION_TYPE:
        _refuse(b.path, f"its first statement is a {b.body[0].type_uri}, not a gpuforge validation")
    rep = Report.of(b.body[0].predicate, f"{b.path}: its validation statement")
    ev = rep.evidence
    facts = {"image id": (ev.image_id if ev else None, c.image_id), "layers": (ev.diff_ids if ev else None, c.diff_ids),
             "config": (ev.config if ev else None, c.config),
             "validator set": (ev.validator_set if ev else None, c.validator_set),
             "GPU host": (rep.host_of(), c.gpu_host), "content key": (reuse.key_of(rep), c.content_key),
             "pools": (_pools(b), c.pools)}
    differ = [name for name, (theirs, listed_) in facts.items() if theirs != listed_]
    if not rep.gpu_run() or differ:
        _refuse(b.path, "its validation statement is not a GPU run" if not rep.gpu_run() else
                f"its validation statement and its table of contents name other {', '.join(differ)}")
    return rep


def _pools(b: bundle.Bundle) -> list[str]:
    scopes = [s.predicate.get("configuration", [{}])[0].get("name", "") for s in b.body
              if s.type_uri == statements.TEST_RESULT_TYPE]
    return [s.removeprefix(statements.POOL_PREFIX) for s in scopes if s.startswith(statements.POOL_PREFIX)]


def _target(b: bundle.Bundle, c: bundle.Contents, candidates: list[Target], *, selected: bool) -> Target:
    found = [t for t in candidates if t.id == c.target]
    if found:
        return found[0]
    if selected:
        _refuse(b.path, f"it is evidence for {c.target}, not the selected {', '.join(t.id for t in candidates[:3])}")
    msg = f"{b.path}: its target {c.target} is not a target of this matrix.yaml; attach it from the checkout that built it"
    raise ConfigError(msg)


def _subject(b: bundle.Bundle, c: bundle.Contents, t: Target, records: Records) -> str:
    """host/repo@digest of `t`'s pushed build, when every statement of the bundle is about that digest."""
    rec = records.require_build(t.id)
    if not rec.digest:
        msg = (f"{t.id}: its build record names no pushed digest to attach evidence to; attach from the state dir of "
               f"the push (GPUFORGE_STATE_DIR), or run `gpuforge push {t.id}`")
        raise StateError(msg)
    digests = {c.subject.rpartition("@")[2], *(s.statement.digest() for s in (b.head, *b.body))}
    if digests != {rec.digest}:
        _refuse(b.path, f"its statements are about {', '.join(sorted(d[:19] for d in digests - {rec.digest}))}, not "
                        f"{t.id}'s pushed {rec.digest[:19]} (its build record)")
    return str(t.ref.pinned(rec.digest))


def judge(b: bundle.Bundle, c: bundle.Contents, rep: Report, t: Target, *, pool: str | None,
          max_age_days: float) -> None:
    """The validator set, the statements' age and the pool asked, as promotion and reuse by content would judge them."""
    if c.validator_set != evidence.validator_set_hash():
        _refuse(b.path, f"made by another validator set ({c.validator_set[:19]}; this gpuforge has "
                        f"{evidence.validator_set_hash()[:19]}): validate again with this checkout's validators")
    times = [c.signed_at, rep.validated_at(),
             *(_result_signed_at(s.predicate) for s in b.body if s.type_uri == statements.TEST_RESULT_TYPE)]
    ages = [age.age_days(at) for at in times]
    if None in ages:
        _refuse(b.path, "a statement names no signing time, so its age is unknown")
    known = [a for a in ages if a is not None]  # all of them, after the check above
    oldest = max(known)
    if oldest > max_age_days:
        _refuse(b.path, f"its statements were signed {oldest:.1f} days ago ({times[ages.index(oldest)]}), past prod's "
                        f"time to live of {max_age_days:g} days (GPUFORGE_EVIDENCE_TTL_DAYS); validate again on the "
                        "GPU runner")
    if pool is not None:
        if pool not in [p.name for p in t.pools]:
            msg = f"--pool {pool}: not a fleet pool of {t.id} (its pools: {', '.join(p.name for p in t.pools) or 'none'})"
            raise ConfigError(msg)
        if pool not in c.pools:
            host = c.gpu_host
            _refuse(b.path, f"it is evidence for pool(s) {', '.join(c.pools) or 'none'} ({host.count} x "
                            f"{', '.join(host.gpu_names) or 'unknown GPU'}, driver {host.driver}), not {pool}")


def _registry_holds(b: bundle.Bundle, c: bundle.Contents, ref: str, reg: Registry) -> None:
    """The registry's manifest at the digest is the bundle's image: its image id, and its layers (diff_ids)."""
    pinned = ImageRef.parse(ref)
    m = reg.manifest(pinned)
    if m is None:
        msg = f"the registry has no manifest {pinned.digest} ({ref}); push the build before attaching its evidence"
        raise RegistryError(msg)
    layers = (reg.config(pinned).get("rootfs") or {}).get("diff_ids") or []
    if not m.holds(c.image_id) or layers != c.diff_ids:
        _refuse(b.path, f"{ref} holds image {str(m.config_digest or m.digest)[:19]} of {len(layers)} layer(s), not the "
                        f"bundle's image {c.image_id[:19]} of {len(c.diff_ids)} layer(s) "
                        f"({'other layers' if layers != c.diff_ids else 'another image id'}): the evidence is about "
                        "other bytes")


def _not_yet_there(b: bundle.Bundle, rep: Report, ref: str,
                   verifier: attest.Verifier) -> tuple[list[bundle.Sealed], list[bundle.Sealed]]:
    """(the bundle's statements to attach, those already on the digest); refused when the digest carries a GPU
    statement from the same GPU host signed after this bundle's run."""
    on = {t: [s.predicate for s in attest.verified_statements(ref, t, verifier)]
          for t in dict.fromkeys(s.type_uri for s in b.body)}
    host = rep.host_of()
    ours = age.signed_time(rep.validated_at())
    for p in on.get(attest.VALIDATION_TYPE, []):
        other = Report.of(p, f"{ref}: signed validation statement")
        at = age.signed_time(other.validated_at())
        if (p != b.body[0].predicate and other.gpu_run() and (other.host_of().gpu_models, other.host_of().driver)
                == (host.gpu_models, host.driver) and at is not None and ours is not None and at > ours):
            _refuse(b.path, f"{ref} already carries a GPU statement from this GPU host signed later "
                            f"({other.validated_at()}); attached after it, this older evidence would become the newest")
    there = [s for s in b.body if s.predicate in on.get(s.type_uri, [])]
    return [s for s in b.body if s not in there], there


def _result_signed_at(pred: dict[str, Any]) -> str | None:
    """A Test Result's signing time (its run entry, third in the fixed configuration order); None when it has none."""
    try:
        signed_at: str | None = pred["configuration"][2]["annotations"]["signedAt"]
        return signed_at
    except (KeyError, IndexError, TypeError):
        return None


def _what(s: bundle.Sealed) -> str:
    """One statement, as a line says it."""
    p = s.predicate
    if s.type_uri == attest.VALIDATION_TYPE:
        rep = Report.of(p)
        host = rep.host_of()
        green = "green" if not evidence.problems(rep, require_gpu=True) else "NOT green"
        return (f"GPU validation ({green}) on {host.count} x {', '.join(host.gpu_names) or 'unknown GPU'}, driver "
                f"{host.driver}, signed offline at {rep.validated_at()}")
    if s.type_uri == statements.TEST_RESULT_TYPE:
        scope = str((p.get("configuration") or [{}])[0].get("name"))
        return f"Test Result {p.get('result')} ({scope.replace(statements.POOL_PREFIX, 'pool ')}), signed {_result_signed_at(p)}"
    return f"{s.type_uri} statement"
