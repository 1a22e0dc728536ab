"""Matrix benchmark (`nox -s bench_matrix`): hostile matrices and a 2,000-target plan, with budgets.

1. Every case of tests/unit/plan/hostile_cases.py, each in a fresh process: time of `gpuforge plan` (imports
   excluded) and peak RSS. Budgets: every case under 2 s and 200 MB, the alias bomb refused
   in under 1 s. `--old` runs the same table against the code before the hostile-matrix fixes (commit d32d7c3).
2. `gpuforge plan` (table and --json) of a 2,000-target matrix, today's code side by side with d32d7c3's.
   Real compat data has ~70 valid combinations, so the run extends it with synthetic torch releases
   (copies of 2.7.1 named 9.N.0) in both processes alike.

Not a test (CI machines are noisy): it prints numbers and exits 1 when a budget is exceeded.
Repository maintenance: run from the checkout (`python tools/bench_matrix.py [--old] [--cases ID,...]`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "unit" / "plan"))
from hostile_cases import CASES  # noqa: E402 - the table lives with its test

OLD_COMMIT = "d32d7c3"
CASE_S, CASE_MB, BOMB_S = 2.0, 200.0, 1.0
TIMEOUT_S = 20  # the old code's alias bomb runs for minutes; cut it off
MEM_LIMIT = 2 << 30  # and out of memory, rather than the machine's

# Runs in the child: optionally widen the compat data, run main(), report time and peak RSS as JSON on $BENCH_FD.
DRIVER = r"""
import json, os, resource, sys, time
out = os.fdopen(int(os.environ["BENCH_FD"]), "w")
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[3]), int(sys.argv[3])))
import yaml
from gpuforge.image import compat
from gpuforge.cli import main
if sys.argv[2] != "-":
    data = yaml.safe_load(open(sys.argv[2]))
    for i in range(int(os.environ["BENCH_RELEASES"])):
        data["torch"][f"9.{i}.0"] = data["torch"]["2.7.1"]
    compat.data = lambda: data
def hwm_mb():  # this process's own peak RSS (ru_maxrss would start from the parent's at fork)
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]) / 1024
rss0 = hwm_mb()
t0 = time.perf_counter()
try:
    rc = main(["--matrix", sys.argv[1], "plan", *sys.argv[4:]])
except BaseException as e:
    rc = f"{type(e).__name__}"
dt = time.perf_counter() - t0
json.dump({"rc": rc, "s": dt, "peak_mb": hwm_mb(), "import_mb": rss0, "module": compat.__file__}, out)
"""


def run(matrix: Path, *, old: Path | None, compat_data: str = "-", releases: int = 0, args: tuple = ()) -> dict:
    env = {**os.environ, "BENCH_RELEASES": str(releases)}
    if old:
        env["PYTHONPATH"] = str(old)  # ahead of the editable install of today's tree
    r, w = os.pipe()
    env["BENCH_FD"] = str(w)
    try:
        p = subprocess.run([sys.executable, "-c", DRIVER, str(matrix), compat_data, str(MEM_LIMIT), *args],
                           env=env, cwd=matrix.parent, pass_fds=(w,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=TIMEOUT_S, text=True)
    except subprocess.TimeoutExpired:
        return {"rc": "timeout", "s": float(TIMEOUT_S), "peak_mb": float("nan"), "stderr": ""}
    finally:
        os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    if not text:  # killed (memory limit) before reporting
        return {"rc": f"died ({p.returncode})", "s": float("nan"), "peak_mb": float("nan"), "stderr": p.stderr[-200:]}
    return {**json.loads(text), "stderr": p.stderr}


def old_tree(dest: Path) -> Path:
    """The gpuforge package as of d32d7c3, importable from dest."""
    dest.mkdir(parents=True, exist_ok=True)
    tar = subprocess.run(["git", "archive", OLD_COMMIT, "gpuforge"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    return dest


def write_case(case, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "matrix.yaml"
    path.write_bytes(case.text if isinstance(case.text, bytes) else case.text.encode())
    for name, text in case.files.items():
        (folder / name).write_text(text)
    return path


def bench_cases(tmp: Path, old: Path | None, only: set[str]) -> bool:
    ok = True
    head = f"{'case':34} {'rc':>4} {'time s':>7} {'peak MB':>8}"
    print(f"\n== hostile matrices: `gpuforge plan`, one process each (budget {CASE_S} s, {CASE_MB:.0f} MB; alias bomb {BOMB_S} s)")
    print(head + (f"  | {'old rc':>12} {'old s':>7} {'old MB':>8}" if old else ""))
    for case in CASES:
        if only and case.id not in only:
            continue
        path = write_case(case, tmp / case.id)
        new = run(path, old=None)
        limit = BOMB_S if case.id == "alias-bomb" else CASE_S
        over = new["rc"] != 2 or new["s"] > limit or new["peak_mb"] > CASE_MB
        ok &= not over
        line = f"{case.id:34} {new['rc']!s:>4} {new['s']:7.3f} {new['peak_mb']:8.1f}"
        if old:
            o = run(path, old=old)
            line += f"  | {o['rc']!s:>12} {o['s']:7.3f} {o['peak_mb']:8.1f}"
        print(line + ("  OVER BUDGET" if over else ""))
    if not only:  # the other side of the size limit: the largest file accepted still plans in time
        r = run(largest_accepted(tmp / "largest"), old=None)
        over = r["rc"] != 0 or r["s"] > CASE_S or r["peak_mb"] > CASE_MB
        ok &= not over
        print(f"{'(valid) 1 MiB of apt packages':34} {r['rc']!s:>4} {r['s']:7.3f} {r['peak_mb']:8.1f}" + ("  OVER BUDGET" if over else ""))
    return ok


def largest_accepted(folder: Path) -> Path:
    """A valid matrix just under the loader's size limit: 1 MiB of apt package names to check."""
    from hostile_cases import BASE

    from gpuforge.plan.yamlpos import MAX_BYTES

    head, tail = BASE.split("  apt_packages: [vim]\n")
    names, size, i = [], len(BASE) + 40, 0
    while size + len(f"pkg{i}, ") < MAX_BYTES:
        names.append(f"pkg{i}")
        size += len(names[-1]) + 2
        i += 1
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "matrix.yaml"
    path.write_text(f"{head}  apt_packages: [{', '.join(names)}]\n{tail}")
    return path


