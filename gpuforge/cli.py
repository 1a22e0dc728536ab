"""The gpuforge command line: one argparse block and a one-line dispatch per subcommand.

Every FatalError is caught once, in main(), and printed as one line with its kind's exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from rich.console import Console

from gpuforge import __version__, options, paths
from gpuforge.errors import ConfigError, FatalError, exit_codes
from gpuforge.plan.matrix import Matrix, load_matrix

if TYPE_CHECKING:
    # the field `options` below hides the module inside the class body, so the stages' types are named directly
    from gpuforge.options import (
        BuildSettings,
        CveGateSettings,
        PromoteSettings,
        PushSettings,
        RegistrySettings,
        SigningSettings,
        ValidateSettings,
    )
    from gpuforge.plan.target import Target
    from gpuforge.registry.attest import Signer, Verifier
    from gpuforge.registry.client import RegistryAuth
    from gpuforge.state.records import Records

console = Console(stderr=False, highlight=False)


@dataclass(frozen=True, kw_only=True)
class Run:
    """One command's settings, made once by main() after matrix.yaml (one of their sources) is loaded, and handed
    to the command's function: each stage's typed settings and the objects the stages share. Nothing below the
    CLI looks a setting up."""

    options: options.Options  # every value with its source (-v); a command's own flags: flag(name), text(name), ...
    matrix: Matrix | None  # None for the commands that read no matrix.yaml
    records: Records  # the build records in the state_dir setting
    auth: RegistryAuth
    registry: RegistrySettings
    signing: SigningSettings
    build: BuildSettings
    push: PushSettings
    validate: ValidateSettings
    promote: PromoteSettings
    cve: CveGateSettings

    # A command's own flags, typed (TypeError, naming the setting, when the table gives it another type).
    def flag(self, name: str) -> bool:
        return self.options.flag(name)

    def text(self, name: str) -> str | None:
        return self.options.text(name)

    def required_text(self, name: str) -> str:
        return self.options.required_text(name)

    def number(self, name: str) -> int | None:
        return self.options.number(name)

    def texts(self, name: str) -> tuple[str, ...]:
        return self.options.texts(name)


def _make_run(o: options.Options, matrix: Matrix | None) -> Run:
    from gpuforge.registry.client import RegistryAuth
    from gpuforge.state.records import Records

    reg = o.stage(options.RegistrySettings)
    return Run(options=o, matrix=matrix, records=Records(Path(o.required_text("state_dir"))),
               auth=RegistryAuth(user=reg.registry_user, password=reg.registry_password, insecure=reg.registry_insecure),
               registry=reg, signing=o.stage(options.SigningSettings), build=o.stage(options.BuildSettings),
               push=o.stage(options.PushSettings), validate=o.stage(options.ValidateSettings),
               promote=o.stage(options.PromoteSettings), cve=o.stage(options.CveGateSettings))


# Commands that read no matrix.yaml (cve-gate reads it only for --target, smoke only for its gpu_request).
_NO_MATRIX = ("schema", "clean", "attest")


def _load_matrix(cmd: str, o: options.Options) -> Matrix | None:
    """matrix.yaml, loaded once per command, before its options are final (it is one of their sources)."""
    if cmd in _NO_MATRIX or (cmd == "cve-gate" and not o.text("target")):
        return None
    if cmd == "smoke":
        return _smoke_matrix(o)
    return load_matrix(Path(o.required_text("matrix")))


def _smoke_matrix(o: options.Options) -> Matrix | None:
    """matrix.yaml's gpu_request counts where there is a matrix (a GPU runner may have only --target-json)."""
    matrix = Path(o.required_text("matrix"))
    if o.source("gpu_request") != "default" or not (matrix.is_file() or not o.text("target_json")):
        return None
    try:
        return load_matrix(matrix)
    except ConfigError as e:
        if not o.text("target_json"):
            raise
        # the versions come from --target-json: a broken matrix.yaml beside it only loses its gpu_request
        print(f"gpuforge: note: {matrix} not read for gpu_request ({e}); using the default", file=sys.stderr)
        return None


def _matrix(run: Run) -> Matrix:
    if run.matrix is None:  # _load_matrix loads it for every command that calls this
        msg = f"{run.options.command}: matrix.yaml was not loaded"
        raise ConfigError(msg)
    return run.matrix


