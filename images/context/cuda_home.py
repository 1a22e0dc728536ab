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

A devel image built from wheels (--site SITE/nvidia, the nvcc and cccl wheels installed there) gets the whole
toolkit that NVIDIA's CUDA 11.8 and 12 wheels hold (both lay it out alike), each part a link into its installed wheel:

  bin/ptxas, nvvm/   the nvcc wheel's (which holds no nvcc driver, cicc or fatbinary in CUDA 11.8 or 12; kernels
                     compile at run time with NVRTC, torch's nvidia-cuda-nvrtc wheel)
  include/           every entry of every nvidia/*/include: runtime, crt, CCCL, cuBLAS, cuDNN, NCCL, NVRTC, ...
  lib64/             libX.so and libX.so.N of every nvidia/*/lib library (link with -lX, run with
                     -Wl,-rpath,CUDA_HOME/lib64), and the libcuda stub

  python3 cuda_home.py --site SITE/nvidia --out /opt/gpuforge/cuda

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


def link_entries(src: Path, dest: Path, taken: dict[str, str]) -> list[str]:
    """dest/<entry> -> src/<entry> for each header or header folder; a name two wheels ship is an error."""
    linked = []
    for entry in sorted(src.iterdir()):
        if entry.name.startswith("__") or not (entry.is_dir() or entry.suffix in (".h", ".hpp", ".cuh", ".inl")):
            continue
        if entry.name in taken:
            msg = f"{entry.name} is in both {taken[entry.name]} and {src}: which one CUDA_HOME holds would be a guess"
            raise ValueError(msg)
        taken[entry.name] = str(src)
        (dest / entry.name).symlink_to(entry)
        linked.append(entry.name)
    return linked


_SONAME = re.compile(r"^(lib[A-Za-z0-9_+-]+)\.so\.[0-9][0-9.]*$")


def link_libraries(lib: Path, dest: Path) -> list[str]:
    """lib64/libX.so (what -lX finds) and lib64/libX.so.N (what an rpath finds) -> each wheel library."""
    linked = []
    for f in sorted(lib.iterdir()):
        m = _SONAME.match(f.name)
        if not f.is_file() or not (m or (f.name.startswith("lib") and f.name.endswith(".so"))):
            continue
        for name in dict.fromkeys((f"{m.group(1)}.so" if m else f.name, f.name)):
            if not (dest / name).exists() and not (dest / name).is_symlink():
                (dest / name).symlink_to(f)
                linked.append(name)
    return linked


def devel(site: Path, out: Path) -> dict:
    """The devel CUDA_HOME of the installed nvidia/* wheels (see the module's doc)."""
    nvcc = site / "cuda_nvcc"
    for need in (nvcc / "bin" / "ptxas", nvcc / "include" / "crt" / "host_defines.h", site / "cuda_cccl" / "include",
                 site / "cuda_runtime" / "include" / "cuda_runtime_api.h"):
        if not need.exists():
            msg = f"--site {site}: no {need.relative_to(site)} (install the nvcc and cccl wheels of the image's CUDA)"
            raise ValueError(msg)
    for sub in ("include", "lib64", "bin"):
        (out / sub).mkdir(parents=True)
    taken: dict[str, str] = {}
    headers, libraries = {}, []
    for pkg in [site / "cuda_runtime", *sorted(p for p in site.iterdir() if p.name != "cuda_runtime")]:
        if (pkg / "include").is_dir():
            headers[pkg.name] = len(link_entries(pkg / "include", out / "include", taken))
        if (pkg / "lib").is_dir():
            libraries += link_libraries(pkg / "lib", out / "lib64")
    (out / "bin" / "ptxas").symlink_to(nvcc / "bin" / "ptxas")
    (out / "nvvm").symlink_to(nvcc / "nvvm")
    _, functions = libcuda_stub(out)
    return {"mode": "devel", "site": str(site), "header_entries": headers, "libraries": len(libraries),
            "bin": ["ptxas"], "libcuda_stub_functions": functions}


def size(path: Path) -> int:
    """Bytes this folder adds to the image (links count as their own few bytes, not their targets)."""
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvcc-wheel", type=Path, help="runtime: the nvidia-cuda-nvcc wheel of the image's CUDA")
    ap.add_argument("--runtime", type=Path, help="runtime: the installed nvidia/cuda_runtime folder")
    ap.add_argument("--site", type=Path, help="devel: the installed nvidia/ folder, with the nvcc and cccl wheels")
    ap.add_argument("--out", type=Path, required=True, help="the CUDA_HOME to make (must not exist)")
    args = ap.parse_args(argv)
    if args.out.exists():
        return fail(f"--out {args.out}: already exists")
    if args.site:
        if args.nvcc_wheel or args.runtime:
            return fail("--site makes a devel CUDA_HOME of installed wheels: give it without --nvcc-wheel/--runtime")
        try:
            manifest = devel(args.site, args.out)
        except (ValueError, OSError, subprocess.CalledProcessError) as e:
            return fail(str(e))
        manifest["bytes"] = size(args.out)
        (args.out / "cuda_home.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        print(f"cuda_home: {args.out}: devel, headers of {len(manifest['header_entries'])} wheels, "
              f"{manifest['libraries']} library links, ptxas and nvvm; {manifest['bytes']} bytes")
        return 0
    if not args.nvcc_wheel or not args.runtime:
        return fail("give --nvcc-wheel and --runtime (a runtime CUDA_HOME), or --site (a devel one)")
    m = WHEEL_NAME.match(args.nvcc_wheel.name)
    if not m or not args.nvcc_wheel.is_file():
        return fail(f"--nvcc-wheel {args.nvcc_wheel}: not an nvidia-cuda-nvcc wheel file")
    if not (args.runtime / "include" / "cuda_runtime_api.h").is_file():
        return fail(f"--runtime {args.runtime}: no include/cuda_runtime_api.h (not the nvidia/cuda_runtime folder)")
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
