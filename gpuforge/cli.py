"""The gpuforge CLI: plan | generate | build | validate | smoke | push | attest | promote | clean.

Each command is a short pipeline over the package; FatalError is caught once, here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rich.console import Console

from gpuforge.errors import ConfigError, FatalError
from gpuforge.plan import grammar
from gpuforge.plan.matrix import DEFAULT_MATRIX, Matrix, load_matrix

console = Console(stderr=False, highlight=False)


def _targets(args, *, all_by_default: bool = False) -> tuple[Matrix, list]:
    """The selected targets; with no selectors, the matrix default (or the whole fleet for plan/generate)."""
    m = load_matrix(Path(args.matrix))
    if all_by_default and not args.selectors:
        return m, list(m.targets)
    return m, m.select(args.selectors)


def cmd_plan(args) -> int:
    m, targets = _targets(args, all_by_default=True)
    if args.json:
        from gpuforge.plan import fleet

        defaults = {t.id for t in m.select(None)}
        rows = [{**t.axes(), "id": t.id, "tag": t.tag, "default": t.id in defaults, "pools": [p.name for p in t.pools]}
                for t in targets]
        print(json.dumps({"include": fleet.gpu_matrix(targets) if args.pools else rows}, sort_keys=True))
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
    if args.check:
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
    from importlib import resources

    from gpuforge.render import locks

    m = load_matrix(Path(args.matrix))
    out = Path(str(resources.files("gpuforge.render").joinpath("data/locks")))
    for f in locks.compile_image_locks(list(m.targets), out):
        print(f"wrote {f}")
    print("now run `gpuforge generate` to merge the locks into each target's constraints.txt")
    return 0


def cmd_schema(args) -> int:
    from gpuforge.plan.schema import json_schema

    text = json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
    out = Path(args.output)
    if args.check:
        if not out.exists() or out.read_text() != text:
            print(f"gpuforge: error: {out} is stale; run `gpuforge schema`", file=sys.stderr)
            return 2
        return 0
    out.write_text(text)
    print(f"wrote {out}")
    return 0


def cmd_build(args) -> int:
    from gpuforge import options
    from gpuforge.build import runner as build

    if args.driver not in ("auto", "buildx", "classic"):
        msg = f"GPUFORGE_DRIVER={args.driver!r}: not a build driver (allowed: auto, buildx, classic)"
        raise ConfigError(msg)
    for flag, env, value in (("--index-url", "GPUFORGE_INDEX_URL", args.index_url), ("--pypi-url", "GPUFORGE_PYPI_URL", args.pypi_url)):
        try:  # a build arg ends up in `docker history`: same URL grammar as matrix.yaml (no credentials)
            grammar.url(value, what="a package index URL") if value else None
        except ValueError as e:
            msg = f"{flag} / {env}: {e}"
            raise ConfigError(msg) from None
    m, targets = _targets(args)
    extra_ca = options.existing_file(
        options.resolve("extra_ca", flag="--extra-ca", cli=args.extra_ca, env="GPUFORGE_EXTRA_CA", matrix=m,
                        key="extra_ca", is_path=True),
        "give a PEM bundle; it reaches the build only as a secret")
    opts = build.BuildOptions(
        jobs=args.jobs, keep_going=args.keep_going, extra_ca=extra_ca.value,
        builder=args.builder, cache_from=args.cache_from, cache_to=args.cache_to, client=args.docker, driver=args.driver,
        no_cache=args.no_cache,
        index_url=args.index_url, pypi_url=args.pypi_url, progress=args.progress,
    )
    if extra_ca:
        print(f"gpuforge: extra CA bundle {extra_ca.value} (from {extra_ca.source}), passed as a build secret", flush=True)
    elif host := build.host_trust():  # no CA given: trust what the host's pip trusts (a TLS proxy's CA)
        opts.extra_ca = host.value
        print(f"gpuforge: no extra CA given; using the host's pip trust {host.value} (from {host.source}) "
              "as the build secret (--extra-ca to choose another)", flush=True)
    build.build_targets(targets, opts)  # raises BuildError (exit 4) when any target failed
    return 0


def _gpu_request(args, m: Matrix | None, *, starts_containers: bool = True) -> str:
    """--gpu-request, GPUFORGE_GPU_REQUEST, matrix.yaml's gpu_request (when `m`), nvidia; said where it starts GPUs."""
    from gpuforge import options

    req = options.gpu_request(args.gpu_request, m)
    if starts_containers:
        print(f"gpuforge: GPU request {req.value} (from {req.source})", flush=True)
    return req.value