def _targets(args: argparse.Namespace, run: Run, *, all_by_default: bool = False) -> tuple[Matrix, list[Target]]:
    """The selected targets; with no selectors, the matrix default (or the whole fleet for plan/generate).
    --registry (GPUFORGE_REGISTRY) moves the targets onto that registry here, once, so every stage reads each
    target's own reference."""
    m = _matrix(run)
    targets = list(m.targets) if all_by_default and not args.selectors else m.select(args.selectors)
    return m, [t.on(run.registry.registry) for t in targets]


# --- the signer and verifier a stage needs, made from this command's signing settings ---------------------

def _signer(run: Run, key: str | None) -> Signer:
    """Signs with `key` (None: keyless) and the registry credentials of this command; the Signer decides the Rekor log
    once from cosign_tlog: keyless always, a key pair only when GPUFORGE_COSIGN_TLOG=1 asks (attest.tlog_used)."""
    from gpuforge.registry import attest

    return attest.Signer(key=key, tlog=run.signing.cosign_tlog, auth=run.auth)


def _verifier_or_none(run: Run) -> Verifier | None:
    """--key / GPUFORGE_COSIGN_PUBLIC_KEY, else the keyless identity + issuer; None when neither is given. Like the
    Signer, it decides the Rekor log once (keyless always; a key only when GPUFORGE_COSIGN_TLOG=1 asks)."""
    from gpuforge.registry import attest

    s = run.signing
    return attest.Verifier.of(key=s.verify_key, identity=s.cosign_identity, issuer=s.cosign_issuer,
                              tlog=s.cosign_tlog, auth=run.auth)


