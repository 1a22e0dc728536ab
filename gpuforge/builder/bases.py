"""Base images: bootstrapped from a Debian mirror (debootstrap -> docker import), or pulled.

A bootstrapped base is built once and reused while its recipe (suite, mirrors, variant, rootfs shape) is
unchanged: the recipe's hash is in the tag and in a label, checked before reuse. Its apt sources name the suite,
`<suite>-updates` and `<suite>-security` (aptstate.debian_suites), whose updates each image's system layer applies.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker.errors

from gpuforge.builder import aptstate
from gpuforge.engine import client as engine
from gpuforge.errors import EngineError
from gpuforge.plan.target import ImageRef, Target

RECIPE_LABEL = "io.gpuforge.base-recipe"


def recipe_hash(boot: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(boot, sort_keys=True).encode()).hexdigest()


def apt_sources(boot: dict[str, Any]) -> str:
    """/etc/apt/sources.list of a bootstrapped base (debootstrap writes the suite alone)."""
    suites = aptstate.debian_suites(boot["suite"], boot["mirror"], boot["security_mirror"])
    return "".join(f"{s.source_line()}\n" for s in suites)


# What no one runs in a container (matrix.BOOTSTRAP_ROOTFS 2): docs, man pages, translations. Copyright
# files stay (the licences of what the image ships). The same rule, as dpkg path-excludes, is written into
# the image by the Dockerfile's apt step, so packages installed later skip them too.
SLIM_DIRS = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale")
SLIM_KEEP = ("copyright", "locale.alias")


def slim_rootfs(root: Path) -> None:
    for d in SLIM_DIRS:
        for p in sorted((root / d).rglob("*"), reverse=True):  # files first, then emptied folders
            if p.is_symlink() or p.is_file():
                if p.name not in SLIM_KEEP:
                    p.unlink()
            elif p.is_dir() and not any(p.iterdir()):
                p.rmdir()


Log = Callable[[str], object]  # where progress lines go (print by default)


def _image_id(img: Any) -> str:
    iid: str = img.id  # a docker-py Image (untyped): its id is a str
    return iid


def ensure_base(t: Target, log: Log = print) -> str:
    """Make sure the target's FROM image is in the engine; returns its image id."""
    if t.bootstrap:
        return _ensure_bootstrapped(t.base_image, t.bootstrap, log)
    return _ensure_pulled(t.base_image, log)


def _ensure_pulled(ref: str, log: Log) -> str:
    c = engine.client()
    try:
        img = c.images.get(ref)
        log(f"base {ref}: present ({img.id[:19]})")
        return _image_id(img)
    except docker.errors.ImageNotFound:
        pass
    log(f"base {ref}: pulling")
    try:
        img = c.images.pull(ref)
    except docker.errors.APIError as e:
        msg = (f"cannot pull base image {ref}: {e.explanation or e} "
               "(is the registry reachable? mirror it and point the matrix's bases/cuda_base_image there)")
        raise EngineError(msg) from None
    return _image_id(img)


def _ensure_bootstrapped(tag: str, boot: dict[str, Any], log: Log) -> str:
    c = engine.client()
    want = recipe_hash(boot)
    try:
        img = c.images.get(tag)
        if (img.labels or {}).get(RECIPE_LABEL) == want:
            log(f"base {tag}: reused (recipe {want[:12]})")
            return _image_id(img)
        log(f"base {tag}: recipe changed, rebuilding")
    except docker.errors.ImageNotFound:
        pass
    if not shutil.which("debootstrap"):
        msg = "bootstrapped bases need debootstrap (Debian: apt-get install debootstrap)"
        raise EngineError(msg)
    with tempfile.TemporaryDirectory(prefix="gpuforge-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        argv = ["debootstrap", f"--variant={boot['variant']}", boot["suite"], str(root), boot["mirror"]]
        engine.echo_cmd(argv)
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
            msg = f"debootstrap of {boot['suite']} from {boot['mirror']} failed: {' | '.join(tail)}"
            raise EngineError(msg)
        # Package lists and the download cache are rebuilt by every image's apt step; keep them out.
        for junk in ("var/lib/apt/lists", "var/cache/apt/archives"):
            for p in (root / junk).glob("*"):
                if p.is_file():
                    p.unlink()
        (root / "etc/apt/sources.list").write_text(apt_sources(boot))
        slim_rootfs(root)
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None  # stdout=PIPE: always set (narrows the Optional for the checker)
        try:
            c.api.import_image_from_data(
                tar.stdout, repository=ImageRef.parse(tag).name, tag=ImageRef.parse(tag).tag,
                changes=[f"LABEL {RECIPE_LABEL}={want}", 'CMD ["/bin/bash"]'],
            )
        finally:
            tar.stdout.close()
            tar.wait()
    img = c.images.get(tag)
    log(f"base {tag}: bootstrapped ({img.id[:19]})")
    return _image_id(img)