def cmd_validate(args) -> int:
    from gpuforge.validate import pytest_run as validate

    m, targets = _targets(args)
    gpu_request = _gpu_request(args, m) if args.gpu else None
    return validate.validate_targets(targets, reports=Path(args.reports), pytest_args=args.pytest_args,
                                     gpu=args.gpu, gpu_request=gpu_request)


def cmd_smoke(args) -> int:
    from gpuforge import options
    from gpuforge.validate import pytest_run as validate

    host, selectors = args.host, args.selectors
    if args.image and host and "://" not in host:  # `smoke --image IMG SELECTOR`: the positional is a selector
        host, selectors = None, [host, *selectors]
    # matrix.yaml's gpu_request counts where there is a matrix (a GPU runner may have only --target-json)
    m = None
    if options.gpu_request(args.gpu_request).source == "default" and (Path(args.matrix).is_file() or not args.target_json):
        try:
            m = load_matrix(Path(args.matrix))
        except ConfigError as e:
            if not args.target_json:
                raise
            # the versions come from --target-json: a broken matrix.yaml beside it only loses its gpu_request
            print(f"gpuforge: note: {args.matrix} not read for gpu_request ({e}); using the default", file=sys.stderr)
    gpu_request = _gpu_request(args, m, starts_containers=bool(args.image))
    return validate.smoke(host, reports=Path(args.reports), expect=args.expect, target_json=args.target_json,
                          matrix=Path(args.matrix), selectors=selectors, pytest_args=args.pytest_args,
                          image=args.image, gpu_request=gpu_request, gpus=args.gpus)


def cmd_push(args) -> int:
    from gpuforge.publish import promote

    m, targets = _targets(args)
    promote.push_targets(targets, registry=args.registry)
    return 0


def cmd_promote(args) -> int:
    from gpuforge.publish import promote

    m, targets = _targets(args)
    promote.promote_targets(targets, env=args.to, reports=Path(args.reports), registry=args.registry,
                            require_gpu=args.require_gpu, key=args.key)
    return 0


def cmd_attest(args) -> int:
    from gpuforge.publish import promote

    m, targets = _targets(args)
    promote.attest_targets(targets, reports=Path(args.reports), registry=args.registry, gpu=args.gpu, key=args.key)
    return 0


def cmd_cve_gate(args) -> int:
    from gpuforge.publish import cve

    t = load_matrix(Path(args.matrix)).by_id(args.target) if args.target else None
    cve.gate([Path(p) for p in args.scans], allowlist=Path(args.allowlist) if args.allowlist else None, target=t,
             severity=args.severity, max_db_age_hours=args.max_db_age_hours,
             db_metadata=Path(args.db_metadata) if args.db_metadata else None, sbom=Path(args.sbom) if args.sbom else None,
             output=Path(args.output) if args.output else None, sign=args.attest, attest_key=args.key, registry=args.registry,
             digest=args.digest)
    return 0


def cmd_prod_sboms(args) -> int:
    from gpuforge.publish import cve

    m, targets = _targets(args, all_by_default=True)
    cve.write_prod_sboms(targets, registry=args.registry, verifier=_verifier(args.key), out=Path(args.output))
    return 0


def cmd_outdated(args) -> int:
    from gpuforge.publish import attest, outdated

    m, targets = _targets(args, all_by_default=True)
    lock = outdated.lock_path(m.path)
    if args.write_base_lock:
        print(f"wrote {lock} ({len(outdated.write_lock(targets, lock))} pulled base(s))")
        return 0
    found = outdated.upstream(targets) + outdated.bases(targets, outdated.read_lock(lock))
    if args.images:
        found += outdated.security(targets)
    if args.prod:
        verifier = attest.Verifier.from_env(args.key)
        if verifier is None:
            msg = "--prod needs a way to verify signed CVE verdicts: --key or GPUFORGE_COSIGN_PUBLIC_KEY"
            raise ConfigError(msg)
        found += outdated.prod_cve(targets, registry=args.registry, verifier=verifier)
    sys.stdout.write(outdated.report(found, as_json=args.json))
    return 0