def fleet_matrix(releases: int) -> str:
    torch = ", ".join(['"2.7.1"', *(f'"9.{i}.0"' for i in range(releases))])
    return f"""\
registry: 127.0.0.1:5000
repository: gpuforge/pytorch
defaults:
  aliases:
    dev: ["{{torch}}-{{cuda_tag}}-{{os}}-{{flavor}}-{{source}}-dev"]
    prod: ["{{torch}}-{{cuda_tag}}-{{os}}-{{flavor}}-{{source}}"]
matrix:
  torch: [{torch}]
  cuda: ["12.6", "12.8"]
  python: ["3.12"]
  os: [ubuntu24.04]
  flavor: [runtime, devel]
  source: [cuda-base, wheels]
overrides:
  - select: "flavor=devel"
    size_budget_gb: 22
default: ["torch=2.7.1 cuda=12.6 flavor=runtime source=wheels"]
"""


def bench_fleet(tmp: Path, old: Path) -> bool:
    releases = 249  # (1 + 249) torch x 2 cuda x 2 flavor x 2 source = 2,000 targets
    path = tmp / "fleet" / "matrix.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(fleet_matrix(releases))
    data = str(ROOT / "gpuforge" / "image" / "data" / "compat.yaml")
    print("\n== `gpuforge plan` of a 2,000-target matrix (stdout not a TTY), best of 3")
    print(f"{'command':18} {'today s':>8} {'d32d7c3 s':>10} {'ratio':>6} {'today MB':>9} {'d32d7c3 MB':>11}")
    ok = True
    for args in ((), ("--json",)):
        new = min((run(path, old=None, compat_data=data, releases=releases, args=args) for _ in range(3)), key=lambda r: r["s"])
        was = min((run(path, old=old, compat_data=data, releases=releases, args=args) for _ in range(3)), key=lambda r: r["s"])
        for r, who in ((new, "today"), (was, "d32d7c3")):
            if r["rc"] != 0:
                print(f"  {who} failed: rc {r['rc']}: {r['stderr'][-300:]}")
        assert str(old) not in new.get("module", "") and str(old) in was.get("module", str(old)), "wrong trees compared"
        ok &= new["rc"] == 0 and new["s"] < CASE_S
        name = " ".join(["plan", *args])
        print(f"{name:18} {new['s']:8.3f} {was['s']:10.3f} {was['s'] / new['s']:5.1f}x {new['peak_mb']:9.1f} {was['peak_mb']:11.1f}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", action="store_true", help=f"also run the hostile table against {OLD_COMMIT}")
    ap.add_argument("--cases", default="", help="comma-separated case ids (default: all)")
    ap.add_argument("--no-fleet", action="store_true", help="skip the 2,000-target plan")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuforge-bench-matrix-") as d:
        tmp = Path(d)
        old = old_tree(tmp / "old")
        ok = bench_cases(tmp / "cases", old if a.old else None, set(filter(None, a.cases.split(","))))
        if not a.no_fleet:
            ok &= bench_fleet(tmp, old)
    print("\nbench_matrix: every budget met" if ok else "\nbench_matrix: OVER BUDGET (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
