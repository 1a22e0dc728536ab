"""The gpuforge command line: one argparse block and a one-line dispatch per subcommand.

Every FatalError is caught once, in main(), and printed as one line with its kind's exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from gpuforge import __version__, options, paths
from gpuforge.errors import ConfigError, FatalError, exit_codes
from gpuforge.plan.matrix import Matrix, load_matrix

console = Console(stderr=False, highlight=False)


def _matrix(args) -> Matrix:
    """matrix.yaml, loaded once per command; it completes the options (it is one of their sources)."""
    m = load_matrix(Path(options.for_args(args).matrix))
    options.use_matrix(m)
    return m


def _targets(args, *, all_by_default: bool = False) -> tuple[Matrix, list]:
    """The selected targets; with no selectors, the matrix default (or the whole fleet for plan/generate).
    Loading the matrix completes the options (matrix.yaml is one of their sources); --registry (GPUFORGE_REGISTRY)
    moves the targets onto that registry here, once, so every stage reads each target's own reference."""
    m = _matrix(args)
    targets = list(m.targets) if all_by_default and not args.selectors else m.select(args.selectors)
    return m, [t.on(_registry(args)) for t in targets]


def _registry(args) -> str | None:
    o = options.for_args(args)
    return o.registry if o.resolved.get("registry") else None


# --- the values a stage needs, made once from this command's resolved options ----------------------------

def _records(o):
    """The build records in the state_dir setting (GPUFORGE_STATE_DIR, else .gpuforge)."""
    from gpuforge.state.records import Records

    return Records(Path(o.state_dir))


def _auth(o):
    from gpuforge.registry.client import RegistryAuth

    return RegistryAuth(user=o.registry_user, password=o.registry_password, insecure=o.registry_insecure)


def _signer(o, key: str | None):
    """Signs with `key` (None: keyless) and the registry credentials of this command; the Signer decides the Rekor log
    once from cosign_tlog: keyless always, a key pair only when GPUFORGE_COSIGN_TLOG=1 asks (attest.tlog_used)."""
    from gpuforge.registry import attest

    return attest.Signer(key=key, tlog=o.cosign_tlog, auth=_auth(o))


def _verifier_or_none(o):
    """--key / GPUFORGE_COSIGN_PUBLIC_KEY, else the keyless identity + issuer; None when neither is given. Like the
    Signer, it decides the Rekor log once (keyless always; a key only when GPUFORGE_COSIGN_TLOG=1 asks)."""
    from gpuforge.registry import attest

    return attest.Verifier.of(key=o.verify_key, identity=o.cosign_identity, issuer=o.cosign_issuer,
                              tlog=o.cosign_tlog, auth=_auth(o))


def cmd_plan(args) -> int:
    m, targets = _targets(args, all_by_default=True)
    if options.for_args(args).json:
        from gpuforge.plan import fleet

        defaults = {t.id for t in m.select(None)}
        rows = [{**t.axes(), "id": t.id, "tag": t.tag, "default": t.id in defaults, "pools": [p.name for p in t.pools]}
                for t in targets]
        print(json.dumps({"include": fleet.gpu_matrix(targets) if options.for_args(args).pools else rows}, sort_keys=True))
        return 0
    # Plain aligned columns: never truncated (with or without a TTY), grep-able, fast for thousands of rows.
    cols = ("id", "torch", "cuda", "python", "os", "flavor", "source", "base")
    rows = [(t.id, t.variant.torch_local_version, t.cuda, t.python, t.os, t.flavor, t.source, t.base_image)
            for t in targets]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]

    def line(cells) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [f"{len(targets)} target(s) from {m.path}", line(cols), line("-" * w for w in widths), *map(line, rows)]
    out += fleet_lines(m, targets)
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def fleet_lines(m: Matrix, targets: list) -> list[str]:
    """Per pool of matrix.yaml's fleet: what it validates and which targets it excludes (and by which entry)."""
    from gpuforge.plan import fleet

    out = []
    for pool in fleet.pools_of(m):
        runs = [t.id for t in targets if pool in t.pools]
        out.append(f"pool {pool.describe()}: validates {len(runs)} target(s)")
        out += [f"  excluded: {t.id} (by {t.excluded_from[pool.name]!r})" for t in targets if pool.name in t.excluded_from]
    return out


