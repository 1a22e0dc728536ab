"""Record a target's image size baseline (gpuforge/render/data/size-baseline.json) from its build
record: the size the engine reported for the image gpuforge built, and the store it was measured on.

    python tools/size_baseline.py pt271-cu126-py311-debian12-runtime-wheels

Commit the file with the change that made the image bigger or smaller (the build's size check then
compares later builds with it, within gpuforge.builder.sizecheck.TOLERANCE).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from gpuforge import options
from gpuforge.builder import sizecheck
from gpuforge.state.records import Records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="+", help="target ids with a build record")
    args = ap.parse_args(argv)
    records = Records(Path(str(options.resolve_one(options.SETTINGS["state_dir"]).value)))  # gpuforge's own resolution
    targets = sizecheck.load()
    for tid in args.targets:
        rec = records.build(tid)
        if rec is None or not rec.size or not rec.image_store:
            print(f"size_baseline: {tid}: no build record with a size and image store; build it first", file=sys.stderr)
            return 2
        targets[tid] = {"size": rec.size, "store": rec.image_store, "engine": rec.engine or "unknown",
                        "image_id": rec.image_id, "revision": rec.revision or "unknown"}
        print(f"size_baseline: {tid}: {rec.size / 1e9:.3f} GB on {rec.image_store}")
    doc = {"comment": "Image sizes (bytes, as the engine reports them) that builds are checked against; "
                      "written by tools/size_baseline.py", "targets": dict(sorted(targets.items()))}
    fd, tmp = tempfile.mkstemp(dir=sizecheck.BASELINE.parent, prefix=".size-baseline.")
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    Path(tmp).replace(sizecheck.BASELINE)  # atomic: a reader never sees half a file
    return 0


if __name__ == "__main__":
    sys.exit(main())
