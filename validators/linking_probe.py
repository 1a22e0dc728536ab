"""Runs inside the image (sent by test_linking.py as `python3 -c`; the image carries no copy): the facts of how the
image's binaries link, printed as one JSON line. It judges nothing: the validator holds the allowances.

- elf: every ELF file of the image under the venv's site-packages and the system folders, resolved as `ldd` resolves
  it: the loader's trace (LD_TRACE_LOADED_OBJECTS), one loader run per dynamic file instead of ldd's shell, --verify
  run and pipe (5.2 -> 0.8 s of CPU for the default image's 1,044 files, the same unresolved set); a file with no
  PT_DYNAMIC (static, or an object file) has nothing to resolve and is never handed to the loader, which would run
  it; a file of another ELF class goes to ldd itself. Files the host mounted in, such as a GPU node's driver
  libraries, are counted, not resolved. A file in
  site-packages is resolved as Python loads it: beside its own folder, torch/lib and nvidia/*/lib (torch is
  imported first and its extensions find their siblings already loaded).
- dlopen: every nvidia/*/lib/*.so* and torch/lib/*.so*, opened by path with RTLD_NOW (and, when that fails, with
  RTLD_LAZY, to tell which), each in a forked child (a library that crashes or pollutes the process takes only it).
- shadows: a file on LD_LIBRARY_PATH or LD_PRELOAD named like a GPU library of the venv (the runtime searches
  LD_LIBRARY_PATH before a library's RUNPATH, e.g. when cuDNN opens its sub-libraries); and, after `import torch`, a
  loaded library of such a name from another path.
- links: symbolic links whose target is missing, on the root filesystem, each marked when dpkg's path-exclude
  (the image leaves docs and man pages out on purpose) covers the target.
"""

import concurrent.futures
import ctypes
import fnmatch
import glob
import json
import os
import subprocess
import sys
import sysconfig

SITE = sysconfig.get_paths()["purelib"]
SYSTEM = ("/usr/bin", "/usr/sbin", "/usr/lib", "/usr/libexec", "/usr/local", "/opt")


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def elf_files():
    """(the image's ELF files, how many files the host mounted in instead): a file or folder on another device than
    the root filesystem is the host's (the driver's libraries a GPU node's container runtime mounts, e.g. all of
    /usr/local/nvidia with its graphics libraries), not the image's to resolve."""
    seen, out, host = set(), [], 0
    dev = os.stat("/").st_dev
    for root in (SITE, *SYSTEM):
        for d, dirs, names in os.walk(root):
            kept = [x for x in dirs if not os.path.islink(os.path.join(d, x))]
            dirs[:] = [x for x in kept if os.lstat(os.path.join(d, x)).st_dev == dev]
            host += sum(sum(len(f) for _, _, f in os.walk(os.path.join(d, x))) for x in kept if x not in dirs)
            for n in names:
                p = os.path.join(d, n)
                if os.path.islink(p) or not os.path.isfile(p):
                    continue
                if os.lstat(p).st_dev != dev:
                    host += 1
                    continue
                real = os.path.realpath(p)
                if real not in seen and is_elf(p):
                    seen.add(real)
                    out.append(p)
    return sorted(out), host


GPU_DIRS = [*sorted(glob.glob(f"{SITE}/nvidia/*/lib")), f"{SITE}/torch/lib"]


RTLD = "/lib64/ld-linux-x86-64.so.2"  # the x86-64 loader of ldd's RTLDLIST