def _verifier(key: str | None):
    from gpuforge.publish import attest

    v = attest.Verifier.from_env(key)
    if v is None:
        msg = "no way to verify the signed evidence: --key cosign.pub, GPUFORGE_COSIGN_PUBLIC_KEY, or keyless identity"
        raise ConfigError(msg)
    return v


def cmd_support(args) -> int:
    from gpuforge.publish import support

    m, targets = _targets(args, all_by_default=True)
    sys.stdout.write(support.support_cli(m, targets, fmt=args.format, registry=args.registry, verifier=_verifier(args.key)))
    return 0


def cmd_release_notes(args) -> int:
    from gpuforge.publish import support

    m, targets = _targets(args)
    sys.stdout.write(support.notes_cli(m, targets, fmt=args.format, registry=args.registry, verifier=_verifier(args.key),
                                       digest=args.digest, previous=args.previous, output=args.output,
                                       sign=args.attest, sign_key=args.sign_key))
    return 0


def cmd_clean(args) -> int:
    from gpuforge.engine import containers as run

    n = run.clean()
    print(f"removed {n} gpuforge container(s)")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gpuforge", description=__doc__)
    ap.add_argument("--matrix", default=os.environ.get("GPUFORGE_MATRIX", str(DEFAULT_MATRIX)),
                    help="path to matrix.yaml (env GPUFORGE_MATRIX)")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def add(name: str, fn, help_: str, selectors: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        if selectors:
            p.add_argument("selectors", nargs="*", help="key=value (glob values) and target-id globs; none: the default")
        p.set_defaults(fn=fn)
        return p

    p = add("plan", cmd_plan, "print the expanded targets")
    p.add_argument("--json", action="store_true", help='print {"include": [...]} for a GitHub Actions matrix')
    p.add_argument("--pools", action="store_true", help="with --json: one row per (target, fleet pool) for GPU jobs")
    p = add("generate", cmd_generate, "render images/dist/<target>/ from the templates")
    p.add_argument("--check", action="store_true", help="fail, naming the files, when generated files are stale")
    add("lock", cmd_lock, "re-resolve the images' Python package locks with uv (needs the index)", selectors=False)
    p = add("schema", cmd_schema, "write the JSON schema of matrix.yaml (for editors)", selectors=False)
    p.add_argument("--output", default="matrix.schema.json")
    p.add_argument("--check", action="store_true", help="fail when the committed schema is stale")
    p = add("build", cmd_build, "build images with BuildKit (buildx when present)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="targets built in parallel")
    p.add_argument("--keep-going", action="store_true", help="build the other targets after one fails")
    p.add_argument("--extra-ca", help="PEM bundle trusted by pip in the build, passed as a BuildKit secret (env GPUFORGE_EXTRA_CA)")
    p.add_argument("--builder", default=os.environ.get("GPUFORGE_BUILDER"), help="buildx builder (remote BuildKit)")
    p.add_argument("--cache-from", action="append", default=[], help="buildx --cache-from (repeatable)")
    p.add_argument("--cache-to", default=os.environ.get("GPUFORGE_CACHE_TO"), help="buildx --cache-to")
    p.add_argument("--docker", default=os.environ.get("GPUFORGE_DOCKER"), help="docker client to use")
    p.add_argument("--driver", choices=("auto", "buildx", "classic"), default=os.environ.get("GPUFORGE_DRIVER") or "auto",
                   help="build driver: buildx when the client has it (auto), or force one (env GPUFORGE_DRIVER)")
    p.add_argument("--no-cache", action="store_true", help="rebuild every layer (BuildKit's cache mounts still apply)")
    p.add_argument("--index-url", default=os.environ.get("GPUFORGE_INDEX_URL"), help="override the torch index (a mirror)")
    p.add_argument("--pypi-url", default=os.environ.get("GPUFORGE_PYPI_URL"), help="override the PyPI index (a mirror)")
    p.add_argument("--progress", choices=("auto", "tty", "plain"), default="auto")
    p = add("validate", cmd_validate, "run the validators against built targets")
    p.add_argument("--reports", default="reports")
    p.add_argument("--gpu", action="store_true", help="also run the GPU validators (starts containers with every GPU)")
    gpu_request_help = ("how containers ask for GPUs: nvidia (--gpus all, NVIDIA container runtime) or cdi "
                        "(--device nvidia.com/gpu=all, Docker >= 25 with CDI on); else env GPUFORGE_GPU_REQUEST, "
                        "else matrix.yaml's gpu_request, else nvidia")
    p.add_argument("--gpu-request", help=gpu_request_help)
    p.add_argument("--pytest-args", default="", help="extra pytest arguments, e.g. '-k ssh'")
    p = add("smoke", cmd_smoke, "run the driver + GPU smoke validators against HOST, or a container of --image", selectors=False)
    p.add_argument("host", nargs="?", help="docker://CONTAINER, local:// or ssh://USER@HOST (or --image)")
    p.add_argument("--image", help="start a container of this image with every GPU and check inside it")
    p.add_argument("--gpu-request", help=gpu_request_help)
    p.add_argument("--gpus", help="GPUs the runner was asked to give (a count or 'all'); the device-count check "
                   "fails when the container or host sees another number")
    p.add_argument("selectors", nargs="*", help="target whose versions are expected (default: the matrix default)")
    p.add_argument("--expect", action="append", default=[], help="KEY=VALUE expected version (overrides the target)")
    p.add_argument("--target-json", help="expected versions as JSON (e.g. /opt/gpuforge/target.json)")
    p.add_argument("--reports", default="reports")
    p.add_argument("--pytest-args", default="")
    p = add("push", cmd_push, "push built targets and record their digests")
    p.add_argument("--registry", default=os.environ.get("GPUFORGE_REGISTRY"))
    p = add("promote", cmd_promote, "promote validated digests to dev or prod")
    p.add_argument("--to", required=True, choices=("dev", "prod"))
    p.add_argument("--reports", default="reports")
    p.add_argument("--registry", default=os.environ.get("GPUFORGE_REGISTRY"))
    p.add_argument("--require-gpu", action="store_true", help="also require a GPU-validated report (default for prod)")
    p.add_argument("--key", default=os.environ.get("GPUFORGE_COSIGN_PUBLIC_KEY"),
                   help="cosign public key that signed the evidence (env GPUFORGE_COSIGN_PUBLIC_KEY; keyless: "
                        "GPUFORGE_COSIGN_IDENTITY + GPUFORGE_COSIGN_ISSUER)")
    p = add("attest", cmd_attest, "sign the green report (and inventory) onto the pushed digest with cosign")
    p.add_argument("--reports", default="reports")
    p.add_argument("--registry", default=os.environ.get("GPUFORGE_REGISTRY"))
    p.add_argument("--gpu", action="store_true", help="attest the GPU report (report-gpu.json)")
    p.add_argument("--key", default=os.environ.get("GPUFORGE_COSIGN_KEY"),
                   help="cosign private key (env GPUFORGE_COSIGN_KEY, password in COSIGN_PASSWORD); none: keyless (OIDC)")
    p = add("cve-gate", cmd_cve_gate, "judge scanner JSON (Trivy, Grype, pip-audit) against the CVE allowlist; "
            "exit 9 when red (docs/cve.md)", selectors=False)
    from gpuforge.publish.cve import DEFAULT_MAX_DB_AGE_HOURS, SEVERITIES
    p.add_argument("scans", nargs="+", help="scanner JSON reports: trivy -f json, grype -o json, pip-audit -f json")
    p.add_argument("--allowlist", default=os.environ.get("GPUFORGE_CVE_ALLOWLIST"),
                   help="YAML exceptions (global: and targets: <id>:), each with id, reason, review_by (env GPUFORGE_CVE_ALLOWLIST)")
    p.add_argument("--target", help="target id: its own allowlist entries apply, and its pushed digest is the subject")
    p.add_argument("--severity", choices=SEVERITIES, default=os.environ.get("GPUFORGE_CVE_SEVERITY", "HIGH"),
                   help="lowest severity counted (env GPUFORGE_CVE_SEVERITY; default HIGH)")
    p.add_argument("--max-db-age-hours", type=float,  # a string default goes through type=: a bad env value is exit 2
                   default=os.environ.get("GPUFORGE_CVE_MAX_DB_AGE_HOURS") or str(DEFAULT_MAX_DB_AGE_HOURS),
                   help="a database older than this fails the gate (env GPUFORGE_CVE_MAX_DB_AGE_HOURS)")
    p.add_argument("--db-metadata", help="Trivy: `trivy version -f json` output (VulnerabilityDB.UpdatedAt)")
    p.add_argument("--sbom", help="the CycloneDX SBOM scanned: every component must be in a scan that lists packages")
    p.add_argument("--output", help="write the verdict JSON here (the predicate that --attest signs)")
    p.add_argument("--attest", action="store_true", help="sign the verdict onto --target's pushed digest with cosign")
    p.add_argument("--digest", help="the digest scanned, when not this machine's push (a prod re-scan)")
    p.add_argument("--key", default=os.environ.get("GPUFORGE_COSIGN_KEY"), help="cosign private key (env GPUFORGE_COSIGN_KEY)")
    p.add_argument("--registry", default=os.environ.get("GPUFORGE_REGISTRY"))
    p = add("prod-sboms", cmd_prod_sboms, "write each prod digest's signed SBOM (for a re-scan without pulling)")
    p.add_argument("--output", required=True, help="writes OUTPUT/<target>/sbom.cdx.json and OUTPUT/<target>/digest")
    p.add_argument("--registry", default=os.environ.get("GPUFORGE_REGISTRY"))
    p.add_argument("--key", default=os.environ.get("GPUFORGE_COSIGN_PUBLIC_KEY"), help="cosign public key")
    p = add("outdated", cmd_outdated, "report what moved upstream: torch/CUDA in the compat data, base digests, "
            "security updates in built images, red prod CVE verdicts")
    p.add_argument("--json", action="store_true", help='print {"findings": [{kind, subject, detail}]}')
    p.add_argument("--images", action="store_true", help="run apt-get -s upgrade (security pocket) in each built image")
    p.add_argument("--prod", action="store_true", help="check each prod digest's newest signed CVE verdict")
    p.add_argument("--write-base-lock", action="store_true", help="record each pulled base's current digest in bases.lock")
    p.add_argument("--registry", default=os.environ.get("GPUFORGE_REGISTRY"))
    p.add_argument("--key", default=os.environ.get("GPUFORGE_COSIGN_PUBLIC_KEY"), help="cosign public key (--prod)")
    p = add("support", cmd_support, "table of prod digests x fleet pools -> signed GPU evidence (date, result)")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    p.add_argument("--registry", default=os.environ.get("GPUFORGE_REGISTRY"))
    p.add_argument("--key", default=os.environ.get("GPUFORGE_COSIGN_PUBLIC_KEY"), help="cosign public key")
    p = add("release-notes", cmd_release_notes, "release notes of a promoted digest from its signed attestations")
    p.add_argument("--format", choices=("markdown", "json"), default="markdown")
    p.add_argument("--digest", help="sha256:... (default: the prod tag's digest)")
    p.add_argument("--previous", help="the previous prod digest, for the size change")
    p.add_argument("--output", help="write <target>/release-notes.{json,md} under this folder")
    p.add_argument("--attest", action="store_true", help="sign release-notes.json onto the digest (needs --output)")
    p.add_argument("--sign-key", default=os.environ.get("GPUFORGE_COSIGN_KEY"), help="cosign private key (--attest)")
    p.add_argument("--registry", default=os.environ.get("GPUFORGE_REGISTRY"))
    p.add_argument("--key", default=os.environ.get("GPUFORGE_COSIGN_PUBLIC_KEY"), help="cosign public key")
    add("clean", cmd_clean, "remove containers left by a crashed run", selectors=False)
    return ap


def _reap() -> None:
    """Containers of gpuforge runs that died (SIGKILL, OOM) go at the next run that uses the engine."""
    from gpuforge.engine import containers as run

    try:
        n = run.reap()
    except FatalError:
        return  # no engine: the command itself reports that
    if n:
        print(f"gpuforge: removed {n} container(s) left by gpuforge runs that died", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.cmd in ("build", "validate", "clean"):
            _reap()
        return args.fn(args)
    except FatalError as e:
        print(f"gpuforge: error: {e}", file=sys.stderr)
        return e.return_code
    except KeyboardInterrupt:
        print("gpuforge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