def cmd_generate(args) -> int:
    from gpuforge.render import dockerfile as render

    m, targets = _targets(args, all_by_default=True)
    if options.for_args(args).check:
        render.check(targets, all_targets=not args.selectors,
                     bake=None if args.selectors else render.bake_file(targets, m.select(None)))
        print(f"generated files are up to date ({len(targets)} target(s))")
        return 0
    for t in targets:
        out = render.write(t)
        print(f"wrote {out}")
    print(f"wrote {render.write_dockerignore()}")
    if not args.selectors:  # a full generate also removes targets that left the matrix
        print(f"wrote {render.write_bake(targets, m.select(None))}")
        for p in render.prune(targets):
            print(f"removed {p}")
    return 0


def cmd_lock(args) -> int:
    from gpuforge.render import locks

    m = _matrix(args)
    out = locks.locks_to_write()
    for f in locks.compile_image_locks(list(m.targets), out):
        print(f"wrote {f}")
    print("now run `gpuforge generate` to merge the locks into each target's constraints.txt")
    return 0


def cmd_schema(args) -> int:
    from gpuforge.plan.schema import json_schema
    from gpuforge.state import files

    text = json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
    out = Path(options.for_args(args).output)
    if options.for_args(args).check:
        if not out.exists() or out.read_text() != text:
            print(f"gpuforge: error: {out} is stale; run `gpuforge schema`", file=sys.stderr)
            return 2
        return 0
    files.write_output(out, text)
    print(f"wrote {out}")
    return 0


def cmd_build(args) -> int:
    from gpuforge.builder import aptstate
    from gpuforge.builder import runner as build

    m, targets = _targets(args)
    o = options.for_args(args)
    opts = build.BuildOptions(
        jobs=o.jobs, keep_going=o.keep_going, extra_ca=o.extra_ca, builder=o.builder, cache_from=list(o.cache_from),
        cache_to=o.cache_to, client=o.docker, driver=o.driver, no_cache=o.no_cache, index_url=o.index_url,
        pypi_url=o.pypi_url, progress=o.progress, provenance=None if o.provenance == "default" else o.provenance,
        records=_records(o), log_dir=Path(o.log_dir), gzip_level=o.compression_level,
        apt_state=aptstate.pinned(o.apt_state, o.source("apt_state")) if o.apt_state else None,
    )
    if o.source("extra_ca") in build.HOST_TRUST_ENV:  # no CA given: trust what the host's pip trusts (a TLS proxy's CA)
        print(f"gpuforge: no extra CA given; using the host's pip trust {o.extra_ca} (from {o.source('extra_ca')}) "
              "as the build secret (--extra-ca to choose another)", flush=True)
    elif o.extra_ca:
        print(f"gpuforge: extra CA bundle {o.extra_ca} (from {o.source('extra_ca')}), passed as a build secret", flush=True)
    build.build_targets(targets, opts)  # raises BuildError (exit 4) when any target failed
    return 0


def _gpu_request(args, *, starts_containers: bool = True) -> str:
    """--gpu-request, GPUFORGE_GPU_REQUEST, matrix.yaml's gpu_request (once loaded), nvidia; said where it starts GPUs."""
    req = options.for_args(args).get("gpu_request")
    if starts_containers:
        print(f"gpuforge: GPU request {req.value} (from {req.source})", flush=True)
    return req.value


