"""STAND-IN storage of the upload-artifact / download-artifact v4 stand-ins (tests/act/actions/): one folder per
artifact under $GPUFORGE_ACT_ARTIFACTS, which the workflow test makes fresh for each act run (a workflow run's
artifacts). The rules are the real actions' v4 rules that a workflow can meet; each message is the real one's gist."""

from __future__ import annotations

import glob
import os
import shutil
import sys
from pathlib import Path


def _store() -> Path:
    root = os.environ.get("GPUFORGE_ACT_ARTIFACTS", "")
    if not root or not Path(root).is_dir():
        sys.exit("::error::artifact stand-in: GPUFORGE_ACT_ARTIFACTS names no folder (the test sets it per act run)")
    return Path(root)


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def upload() -> None:
    name, work = os.environ["NAME"], Path(os.environ["GITHUB_WORKSPACE"])
    hidden = os.environ.get("HIDDEN", "false") == "true"
    dest = _store() / name
    if dest.exists():
        if os.environ.get("OVERWRITE", "false") != "true":
            sys.exit(f"::error::Failed to CreateArtifact: (409) Conflict: an artifact with this name already exists "
                     f"on the workflow run ({name})")
        shutil.rmtree(dest)
    files: list[Path] = []
    roots: list[Path] = []
    for line in filter(None, (x.strip() for x in os.environ["PATHS"].splitlines())):
        for hit in sorted(glob.glob(str(work / line), recursive=True)):
            p = Path(hit)
            roots.append(p if p.is_dir() else p.parent)
            files += [f for f in (sorted(p.rglob("*")) if p.is_dir() else [p]) if f.is_file()]
    base = Path(os.path.commonpath(roots)) if roots else work
    kept = [f for f in dict.fromkeys(files) if hidden or not _hidden(f.relative_to(base))]
    if not kept:
        how = os.environ.get("IF_NONE", "warn")
        msg = f"No files were found with the provided path: {os.environ['PATHS'].strip()}. No artifacts will be uploaded."
        if how == "error":
            sys.exit(f"::error::{msg}")
        print(f"::warning::{msg}" if how == "warn" else msg)
        return
    for f in kept:
        out = dest / f.relative_to(base)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, out)
    print(f"Artifact {name} has been successfully uploaded! Final size is {sum(f.stat().st_size for f in kept)} bytes "
          f"({len(kept)} files)")
    with open(os.environ["GITHUB_OUTPUT"], "a") as out_file:
        out_file.write(f"artifact-id={abs(hash(name)) % 10**9}\n")


def download() -> None:
    name, work = os.environ["NAME"], Path(os.environ["GITHUB_WORKSPACE"])
    if not name:
        sys.exit("::error::artifact stand-in: only downloads by name are stood in for")
    src = _store() / name
    if not src.is_dir():
        sys.exit(f"::error::Unable to download artifact(s): Artifact not found for name: {name}")
    dest = work / os.environ["DEST"] if os.environ.get("DEST") else work
    shutil.copytree(src, dest, dirs_exist_ok=True)
    print(f"Artifact download completed successfully: {name} -> {dest}")
    with open(os.environ["GITHUB_OUTPUT"], "a") as out_file:
        out_file.write(f"download-path={dest}\n")


if __name__ == "__main__":
    {"upload": upload, "download": download}[sys.argv[1]]()
