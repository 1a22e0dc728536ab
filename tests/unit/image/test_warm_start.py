"""warm_start.py's input checks (GPUFORGE_WARMUP is untrusted env): refused before torch is imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuforge import paths

PROG = paths.project_root() / "images" / "programs" / "warm_start.py"


@pytest.mark.parametrize("spec", ["os.system('id')", "mod", "mod:", ":fn", "a b:c", "mod:fn;rm", "../x:y", "mod:fn()"])
def test_bad_warmup_spec_is_refused(spec):
    r = subprocess.run([sys.executable, str(PROG), "--warmup", spec], capture_output=True, text=True, timeout=60)
    assert r.returncode == 64 and "use module:function" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("spec", ["myapp.serve:warmup", "warm_start:resnet50_bs1", "a_b.c2:_f"])
def test_good_warmup_specs(spec):
    sys.path.insert(0, str(PROG.parent))
    import warm_start

    assert warm_start.SPEC.match(spec)