def cmd_validate(args) -> int:
    from gpuforge.validate import pytest_run as validate

    m, targets = _targets(args)
    o = options.for_args(args)
    if o.bundle:  # an isolated GPU runner: signed offline into a file, attached later (`gpuforge attach`)
        from gpuforge.evidence import signed_run

        signer = _bundle_signer(o, targets)
        return signed_run.validate_into_bundle(targets[0], out=Path(o.bundle), reports=Path(o.reports), signer=signer,
                                               records=_records(o), pytest_args=o.pytest_args,
                                               gpu_request=_gpu_request(args), progress_mode=o.progress)
    gpu_request = _gpu_request(args) if o.gpu else None
    if o.attest:  # sign in this process, from this run's results, onto the pushed digest
        from gpuforge.evidence import signed_run

        return signed_run.validate_and_attest(targets, reports=Path(o.reports), signer=_signer(o, o.signing_key),
                                              records=_records(o), pytest_args=o.pytest_args,
                                              gpu=o.gpu, gpu_request=gpu_request, progress_mode=o.progress,
                                              verifier=_verifier_or_none(o), reuse_evidence=not o.no_reuse,
                                              reuse_from=tuple(o.reuse_from))
    return validate.validate_targets(targets, reports=Path(o.reports), records=_records(o), pytest_args=o.pytest_args,
                                     gpu=o.gpu, gpu_request=gpu_request, progress_mode=o.progress)


def _bundle_signer(o, targets: list):
    """`validate --bundle`: one target's GPU run, signed offline with a key pair; each other combination one line."""
    why = ("--bundle and --attest are two ways to deliver one run's statements: give one" if o.attest else
           "--bundle carries a GPU run's evidence: give --gpu" if not o.gpu else
           "validate --bundle signs offline with a key pair: give --sign-key cosign.key (or GPUFORGE_COSIGN_KEY); "
           "keyless signing needs Fulcio and Rekor, so the network" if not o.signing_key else
           f"--bundle holds one run: select one target ({len(targets)} matched)" if len(targets) != 1 else None)
    if why:
        raise ConfigError(why)
    signer = _signer(o, o.signing_key)
    if signer.tlog:
        msg = ("GPUFORGE_COSIGN_TLOG=1: a bundle is signed offline and cannot reach the Rekor transparency log; unset "
               "it for --bundle")
        raise ConfigError(msg)
    return signer


def cmd_attach(args) -> int:
    from gpuforge.evidence import attach

    o = options.for_args(args)
    m = _matrix(args)
    candidates = [t.on(_registry(args)) for t in (m.select(args.selectors) if args.selectors else m.targets)]
    attach.attach_bundle(Path(args.bundle), candidates, selected=bool(args.selectors), records=_records(o),
                         verifier=_verifier_or_none(o), auth=_auth(o), pool=o.pool,
                         max_age_days=o.evidence_ttl.of("prod"))
    return 0


def cmd_smoke(args) -> int:
    from gpuforge.validate import pytest_run as validate

    o = options.for_args(args)
    host, selectors = args.host, args.selectors
    if o.image and host and "://" not in host:  # `smoke --image IMG SELECTOR`: the positional is a selector
        host, selectors = None, [host, *selectors]
    # matrix.yaml's gpu_request counts where there is a matrix (a GPU runner may have only --target-json)
    m, matrix = None, Path(o.matrix)
    if o.source("gpu_request") == "default" and (matrix.is_file() or not o.target_json):
        try:
            m = load_matrix(matrix)
        except ConfigError as e:
            if not o.target_json:
                raise
            # the versions come from --target-json: a broken matrix.yaml beside it only loses its gpu_request
            print(f"gpuforge: note: {matrix} not read for gpu_request ({e}); using the default", file=sys.stderr)
    options.use_matrix(m)
    return validate.smoke(host, reports=Path(o.reports), expect=list(o.expect), target_json=o.target_json,
                          matrix=matrix, selectors=selectors, pytest_args=o.pytest_args,
                          image=o.image, gpu_request=_gpu_request(args, starts_containers=bool(o.image)), gpus=o.gpus,
                          progress_mode=o.progress, level=o.level)