def cmd_plan(args: argparse.Namespace, run: Run) -> int:
    m, targets = _targets(args, run, all_by_default=True)
    if run.flag("json"):
        from gpuforge.plan import fleet

        defaults = {t.id for t in m.select(None)}
        entries = [{**t.axes(), "id": t.id, "tag": t.tag, "default": t.id in defaults, "pools": [p.name for p in t.pools]}
                   for t in targets]
        print(json.dumps({"include": fleet.gpu_matrix(targets) if run.flag("pools") else entries}, sort_keys=True))
        return 0
    # Plain aligned columns: never truncated (with or without a TTY), grep-able, fast for thousands of rows.
    cols = ("id", "torch", "cuda", "python", "os", "flavor", "source", "base")
    rows = [(t.id, t.variant.torch_local_version, t.cuda, t.python, t.os, t.flavor, t.source, t.base_image)
            for t in targets]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]

    def line(cells: Iterable[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [f"{len(targets)} target(s) from {m.path}", line(cols), line("-" * w for w in widths), *map(line, rows)]
    out += fleet_lines(m, targets)
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def fleet_lines(m: Matrix, targets: list[Any]) -> list[str]:
    """Per pool of matrix.yaml's fleet: what it validates and which targets it excludes (and by which entry)."""
    from gpuforge.plan import fleet

    out = []
    for pool in fleet.pools_of(m):
        runs = [t.id for t in targets if pool in t.pools]
        out.append(f"pool {pool.describe()}: validates {len(runs)} target(s)")
        out += [f"  excluded: {t.id} (by {t.excluded_from[pool.name]!r})" for t in targets if pool.name in t.excluded_from]
    return out


def cmd_generate(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.render import dockerfile as render

    m, targets = _targets(args, run, all_by_default=True)
    if run.flag("check"):
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


def cmd_lock(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.render import locks

    m = _matrix(run)
    out = locks.locks_to_write()
    for f in locks.compile_image_locks(list(m.targets), out):
        print(f"wrote {f}")
    print("now run `gpuforge generate` to merge the locks into each target's constraints.txt")
    return 0


def cmd_schema(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.plan.schema import json_schema
    from gpuforge.state import files

    text = json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
    out = Path(run.required_text("output"))
    if run.flag("check"):
        if not out.exists() or out.read_text() != text:
            print(f"gpuforge: error: {out} is stale; run `gpuforge schema`", file=sys.stderr)
            return 2
        return 0
    files.write_output(out, text)
    print(f"wrote {out}")
    return 0


def cmd_build(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.builder import aptstate
    from gpuforge.builder import runner as build

    m, targets = _targets(args, run)
    b, o = run.build, run.options
    opts = build.BuildOptions(
        jobs=b.jobs, keep_going=b.keep_going, extra_ca=b.extra_ca, builder=b.builder, cache_from=list(b.cache_from),
        cache_to=b.cache_to, client=b.docker, driver=b.driver, no_cache=b.no_cache, index_url=b.index_url,
        pypi_url=b.pypi_url, progress=b.progress, provenance=None if b.provenance == "default" else b.provenance,
        records=run.records, log_dir=Path(b.log_dir), gzip_level=b.compression_level,
        apt_state=aptstate.pinned(b.apt_state, o.source("apt_state")) if b.apt_state else None,
    )
    if o.source("extra_ca") in build.HOST_TRUST_ENV:  # no CA given: trust what the host's pip trusts (a TLS proxy's CA)
        print(f"gpuforge: no extra CA given; using the host's pip trust {b.extra_ca} (from {o.source('extra_ca')}) "
              "as the build secret (--extra-ca to choose another)", flush=True)
    elif b.extra_ca:
        print(f"gpuforge: extra CA bundle {b.extra_ca} (from {o.source('extra_ca')}), passed as a build secret", flush=True)
    _reap()
    build.build_targets(targets, opts)  # raises BuildError (exit 4) when any target failed
    return 0


def _gpu_request(run: Run, *, starts_containers: bool = True) -> str:
    """--gpu-request, GPUFORGE_GPU_REQUEST, matrix.yaml's gpu_request, nvidia; said where it starts GPUs."""
    if starts_containers:
        print(f"gpuforge: GPU request {run.validate.gpu_request} (from {run.options.source('gpu_request')})", flush=True)
    return run.validate.gpu_request


def cmd_validate(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.validate import pytest_run as validate

    m, targets = _targets(args, run)
    v = run.validate
    if v.bundle:  # an isolated GPU runner: signed offline into a file, attached later (`gpuforge attach`)
        from gpuforge.evidence import signed_run

        signer = _bundle_signer(run, targets)
        _reap()
        return signed_run.validate_into_bundle(targets[0], out=Path(v.bundle), reports=Path(v.reports), signer=signer,
                                               records=run.records, pytest_args=v.pytest_args,
                                               gpu_request=_gpu_request(run), progress_mode=v.progress)
    gpu_request = _gpu_request(run, starts_containers=v.gpu)  # read only with --gpu
    if v.attest:  # sign in this process, from this run's results, onto the pushed digest
        from gpuforge.evidence import signed_run

        signer, verifier = _signer(run, run.signing.signing_key), _verifier_or_none(run)
        _reap()
        return signed_run.validate_and_attest(targets, reports=Path(v.reports), signer=signer,
                                              records=run.records, pytest_args=v.pytest_args,
                                              gpu=v.gpu, gpu_request=gpu_request, progress_mode=v.progress,
                                              verifier=verifier, reuse_evidence=not v.no_reuse,
                                              reuse_from=v.reuse_from)
    _reap()
    return validate.validate_targets(targets, reports=Path(v.reports), records=run.records, pytest_args=v.pytest_args,
                                     gpu=v.gpu, gpu_request=gpu_request, progress_mode=v.progress)


def _bundle_signer(run: Run, targets: list[Target]) -> Signer:
    """`validate --bundle`: one target's GPU run, signed offline with a key pair; each other combination one line."""
    v, key = run.validate, run.signing.signing_key
    why = ("--bundle and --attest are two ways to deliver one run's statements: give one" if v.attest else
           "--bundle carries a GPU run's evidence: give --gpu" if not v.gpu else
           "validate --bundle signs offline with a key pair: give --sign-key cosign.key (or GPUFORGE_COSIGN_KEY); "
           "keyless signing needs Fulcio and Rekor, so the network" if not key else
           f"--bundle holds one run: select one target ({len(targets)} matched)" if len(targets) != 1 else None)
    if why:
        raise ConfigError(why)
    signer = _signer(run, key)
    if signer.tlog:
        msg = ("GPUFORGE_COSIGN_TLOG=1: a bundle is signed offline and cannot reach the Rekor transparency log; unset "
               "it for --bundle")
        raise ConfigError(msg)
    return signer


def cmd_attach(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.evidence import attach

    m = _matrix(run)
    candidates = [t.on(run.registry.registry) for t in (m.select(args.selectors) if args.selectors else m.targets)]
    attach.attach_bundle(Path(args.bundle), candidates, selected=bool(args.selectors), records=run.records,
                         verifier=_verifier_or_none(run), auth=run.auth, pool=run.promote.pool,
                         max_age_days=run.promote.evidence_ttl.of("prod"))
    return 0


def cmd_smoke(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.validate import pytest_run as validate

    v = run.validate
    image = run.text("image")
    host, selectors = args.host, args.selectors
    if image and host and "://" not in host:  # `smoke --image IMG SELECTOR`: the positional is a selector
        host, selectors = None, [host, *selectors]
    return validate.smoke(host, reports=Path(v.reports), expect=list(run.texts("expect")),
                          target_json=run.text("target_json"), matrix=Path(run.required_text("matrix")),
                          selectors=selectors, pytest_args=v.pytest_args,
                          image=image, gpu_request=_gpu_request(run, starts_containers=bool(image)), gpus=v.gpus,
                          progress_mode=v.progress, level=run.text("level"))


def cmd_push(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.push import pusher

    m, targets = _targets(args, run)
    p = run.push
    pusher.push_targets(targets, records=run.records, auth=run.auth, log_dir=Path(p.log_dir),
                        replace=p.replace, compression=p.compression, progress=p.progress)
    return 0


def cmd_pull(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.push import pull
    from gpuforge.registry.client import RegistryAuth

    m, targets = _targets(args, run)
    # the engine pulls: its own configuration decides plain HTTP, so only the credentials are gpuforge's to give
    pull.pull_targets(targets, records=run.records,
                      auth=RegistryAuth(user=run.registry.registry_user, password=run.registry.registry_password))
    return 0


def cmd_promote(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.publish import promote

    sign_key = run.signing.signing_key  # one that cannot sign its record was refused before the matrix was read
    m, targets = _targets(args, run)
    p, env = run.promote, _env(run)
    promote.promote_targets(targets, env=env, records=run.records, auth=run.auth, verifier=_verifier_or_none(run),
                            signer=_signer(run, sign_key), reports=Path(run.validate.reports),
                            require_gpu=p.require_gpu, allow_no_gpu=p.allow_no_gpu, replace=p.replace,
                            require_cve=p.prod_require_cve, max_age_days=p.evidence_ttl.of(env))
    return 0


def cmd_canary(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.evidence import canary

    m, targets = _targets(args, run, all_by_default=True)  # what the environment holds: every target, as status reads it
    v = run.validate
    gpu_request = _gpu_request(run) if v.gpu else "nvidia"
    return canary.run(targets, env=_env(run), reports=Path(v.reports), signer=_signer(run, run.signing.signing_key),
                      records=run.records, gpu=v.gpu, gpu_request=gpu_request, progress_mode=v.progress)


def _one_target(args: argparse.Namespace, run: Run) -> Target:
    m, targets = _targets(args, run)
    if len(targets) != 1:
        msg = f"{args.cmd}: select exactly one target ({len(targets)} matched: {', '.join(t.id for t in targets[:5])})"
        raise ConfigError(msg)
    return targets[0]


def cmd_status(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.publish import status

    m, targets = _targets(args, run)
    return status.status(targets, env=run.promote.env, verifier=_verifier_or_none(run),
                         records=run.records, as_json=run.flag("json"), ttl=run.promote.evidence_ttl)


def cmd_history(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.publish import status

    return status.show_history(_one_target(args, run), env=_env(run), verifier=_verifier_or_none(run),
                               as_json=run.flag("json"))


def cmd_rollback(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.publish import rollback

    sign_key = run.signing.signing_key  # one that cannot sign its record was refused before the matrix was read
    rollback.rollback(_one_target(args, run), env=_env(run), to=run.text("digest"), steps=run.number("steps"),
                      verifier=_verifier_or_none(run), signer=_signer(run, sign_key), allow_no_gpu=run.promote.allow_no_gpu,
                      reports=Path(run.validate.reports))
    return 0


def cmd_policy(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.publish import policy

    t = _one_target(args, run)
    s, p, env, output = run.signing, run.promote, _env(run), run.text("output")
    verifier = _verifier_or_none(run)  # its Rekor decision is the policy's (ctlog); none: policy.write says what to give
    text = policy.write(fmt=run.required_text("format"), env=env, pool=p.pool,
                        pools=tuple(pool.name for pool in t.pools),
                        max_age_days=p.evidence_ttl.of(env), repository=str(t.ref.bare()),
                        output=Path(output) if output else None, key=s.verify_key,
                        identity=s.cosign_identity, issuer=s.cosign_issuer, tlog=bool(verifier and verifier.tlog))
    if not output:
        sys.stdout.write(text)
    return 0


# Commands that sign a promotion record: refused in main(), before any matrix, registry or tag work, when they cannot.
_SIGNS_RECORDS = ("promote", "rollback")


def _require_record_signer(signing: options.SigningSettings) -> None:
    """Promotion records are signed with --sign-key (or GPUFORGE_COSIGN_KEY); with neither, keyless — refused
    when no OIDC identity token is at hand."""
    from gpuforge.registry import attest

    if signing.signing_key is None and not attest.oidc_token_available():
        msg = ("promotion records are signed: give --sign-key KEY (or GPUFORGE_COSIGN_KEY), or run where cosign gets "
               "an OIDC identity token (SIGSTORE_ID_TOKEN, or GitHub Actions with `id-token: write`)")
        raise ConfigError(msg)


def cmd_attest(args: argparse.Namespace, run: Run) -> int:
    """Refused, whatever it is given: kept only to say what signs evidence instead (it carries no option rows)."""
    from gpuforge.publish import promote

    promote.attest_targets([])
    return 0


def _env(run: Run) -> str:
    """The --env of a command that requires it (argparse refused the command without one)."""
    env = run.promote.env
    if env is None:
        msg = f"{run.options.command}: give --env ({', '.join(options.ENVIRONMENTS)})"
        raise ConfigError(msg)
    return env


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def cmd_cve_gate(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.cve import gate as cve

    c, attest = run.cve, run.flag("attest")
    t = _matrix(run).by_id(c.target).on(run.registry.registry) if c.target else None
    cve.gate([Path(p) for p in args.scans], allowlist=_path(c.cve_allowlist), target=t,
             severity=c.cve_severity, max_db_age_hours=c.cve_max_db_age_hours,
             db_metadata=_path(c.db_metadata), sbom=_path(c.sbom), output=_path(run.text("output")), sign=attest,
             signer=_signer(run, run.signing.signing_key) if attest else None, digest=run.text("digest"),
             records=run.records, vex_author=c.vex_author)
    return 0


def cmd_prod_sboms(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.cve import gate as cve

    m, targets = _targets(args, run, all_by_default=True)
    cve.write_prod_sboms(targets, verifier=_verifier(run), out=Path(run.required_text("output_dir")))
    return 0


def cmd_outdated(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.fleet import outdated

    m, targets = _targets(args, run, all_by_default=True)
    lock = outdated.lock_path(m.path)
    if run.flag("write_base_lock"):
        print(f"wrote {lock} ({len(outdated.write_lock(targets, lock, run.auth))} pulled base(s))")
        return 0
    found = outdated.upstream(targets) + outdated.bases(targets, outdated.read_lock(lock), run.auth)
    if run.flag("images"):
        found += outdated.security(targets, run.records)
    if run.flag("prod"):
        verifier = _verifier_or_none(run)
        if verifier is None:
            msg = "--prod needs a way to verify signed CVE verdicts: --key or GPUFORGE_COSIGN_PUBLIC_KEY"
            raise ConfigError(msg)
        found += outdated.prod_cve(targets, verifier=verifier)
    sys.stdout.write(outdated.report(found, as_json=run.flag("json")))
    return 0


def _verifier(run: Run) -> Verifier:
    v = _verifier_or_none(run)
    if v is None:
        msg = "no way to verify the signed evidence: --key cosign.pub, GPUFORGE_COSIGN_PUBLIC_KEY, or keyless identity"
        raise ConfigError(msg)
    return v


def cmd_support(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.fleet import support

    m, targets = _targets(args, run, all_by_default=True)
    sys.stdout.write(support.support_cli(m, targets, fmt=run.required_text("format"), verifier=_verifier(run),
                                         records=run.records))
    return 0


def cmd_release_notes(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.fleet import support

    m, targets = _targets(args, run)
    attest = run.flag("attest")
    sys.stdout.write(support.notes_cli(m, targets, fmt=run.required_text("format"), verifier=_verifier(run),
                                       records=run.records, digest=run.text("digest"), previous=run.text("previous"),
                                       output=run.text("output_dir"), sign=attest,
                                       signer=_signer(run, run.signing.signing_key) if attest else None))
    return 0


def cmd_clean(args: argparse.Namespace, run: Run) -> int:
    from gpuforge.engine import containers

    print(containers.sweep(everything=run.flag("all")).line())  # one line, on stdout: what went and what was kept
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


Command = Callable[[argparse.Namespace, "Run"], int]  # a subcommand's function
AddCommand = Callable[..., argparse.ArgumentParser]  # parser()'s add(name, fn, help, selectors=True)


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line too (exit 2), like every other error: argparse's default prints the usage first."""

    def error(self, message: str) -> NoReturn:
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

    def add(name: str, fn: Command, help_: str, selectors: bool = True) -> argparse.ArgumentParser:
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


def _plan_and_build(add: AddCommand) -> None:
    add("plan", cmd_plan, "print the expanded targets")
    add("generate", cmd_generate, "render images/dist/<target>/ from the templates")
    add("lock", cmd_lock, "re-resolve the images' Python package locks with uv (needs the index)", selectors=False)
    add("schema", cmd_schema, "write the JSON schema of matrix.yaml (for editors)", selectors=False)
    add("build", cmd_build, "build images with BuildKit (buildx when present)")
    add("clean", cmd_clean, "remove the containers of gpuforge runs that are gone (never a live run's)", selectors=False)


def _validation(add: AddCommand) -> None:
    add("validate", cmd_validate, "run the validators against built targets")
    p = add("smoke", cmd_smoke, "run the driver + GPU smoke validators against HOST, or a container of --image", selectors=False)
    p.add_argument("host", nargs="?", help="docker://CONTAINER, local:// or ssh://USER@HOST (or --image)")
    p.add_argument("selectors", nargs="*", help="target whose versions are expected (default: the matrix default)")
    p = add("cve-gate", cmd_cve_gate, "judge scanner JSON (Trivy, Grype, pip-audit) against the CVE allowlist; "
            "exit 9 when red (docs/cve.md)", selectors=False)
    p.add_argument("scans", nargs="+", help="scanner JSON reports: trivy -f json, grype -o json, pip-audit -f json")


def _publishing(add: AddCommand) -> None:
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


def _fleet_reports(add: AddCommand) -> None:
    add("prod-sboms", cmd_prod_sboms, "write each prod digest's signed SBOM (for a re-scan without pulling)")
    add("outdated", cmd_outdated, "report what moved upstream: torch/CUDA in the compat data, base digests, "
        "security updates in built images, red prod CVE verdicts")
    add("support", cmd_support, "table of prod digests x fleet pools -> signed GPU evidence (date, result)")
    add("release-notes", cmd_release_notes, "release notes of a promoted digest from its signed attestations")


def _promotion_state(add: AddCommand) -> None:
    add("status", cmd_status, "what dev and prod hold, read from the registry: digests, promotion, evidence")
    add("history", cmd_history, "the promotions of TARGET in one environment, in order, from the registry")
    add("rollback", cmd_rollback, "point an environment's tags back at a digest promoted there before "
        "(evidence re-verified; no rebuild, no layer pull)")


def _reap() -> None:
    """Containers of gpuforge runs that died (SIGKILL, OOM) go at the next build or validate that uses the engine,
    once its input is checked: a refused command changes nothing, and its one line is the only thing it says."""
    from gpuforge.engine import containers as run

    try:
        n = run.reap()
    except FatalError:
        return  # no engine: the command itself reports that
    if n:
        print(f"gpuforge: removed {n} container(s) left by gpuforge runs that died", file=sys.stderr)


def _name_the_run(o: options.Options) -> None:
    """The checkout (root: GPUFORGE_ROOT) and the run id (GPUFORGE_RUN_ID) this process works under, named once."""
    root = o.text("root")
    paths.use_root(Path(root) if root else None)
    run_id = o.text("run_id") if "run_id" in o.resolved else None  # the commands that start containers take it
    if run_id is not None:
        from gpuforge.engine import containers

        containers.use_run_id(run_id)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args, extra = p.parse_known_args(argv)
    if extra and args.cmd != "attest":  # attest takes anything, only to refuse it with what to run instead
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        o = options.resolve(args)  # every flag, variable and default, checked before any work
        _name_the_run(o)
        if args.cmd in _SIGNS_RECORDS:
            _require_record_signer(o.stage(options.SigningSettings))
        matrix = _load_matrix(args.cmd, o)
        if matrix is not None:
            o = o.with_matrix(matrix)
        if o.flag("verbose"):
            for line in o.lines():
                print(f"gpuforge: option {line}", file=sys.stderr)
        code: int = args.fn(args, _make_run(o, matrix))  # the command's exit code (set_defaults(fn=...))
        return code
    except FatalError as e:
        print(f"gpuforge: error: {e}", file=sys.stderr)
        return e.return_code
    except KeyboardInterrupt:
        print("gpuforge: interrupted", file=sys.stderr)
        return 130
    finally:
        paths.use_root(None)


if __name__ == "__main__":
    sys.exit(main())
