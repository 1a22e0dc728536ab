"""Make the runtime image's CUDA_HOME: the few CUDA files AOTInductor compiles and links against, no toolkit.

torch's AOTInductor builds (and, on load, rebuilds) a C++ wrapper with CUDA_HOME/include on the include path and
-L CUDA_HOME/lib64 -lcuda. A runtime image has the CUDA runtime headers in the nvidia-cuda-runtime wheel, but they
include crt/host_defines.h and friends, which CUDA ships with its compiler. So CUDA_HOME is a folder of gpuforge's:

  include/     a link to each entry of the runtime wheel's include/ (the wheel stays as pip installed it), and
  include/crt/ the crt headers, taken from the nvcc wheel of the same CUDA release (its compiler is not kept)
  lib64/       libcudart.so -> the runtime wheel's libcudart.so.<major>, and libcuda.so: a link-time stub of the
               driver API with the driver library's soname (libcuda.so.1), as the toolkit's lib64/stubs has; the
               driver's own libcuda.so.1, which the GPU node mounts, is what loads at run time
  cuda_home.json  where each part came from and the bytes it costs

  python3 cuda_home.py --nvcc-wheel WHEEL --runtime SITE/nvidia/cuda_runtime --out /opt/gpuforge/cuda

Stdlib only (it runs in the image build with the venv's Python). Bad input: one line, exit 64.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

CRT = "nvidia/cuda_nvcc/include/crt/"
WHEEL_NAME = re.compile(r"^(nvidia_cuda_nvcc_cu\d+)-([0-9][0-9.]*)-")


def fail(msg: str) -> int:
    print(f"cuda_home: error: {msg}", file=sys.stderr)
    return 64


def link_runtime(runtime: Path, out: Path) -> list[str]:
    """include/<entry> -> the runtime wheel's, for every header and header folder; lib64/libcudart.so."""
    (out / "include").mkdir(parents=True, exist_ok=True)
    (out / "lib64").mkdir(parents=True, exist_ok=True)
    linked = []
    for entry in sorted((runtime / "include").iterdir()):
        if entry.name.startswith("__") or not (entry.is_dir() or entry.suffix in (".h", ".hpp")):
            continue  # __init__.py, __pycache__: the wheel's packaging, not headers
        (out / "include" / entry.name).symlink_to(entry)
        linked.append(entry.name)
    [cudart] = sorted((runtime / "lib").glob("libcudart.so.*")) or [None]
    if cudart is None:
        msg = f"{runtime}/lib has no libcudart.so.<major>"
        raise ValueError(msg)
    (out / "lib64" / "libcudart.so").symlink_to(cudart)
    return linked


def extract_crt(wheel: Path, out: Path) -> list[str]:
    """The crt/ headers of the nvcc wheel, and nothing else of it."""
    names = []
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if not info.filename.startswith(CRT) or info.is_dir():
                continue
            rel = info.filename[len(CRT):]
            if "/" in rel or rel.startswith(".") or not rel.endswith((".h", ".hpp")):
                continue  # only plain header names: a wheel cannot write outside crt/
            dest = out / "include" / "crt" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(z.read(info))
            names.append(rel)
    if "host_defines.h" not in names:
        msg = f"{wheel.name} holds no {CRT}host_defines.h: not the CUDA compiler's wheel"
        raise ValueError(msg)
    return names


def driver_api_names(include: Path, cc: str = "gcc") -> list[str]:
    """Every driver API function cuda.h declares, by the name a caller links to (cuda.h's macros map many to their
    _v2/_v3 symbols, so the header is preprocessed first)."""
    r = subprocess.run([cc, "-E", "-P", "-I", str(include), str(include / "cuda.h")], capture_output=True, text=True,
                       check=True)
    names = sorted(set(re.findall(r"\b(cu[A-Z][A-Za-z0-9_]*)\s*\(", r.stdout)))
    if "cuModuleLoad" not in names or "cuLaunchKernel" not in names:
        msg = f"{include}/cuda.h declares no cuModuleLoad/cuLaunchKernel: not CUDA's driver API header"
        raise ValueError(msg)
    return names


def libcuda_stub(out: Path, cc: str = "gcc") -> tuple[Path, int]:
    """A link-time libcuda.so with the driver's soname, defining each driver API function (each returns 34,
    CUDA_ERROR_STUB_LIBRARY, as NVIDIA's stubs do): the linker then resolves the wrapper's calls, records NEEDED
    libcuda.so.1 (also under --as-needed), and the node's driver is what loads. Its file name is libcuda.so, never
    the soname, so the dynamic loader never picks it."""
    names = driver_api_names(out / "include", cc)
    src = out / "lib64" / "libcuda_stub.c"
    src.write_text("".join(f"int {n}(void) {{ return 34; }}\n" for n in names))
    stub = out / "lib64" / "libcuda.so"
    try:
        subprocess.run([cc, "-shared", "-fPIC", "-nostdlib", "-Wl,-soname,libcuda.so.1", "-o", str(stub), str(src)],
                       check=True)
    finally:
        src.unlink()
    return stub, len(names)


def size(path: Path) -> int:
    """Bytes this folder adds to the image (links count as their own few bytes, not their targets)."""
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvcc-wheel", type=Path, required=True, help="the nvidia-cuda-nvcc wheel of the image's CUDA")
    ap.add_argument("--runtime", type=Path, required=True, help="the installed nvidia/cuda_runtime folder")
    ap.add_argument("--out", type=Path, required=True, help="the CUDA_HOME to make (must not exist)")
    args = ap.parse_args(argv)
    m = WHEEL_NAME.match(args.nvcc_wheel.name)
    if not m or not args.nvcc_wheel.is_file():
        return fail(f"--nvcc-wheel {args.nvcc_wheel}: not an nvidia-cuda-nvcc wheel file")
    if not (args.runtime / "include" / "cuda_runtime_api.h").is_file():
        return fail(f"--runtime {args.runtime}: no include/cuda_runtime_api.h (not the nvidia/cuda_runtime folder)")
    if args.out.exists():
        return fail(f"--out {args.out}: already exists")
    try:
        linked = link_runtime(args.runtime, args.out)
        crt = extract_crt(args.nvcc_wheel, args.out)
        _, functions = libcuda_stub(args.out)
    except (ValueError, OSError, subprocess.CalledProcessError, zipfile.BadZipFile) as e:
        return fail(str(e))
    manifest = {"runtime": str(args.runtime), "runtime_entries": len(linked),
                "crt_from": f"{m.group(1).replace('_', '-')}=={m.group(2)}", "crt_headers": sorted(crt),
                "libcuda_stub_functions": functions, "bytes": size(args.out)}
    (args.out / "cuda_home.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(f"cuda_home: {args.out}: {len(linked)} runtime entries linked, {len(crt)} crt headers from "
          f"{manifest['crt_from']}, libcuda stub of {functions} functions; {manifest['bytes']} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