def cmd_push(args) -> int:
    from gpuforge.push import pusher

    m, targets = _targets(args)
    o = options.for_args(args)
    pusher.push_targets(targets, records=_records(o), auth=_auth(o), log_dir=Path(o.log_dir),
                        replace=o.replace, compression=o.compression, progress=o.progress)
    return 0


def cmd_pull(args) -> int:
    from gpuforge.push import pull
    from gpuforge.registry.client import RegistryAuth

    m, targets = _targets(args)
    o = options.for_args(args)
    # the engine pulls: its own configuration decides plain HTTP, so only the credentials are gpuforge's to give
    pull.pull_targets(targets, records=_records(o), auth=RegistryAuth(user=o.registry_user, password=o.registry_password))
    return 0


def cmd_promote(args) -> int:
    from gpuforge.publish import promote

    o = options.for_args(args)
    sign_key = _record_signing_key(o)  # first: a promotion that cannot sign its record never touches a tag
    m, targets = _targets(args)
    promote.promote_targets(targets, env=o.env, records=_records(o), auth=_auth(o), verifier=_verifier_or_none(o),
                            signer=_signer(o, sign_key), reports=Path(o.reports),
                            require_gpu=o.require_gpu, allow_no_gpu=o.allow_no_gpu, replace=o.replace,
                            require_cve=o.prod_require_cve, max_age_days=o.evidence_ttl.of(o.env))
    return 0


def cmd_canary(args) -> int:
    from gpuforge.evidence import canary

    o = options.for_args(args)
    m, targets = _targets(args, all_by_default=True)  # what the environment holds: every target, as status reads it
    gpu_request = _gpu_request(args) if o.gpu else "nvidia"
    return canary.run(targets, env=o.env, reports=Path(o.reports), signer=_signer(o, o.signing_key), records=_records(o),
                      gpu=o.gpu, gpu_request=gpu_request, progress_mode=o.progress)


def _one_target(args):
    m, targets = _targets(args)
    if len(targets) != 1:
        msg = f"{args.cmd}: select exactly one target ({len(targets)} matched: {', '.join(t.id for t in targets[:5])})"
        raise ConfigError(msg)
    return targets[0]


def cmd_status(args) -> int:
    from gpuforge.publish import status

    m, targets = _targets(args)
    o = options.for_args(args)
    return status.status(targets, env=o.env, verifier=_verifier_or_none(o),
                         records=_records(o), as_json=o.json, ttl=o.evidence_ttl)


def cmd_history(args) -> int:
    from gpuforge.publish import status

    o = options.for_args(args)
    return status.show_history(_one_target(args), env=o.env, verifier=_verifier_or_none(o),
                               as_json=o.json)


def cmd_rollback(args) -> int:
    from gpuforge.publish import rollback

    o = options.for_args(args)
    sign_key = _record_signing_key(o)
    rollback.rollback(_one_target(args), env=o.env, to=o.digest, steps=o.steps,
                      verifier=_verifier_or_none(o), signer=_signer(o, sign_key), allow_no_gpu=o.allow_no_gpu,
                      reports=Path(o.reports))
    return 0


def cmd_policy(args) -> int:
    from gpuforge.publish import policy

    o = options.for_args(args)
    t = _one_target(args)
    verifier = _verifier_or_none(o)  # its Rekor decision is the policy's (ctlog); none: policy.write says what to give
    text = policy.write(fmt=o.format, env=o.env, pool=o.pool, pools=tuple(p.name for p in t.pools),
                        max_age_days=o.evidence_ttl.of(o.env), repository=str(t.ref.bare()),
                        output=Path(o.output) if o.output else None, key=o.verify_key,
                        identity=o.cosign_identity, issuer=o.cosign_issuer, tlog=bool(verifier and verifier.tlog))
    if not o.output:
        sys.stdout.write(text)
    return 0


