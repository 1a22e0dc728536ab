"""The gpuforge command line: one argparse block and a one-line dispatch per subcommand.

Every FatalError is caught once, in main(), and printed as one line with its kind's exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rich.console import Console

from gpuforge import __version__
from gpuforge.errors import ConfigError, FatalError, exit_codes
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
        defaults = {t.id for t in m.select(None)}
        rows = [{**t.axes(), "id": t.id, "tag": t.tag, "default": t.id in defaults} for t in targets]
        print(json.dumps({"include": rows}, sort_keys=True))
        return 0
    # Plain aligned columns: never truncated (with or without a TTY), grep-able, fast for thousands of rows.
    cols = ("id", "torch", "cuda", "python", "os", "flavor", "source", "base")
    rows = [(t.id, t.variant.torch_local_version, t.cuda, t.python, t.os, t.flavor, t.source, t.base_image)
            for t in targets]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]

    def line(cells) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [f"{len(targets)} target(s) from {m.path}", line(cols), line("-" * w for w in widths), *map(line, rows)]
    sys.stdout.write("\n".join(out) + "\n")
    return 0


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
                                     gpu=args.gpu, gpu_request=gpu_request, progress_mode=args.progress)


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
                          image=args.image, gpu_request=gpu_request, gpus=args.gpus, progress_mode=args.progress)


def cmd_push(args) -> int:
    from gpuforge.publish import promote

    m, targets = _targets(args)
    promote.push_targets(targets, registry=args.registry, progress=args.progress)
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


def cmd_clean(args) -> int:
    from gpuforge.engine import containers as run

    print(run.sweep(everything=args.all).line())  # one line, on stdout: what went and what was kept
    return 0


DESCRIPTION = """\
Build PyTorch + CUDA container images from one matrix.yaml, prove each one with validators (versions,
security, SSH, Jupyter, GPU), sign the evidence with cosign and promote exactly the validated digest
from dev to prod.

The usual sequence, for the matrix default (or give selectors such as cuda=12.8 flavor=devel):
  gpuforge build                       build with BuildKit, tag only on success
  gpuforge validate                    run the validators; writes reports/<target>/report.md
  gpuforge push                        push to the matrix's registry, record the digest
  gpuforge attest --key cosign.key     sign the green report onto the pushed digest
  gpuforge promote --to dev --key cosign.pub
Run `gpuforge COMMAND --help` for a command's options; docs/ and README.md say more."""


def _epilog() -> str:
    codes = "\n".join(f"  {code:<4} {what}" for code, what in exit_codes())
    return f"exit codes (errors are one line on stderr):\n{codes}"


PROGRESS_MODES = ("auto", "tty", "plain")


def _progress_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--progress", choices=PROGRESS_MODES, default=os.environ.get("GPUFORGE_PROGRESS") or "auto",
                   help=f"how {what} progress is shown: tty (a live display), plain (one line per step, for logs), "
                        "or auto: tty when stdout is a terminal (env GPUFORGE_PROGRESS)")


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line too (exit 2), like every other error: argparse's default prints the usage first."""

    def error(self, message: str):
        cmd = self.prog.removeprefix("gpuforge").strip()
        self.exit(2, f"gpuforge: error: {cmd + ': ' if cmd else ''}{message} (see `{self.prog} --help`)\n")


def parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    ap = _Parser(prog="gpuforge", description=DESCRIPTION, epilog=_epilog(), formatter_class=fmt)
    ap.add_argument("--version", action="version", version=f"gpuforge {__version__}",
                    help="print gpuforge's version and exit")
    ap.add_argument("--matrix", default=os.environ.get("GPUFORGE_MATRIX", str(DEFAULT_MATRIX)),
                    help="path to matrix.yaml (env GPUFORGE_MATRIX)")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def add(name: str, fn, help_: str, selectors: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_, epilog=_epilog(), formatter_class=fmt)
        if selectors:
            p.add_argument("selectors", nargs="*", help="key=value (glob values) and target-id globs; none: the default")
        p.set_defaults(fn=fn)
        return p

    reports_help = "folder of the validation reports, one subfolder per target (default: reports)"
    registry_help = "registry host[:port] to use instead of matrix.yaml's registry (env GPUFORGE_REGISTRY)"
    pytest_args_help = "extra pytest arguments for the validators, e.g. '-k ssh'"
    p = add("plan", cmd_plan, "print the expanded targets")
    p.add_argument("--json", action="store_true", help='print {"include": [...]} for a GitHub Actions matrix')
    p = add("generate", cmd_generate, "render images/dist/<target>/ from the templates")
    p.add_argument("--check", action="store_true", help="fail, naming the files, when generated files are stale")
    add("lock", cmd_lock, "re-resolve the images' Python package locks with uv (needs the index)", selectors=False)
    p = add("schema", cmd_schema, "write the JSON schema of matrix.yaml (for editors)", selectors=False)
    p.add_argument("--output", default="matrix.schema.json", help="where to write the schema (default: matrix.schema.json)")
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
    _progress_option(p, "build")
    p = add("validate", cmd_validate, "run the validators against built targets")
    p.add_argument("--reports", default="reports", help=reports_help)
    p.add_argument("--gpu", action="store_true", help="also run the GPU validators (starts containers with every GPU)")
    gpu_request_help = ("how containers ask for GPUs: nvidia (--gpus all, NVIDIA container runtime) or cdi "
                        "(--device nvidia.com/gpu=all, Docker >= 25 with CDI on); else env GPUFORGE_GPU_REQUEST, "
                        "else matrix.yaml's gpu_request, else nvidia")
    p.add_argument("--gpu-request", help=gpu_request_help)
    p.add_argument("--pytest-args", default="", help=pytest_args_help)
    _progress_option(p, "validation")
    p = add("smoke", cmd_smoke, "run the driver + GPU smoke validators against HOST, or a container of --image", selectors=False)
    p.add_argument("host", nargs="?", help="docker://CONTAINER, local:// or ssh://USER@HOST (or --image)")
    p.add_argument("--image", help="start a container of this image with every GPU and check inside it")
    p.add_argument("--gpu-request", help=gpu_request_help)
    p.add_argument("--gpus", help="GPUs the runner was asked to give (a count or 'all'); the device-count check "
                   "fails when the container or host sees another number")
    p.add_argument("selectors", nargs="*", help="target whose versions are expected (default: the matrix default)")
    p.add_argument("--expect", action="append", default=[], help="KEY=VALUE expected version (overrides the target)")
    p.add_argument("--target-json", help="expected versions as JSON (e.g. /opt/gpuforge/target.json)")
    p.add_argument("--reports", default="reports", help="folder for the smoke report (written under smoke/)")
    p.add_argument("--pytest-args", default="", help=pytest_args_help)
    _progress_option(p, "smoke")
    p = add("push", cmd_push, "push built targets and record their digests")
    p.add_argument("--registry", default=os.environ.get("GPUFORGE_REGISTRY"), help=registry_help)
    _progress_option(p, "push")
    p = add("promote", cmd_promote, "promote validated digests to dev or prod")
    p.add_argument("--to", required=True, choices=("dev", "prod"),
                   help="the environment whose tags move: dev (from the build tag) or prod (from the dev tag)")
    p.add_argument("--reports", default="reports", help=reports_help)
    p.add_argument("--registry", default=os.environ.get("GPUFORGE_REGISTRY"), help=registry_help)
    p.add_argument("--require-gpu", action="store_true", help="also require a GPU-validated report (default for prod)")
    p.add_argument("--key", default=os.environ.get("GPUFORGE_COSIGN_PUBLIC_KEY"),
                   help="cosign public key that signed the evidence (env GPUFORGE_COSIGN_PUBLIC_KEY; keyless: "
                        "GPUFORGE_COSIGN_IDENTITY + GPUFORGE_COSIGN_ISSUER)")
    p = add("attest", cmd_attest, "sign the green report (and inventory) onto the pushed digest with cosign")
    p.add_argument("--reports", default="reports", help=reports_help)
    p.add_argument("--registry", default=os.environ.get("GPUFORGE_REGISTRY"), help=registry_help)
    p.add_argument("--gpu", action="store_true", help="attest the GPU report (report-gpu.json)")
    p.add_argument("--key", default=os.environ.get("GPUFORGE_COSIGN_KEY"),
                   help="cosign private key (env GPUFORGE_COSIGN_KEY, password in COSIGN_PASSWORD); none: keyless (OIDC)")
    p = add("clean", cmd_clean, "remove the containers of gpuforge runs that are gone (never a live run's)",
            selectors=False)
    p.add_argument("--all", action="store_true",
                   help="remove every gpuforge container, also those of runs still alive (stops them)")
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
        if getattr(args, "progress", "auto") not in PROGRESS_MODES:  # argparse checks a flag's value, not a default's
            msg = f"GPUFORGE_PROGRESS={args.progress!r}: not a progress mode (allowed: {', '.join(PROGRESS_MODES)})"
            raise ConfigError(msg)
        if args.cmd in ("build", "validate"):  # `clean` reaps by itself and counts it once
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