def linkage(path):
    """'dynamic' (an x86-64 ELF with a PT_DYNAMIC segment, what ldd's --verify accepts), 'static' (none: nothing to
    resolve), or 'other' (another class or machine: ldd decides)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[4] != 2 or head[5] != 1 or int.from_bytes(head[18:20], "little") != 62:
                return "other"  # not ELF64, little-endian, x86-64
            if int.from_bytes(head[16:18], "little") not in (2, 3):  # ET_EXEC, ET_DYN
                return "static"
            phoff, phentsize, phnum = (int.from_bytes(head[32:40], "little"), int.from_bytes(head[54:56], "little"),
                                       int.from_bytes(head[56:58], "little"))
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return "other"
    types = {int.from_bytes(table[i:i + 4], "little") for i in range(0, len(table) - 3, phentsize or 1)}
    return "dynamic" if 2 in types else "static"  # PT_DYNAMIC


def ldd(path):
    env = dict(os.environ)
    if path.startswith(SITE + "/"):
        env["LD_LIBRARY_PATH"] = ":".join([os.path.dirname(path), *GPU_DIRS, env.get("LD_LIBRARY_PATH", "")])
    kind = linkage(path) if os.path.exists(RTLD) else "other"
    if kind == "static":
        return path, []
    argv = ["ldd", path]
    if kind == "dynamic":
        argv, env["LD_TRACE_LOADED_OBJECTS"] = [RTLD, path], "1"
    try:
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    except subprocess.TimeoutExpired:
        return path, ["(ldd timed out)"]
    missing = [ln.split("=>")[0].strip() for ln in r.stdout.splitlines() if "=> not found" in ln]
    return path, list(dict.fromkeys(missing))  # ldd names a library once per file that needs it


def opened(path, mode):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            ctypes.CDLL(path, mode=mode | os.RTLD_LOCAL)
            os._exit(0)
        except OSError as e:
            os.write(w, str(e).encode()[:800])
            os._exit(1)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 4096)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    return None if status == 0 else (b"".join(chunks).decode(errors="replace") or f"child status {status}")


def gpu_libraries():
    return sorted(glob.glob(f"{SITE}/nvidia/*/lib/*.so*") + glob.glob(f"{SITE}/torch/lib/*.so*"))


def shadows():
    ours = {}
    for p in gpu_libraries():
        ours.setdefault(os.path.basename(p), p)
    found = []
    for var in ("LD_LIBRARY_PATH", "LD_PRELOAD"):
        for entry in filter(None, os.environ.get(var, "").replace(" ", ":").split(":")):
            names = [os.path.basename(entry)] if var == "LD_PRELOAD" else (
                os.listdir(entry) if os.path.isdir(entry) else [])
            for n in names:
                p = entry if var == "LD_PRELOAD" else os.path.join(entry, n)
                if n in ours and os.path.realpath(p) != os.path.realpath(ours[n]):
                    found.append({"by": p, "of": ours[n], "via": var})
    loaded_error = None
    try:
        import torch  # noqa: F401 - what it loads is the fact
        with open("/proc/self/maps") as f:
            maps = {ln.split()[-1] for ln in f if ".so" in ln and ln.split()[-1].startswith("/")}
        for p in sorted(maps):
            n = os.path.basename(p)
            if n in ours and os.path.realpath(p) != os.path.realpath(ours[n]):
                found.append({"by": p, "of": ours[n], "via": "loaded by import torch"})
    except Exception as e:  # reported: the validator fails on it
        loaded_error = f"{type(e).__name__}: {e}"[:500]
    return found, loaded_error


def excluded_patterns():
    pats = []
    for cfg in glob.glob("/etc/dpkg/dpkg.cfg.d/*"):
        try:
            with open(cfg) as f:
                for ln in f:
                    key, _, pat = ln.strip().partition("=")
                    if key in ("path-exclude", "path-include"):
                        pats.append((key, pat))
        except OSError:
            pass
    return pats


def excluded(path, pats):
    verdict = False
    for key, pat in pats:  # dpkg: the last matching rule wins
        if fnmatch.fnmatch(path, pat):
            verdict = key == "path-exclude"
    return verdict


def broken_links():
    pats, out = excluded_patterns(), []
    dev = os.stat("/").st_dev
    for d, dirs, names in os.walk("/"):
        dirs[:] = [x for x in dirs if os.path.join(d, x) not in ("/proc", "/sys", "/dev")
                   and not os.path.islink(os.path.join(d, x)) and os.lstat(os.path.join(d, x)).st_dev == dev]
        for n in names:  # a dangling link is never a directory: os.walk lists it among the names
            p = os.path.join(d, n)
            if os.path.islink(p) and not os.path.exists(p):
                target = os.path.normpath(os.path.join(d, os.readlink(p)))
                real = os.path.realpath(p)
                out.append({"link": p, "target": os.readlink(p), "excluded": excluded(target, pats) or excluded(real, pats)})
    return out


def main(parts):
    """Only the parts asked for (argv: elf dlopen shadows links): a validator selected alone pays for its own."""
    out = {"site": SITE, "libcuda": opened("libcuda.so.1", os.RTLD_LAZY) is None}  # the host's driver, if any
    if "elf" in parts:
        files, host = elf_files()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            out["elf"] = {"count": len(files), "host_mounted": host,
                          "unresolved": [{"file": p, "missing": m} for p, m in pool.map(ldd, files) if m]}
    if "dlopen" in parts:
        libs, failed = gpu_libraries(), []
        for p in libs:  # what loads eagerly loads lazily: RTLD_LAZY is tried only to say which a failure is
            err = opened(p, os.RTLD_NOW)
            if err:
                failed.append({"file": p, "mode": "RTLD_NOW", "error": err})
                lazy = opened(p, os.RTLD_LAZY)
                if lazy:
                    failed.append({"file": p, "mode": "RTLD_LAZY", "error": lazy})
        out["dlopen"] = {"count": len(libs), "failed": failed}
    if "shadows" in parts:
        out["shadows"], out["import_error"] = shadows()
    if "links" in parts:
        out["links"] = broken_links()
    print(json.dumps(out))


if __name__ == "__main__":  # `python3 -c` in the image; imported by its unit test
    main(sys.argv[1:])