def _record_signing_key(o) -> str | None:
    """Promotion records are signed with --sign-key (or GPUFORGE_COSIGN_KEY); with neither, keyless — refused
    here, before any registry or tag work, when no OIDC identity token is at hand."""
    from gpuforge.registry import attest

    key = o.signing_key
    if key is None and not attest.oidc_token_available():
        msg = ("promotion records are signed: give --sign-key KEY (or GPUFORGE_COSIGN_KEY), or run where cosign gets "
               "an OIDC identity token (SIGSTORE_ID_TOKEN, or GitHub Actions with `id-token: write`)")
        raise ConfigError(msg)
    return key


def cmd_attest(args) -> int:
    """Refused, whatever it is given: kept only to say what signs evidence instead (it carries no option rows)."""
    from gpuforge.publish import promote

    promote.attest_targets([])
    return 0


def cmd_cve_gate(args) -> int:
    from gpuforge.cve import gate as cve

    o = options.for_args(args)
    t = load_matrix(Path(o.matrix)).by_id(o.target).on(o.registry) if o.target else None
    cve.gate([Path(p) for p in args.scans], allowlist=Path(o.cve_allowlist) if o.cve_allowlist else None, target=t,
             severity=o.cve_severity, max_db_age_hours=o.cve_max_db_age_hours,
             db_metadata=Path(o.db_metadata) if o.db_metadata else None, sbom=Path(o.sbom) if o.sbom else None,
             output=Path(o.output) if o.output else None, sign=o.attest,
             signer=_signer(o, o.signing_key) if o.attest else None, digest=o.digest, records=_records(o),
             vex_author=o.vex_author)
    return 0


def cmd_prod_sboms(args) -> int:
    from gpuforge.cve import gate as cve

    m, targets = _targets(args, all_by_default=True)
    o = options.for_args(args)
    cve.write_prod_sboms(targets, verifier=_verifier(o), out=Path(o.output_dir))
    return 0


def cmd_outdated(args) -> int:
    from gpuforge.fleet import outdated

    m, targets = _targets(args, all_by_default=True)
    o = options.for_args(args)
    lock = outdated.lock_path(m.path)
    if o.write_base_lock:
        print(f"wrote {lock} ({len(outdated.write_lock(targets, lock, _auth(o)))} pulled base(s))")
        return 0
    found = outdated.upstream(targets) + outdated.bases(targets, outdated.read_lock(lock), _auth(o))
    if o.images:
        found += outdated.security(targets, _records(o))
    if o.prod:
        verifier = _verifier_or_none(o)
        if verifier is None:
            msg = "--prod needs a way to verify signed CVE verdicts: --key or GPUFORGE_COSIGN_PUBLIC_KEY"
            raise ConfigError(msg)
        found += outdated.prod_cve(targets, verifier=verifier)
    sys.stdout.write(outdated.report(found, as_json=o.json))
    return 0


def _verifier(o):
    v = _verifier_or_none(o)
    if v is None:
        msg = "no way to verify the signed evidence: --key cosign.pub, GPUFORGE_COSIGN_PUBLIC_KEY, or keyless identity"
        raise ConfigError(msg)
    return v


def cmd_support(args) -> int:
    from gpuforge.fleet import support

    m, targets = _targets(args, all_by_default=True)
    o = options.for_args(args)
    sys.stdout.write(support.support_cli(m, targets, fmt=o.format, verifier=_verifier(o),
                                         records=_records(o)))
    return 0


def cmd_release_notes(args) -> int:
    from gpuforge.fleet import support

    m, targets = _targets(args)
    o = options.for_args(args)
    sys.stdout.write(support.notes_cli(m, targets, fmt=o.format, verifier=_verifier(o),
                                       records=_records(o), digest=o.digest, previous=o.previous,
                                       output=o.output_dir, sign=o.attest,
                                       signer=_signer(o, o.signing_key) if o.attest else None))
    return 0


