"""A recorded build run again with another exporter (push's zstd copy): the build stage owns its argv, so a caller
hands over the BuildRecord and what it wants out (an image name, a compression), never a command line.

The recorded buildx build runs again (every step from BuildKit's cache) with the image exporter in place of --load:
same Dockerfile, context, secrets and labels, so the same image config.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from gpuforge.engine import client as engine
from gpuforge.engine import retry
from gpuforge.engine.drivers import LOAD
from gpuforge.errors import StateError
from gpuforge.provenance import redact
from gpuforge.state import files
from gpuforge.state.models import BuildRecord

# The image exporter for a compressed copy pushed straight from BuildKit (OCI media types: zstd needs them).
PUSH_OUTPUT = "type=image,name={ref},push=true,compression={compression},force-compression=true,oci-mediatypes=true"


def exports(rec: BuildRecord) -> bool:
    """Whether the driver that made `rec` can run its build again with another exporter."""
    return bool(getattr(engine.DRIVERS.get(rec.driver or ""), "exports", False))


def recorded(rec: BuildRecord) -> bool:
    """Whether `rec` holds its build command (records of older gpuforge releases do not)."""
    return bool(rec.argv)


def named_builder(rec: BuildRecord) -> bool:
    """Whether the build ran on a named buildx builder (--builder), which exports with any compression."""
    return "--builder" in (rec.argv or ())


def export_argv(argv: list[str], output: str, tmp: Path) -> list[str]:
    """The recorded `argv` with the exporter `output` instead of --load (or its long form, `--output type=docker,...`,
    which a --compression-level build records), its id and metadata files under `tmp`."""
    out: list[str] = []
    it = iter(argv)
    for a in it:
        if a == "--load":
            out += ["--output", output]
        elif a == "--output":
            loaded = next(it, "")
            out += ["--output", output if loaded.split(",", 1)[0] == LOAD else loaded]
        elif a in ("--iidfile", "--metadata-file"):
            next(it, None)
            out += [a, str(tmp / a.lstrip("-"))]
        else:
            out.append(a)
    if output not in out:  # a command gpuforge did not record: running it would load, not push, the copy
        msg = "the build record's command loads its image neither by --load nor by --output type=docker: rebuild it"
        raise StateError(msg)
    return out


def push_copy(rec: BuildRecord, *, ref: str, compression: str, log: Path,
              docker_config: Path | None = None) -> tuple[int, str | None]:
    """Run the recorded build again, pushing its image to `ref` with `compression` layers; the build's output goes
    to `log` (each attempt's first line the command, credentials hidden). A push the registry answers with a 5xx
    runs again (gpuforge.engine.retry), the reason said in the log too. Returns (the last attempt's exit status, the
    manifest digest BuildKit reported for it, or None)."""
    with tempfile.TemporaryDirectory(prefix=f"gpuforge-{compression}-") as tmp:
        argv = export_argv(list(rec.argv or ()), PUSH_OUTPUT.format(ref=ref, compression=compression), Path(tmp))
        meta = Path(tmp) / "metadata-file"
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}
        if docker_config:  # buildx pushes with the docker config's credentials
            env["DOCKER_CONFIG"] = str(docker_config)
        with files.open_log(log) as f:
            for attempt in range(1, retry.ATTEMPTS + 1):
                meta.unlink(missing_ok=True)  # the digest is this attempt's, or none
                f.write(redact("+ " + " ".join(argv)) + "\n")
                f.flush()
                start = os.fstat(f.fileno()).st_size
                rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, check=False).returncode
                status = retry.transient(_tail(log, start)) if rc != 0 else None
                if status is None or attempt == retry.ATTEMPTS:
                    break
                f.write(f"# gpuforge: the registry answered {status} (attempt {attempt} of {retry.ATTEMPTS}); again\n")
                retry.again(f"{compression} push of {ref}", status, attempt)
        digest = json.loads(meta.read_text()).get("containerimage.digest") if meta.exists() and rc == 0 else None
    return rc, digest


def _tail(log: Path, start: int, lines: int = 5) -> str:
    """The last `lines` lines the attempt that began at byte `start` of `log` wrote: buildx ends a failed push with
    `ERROR: ...` naming the registry's status."""
    with open(log, "rb") as f:
        f.seek(start)
        return "\n".join(f.read().decode(errors="replace").strip().splitlines()[-lines:])