def cmd_clean(args) -> int:
    from gpuforge.engine import containers as run

    print(run.sweep(everything=options.for_args(args).all).line())  # one line, on stdout: what went and what was kept
    return 0


DESCRIPTION = """\
Build PyTorch + CUDA container images from one matrix.yaml, prove each one with validators (versions,
security, SSH, Jupyter, GPU), sign the evidence with cosign and promote exactly the validated digest
from dev to prod.

The usual sequence, for the matrix default (or give selectors such as cuda=12.8 flavor=devel):
  gpuforge build                       build with BuildKit, tag only on success
  gpuforge validate                    run the validators; writes reports/<target>/report.md
  gpuforge push                        push to the matrix's registry, record the digest
  gpuforge validate --attest --sign-key cosign.key   validate again, signing the result onto the pushed digest
  gpuforge promote --env dev --key cosign.pub        copy the validated digest to the -dev tags (signed record)
  gpuforge status                      what dev and prod hold, from the registry
Run `gpuforge COMMAND --help` for a command's options; docs/ and README.md say more."""


def _epilog() -> str:
    codes = "\n".join(f"  {code:<4} {what}" for code, what in exit_codes())
    return f"exit codes (errors are one line on stderr):\n{codes}"


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line too (exit 2), like every other error: argparse's default prints the usage first."""

    def error(self, message: str):
        cmd = self.prog.removeprefix("gpuforge").strip()
        self.exit(2, f"gpuforge: error: {cmd + ': ' if cmd else ''}{message} (see `{self.prog} --help`)\n")


def parser() -> argparse.ArgumentParser:
    """Positionals here; every option comes from gpuforge.options' table (flag, variable, matrix key, default)."""
    fmt = argparse.RawDescriptionHelpFormatter
    ap = _Parser(prog="gpuforge", description=DESCRIPTION, epilog=_epilog(), formatter_class=fmt)
    ap.add_argument("--version", action="version", version=f"gpuforge {__version__}",
                    help="print gpuforge's version and exit")
    options.add_arguments(ap, None)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def add(name: str, fn, help_: str, selectors: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_, epilog=_epilog(), formatter_class=fmt)
        if selectors:
            p.add_argument("selectors", nargs="*", help="key=value (glob values) and target-id globs; none: the default")
        p.set_defaults(fn=fn)
        options.add_arguments(p, name)
        return p

    _plan_and_build(add)
    _validation(add)
    _publishing(add)
    _fleet_reports(add)
    _promotion_state(add)
    return ap


def _plan_and_build(add) -> None:
    add("plan", cmd_plan, "print the expanded targets")
    add("generate", cmd_generate, "render images/dist/<target>/ from the templates")
    add("lock", cmd_lock, "re-resolve the images' Python package locks with uv (needs the index)", selectors=False)
    add("schema", cmd_schema, "write the JSON schema of matrix.yaml (for editors)", selectors=False)
    add("build", cmd_build, "build images with BuildKit (buildx when present)")
    add("clean", cmd_clean, "remove the containers of gpuforge runs that are gone (never a live run's)", selectors=False)


def _validation(add) -> None:
    add("validate", cmd_validate, "run the validators against built targets")
    p = add("smoke", cmd_smoke, "run the driver + GPU smoke validators against HOST, or a container of --image", selectors=False)
    p.add_argument("host", nargs="?", help="docker://CONTAINER, local:// or ssh://USER@HOST (or --image)")
    p.add_argument("selectors", nargs="*", help="target whose versions are expected (default: the matrix default)")
    p = add("cve-gate", cmd_cve_gate, "judge scanner JSON (Trivy, Grype, pip-audit) against the CVE allowlist; "
            "exit 9 when red (docs/cve.md)", selectors=False)
    p.add_argument("scans", nargs="+", help="scanner JSON reports: trivy -f json, grype -o json, pip-audit -f json")


def _publishing(add) -> None:
    add("push", cmd_push, "push built targets and record their digests")
    add("pull", cmd_pull, "pull each target's pushed digest (from its build record) into the engine with gpuforge's "
        "registry credentials, never written to a docker config; refused unless it is the recorded image")
    add("promote", cmd_promote, "promote validated digests to dev or prod")
    add("attest", cmd_attest, "refused: a report file is not signed after the fact (use `validate --attest`)",
        selectors=False)
    p = add("attach", cmd_attach, "check a bundle of GPU evidence signed offline (`validate --gpu --bundle` on a runner "
            "with no registry) and attach its statements to the target's pushed digest; nothing is attached unless "
            "every check holds (exit 11)", selectors=False)
    p.add_argument("bundle", help="the bundle file `validate --gpu --bundle` wrote")
    p.add_argument("selectors", nargs="*", help="the target it is evidence for (default: the one the bundle names)")
    add("canary", cmd_canary, "validate again what an environment holds (pulled by digest, never reused) and sign "
        "the result onto that digest; a red canary blocks its further promotion")
    add("policy", cmd_policy, "write the admission policy (CUE or Rego for cosign, or a policy-controller ClusterImagePolicy) "
        "that admits a target's images to an environment and GPU pool only by a signed, fresh, passing Test Result")


def _fleet_reports(add) -> None:
    add("prod-sboms", cmd_prod_sboms, "write each prod digest's signed SBOM (for a re-scan without pulling)")
    add("outdated", cmd_outdated, "report what moved upstream: torch/CUDA in the compat data, base digests, "
        "security updates in built images, red prod CVE verdicts")
    add("support", cmd_support, "table of prod digests x fleet pools -> signed GPU evidence (date, result)")
    add("release-notes", cmd_release_notes, "release notes of a promoted digest from its signed attestations")


def _promotion_state(add) -> None:
    add("status", cmd_status, "what dev and prod hold, read from the registry: digests, promotion, evidence")
    add("history", cmd_history, "the promotions of TARGET in one environment, in order, from the registry")
    add("rollback", cmd_rollback, "point an environment's tags back at a digest promoted there before "
        "(evidence re-verified; no rebuild, no layer pull)")


def _reap() -> None:
    """Containers of gpuforge runs that died (SIGKILL, OOM) go at the next run that uses the engine."""
    from gpuforge.engine import containers as run

    try:
        n = run.reap()
    except FatalError:
        return  # no engine: the command itself reports that
    if n:
        print(f"gpuforge: removed {n} container(s) left by gpuforge runs that died", file=sys.stderr)


def _name_the_run(o) -> None:
    """The checkout (root: GPUFORGE_ROOT) and the run id (GPUFORGE_RUN_ID) this process works under, named once."""
    paths.use_root(Path(o.root) if o.root else None)
    if o.resolved.get("run_id"):
        from gpuforge.engine import containers

        containers.use_run_id(o.run_id)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args, extra = p.parse_known_args(argv)
    if extra and args.cmd != "attest":  # attest takes anything, only to refuse it with what to run instead
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        o = options.for_args(args)  # every flag, variable and default, checked before any work
        _name_the_run(o)
        if args.cmd in ("schema", "clean"):  # the others complete the options with matrix.yaml first
            options.use_matrix(None)
        if args.cmd in ("build", "validate"):  # `clean` reaps by itself and counts it once
            _reap()
        return args.fn(args)
    except FatalError as e:
        print(f"gpuforge: error: {e}", file=sys.stderr)
        return e.return_code
    except KeyboardInterrupt:
        print("gpuforge: interrupted", file=sys.stderr)
        return 130
    finally:
        options.activate(None)
        paths.use_root(None)


if __name__ == "__main__":
    sys.exit(main())
