"""The image size check: a built image must be within TOLERANCE of its recorded baseline size
(gpuforge/render/data/size-baseline.json), as the engine measures it. A template change that adds
(or loses) hundreds of MB fails the build instead of slipping through; a deliberate change records a
new baseline with `python tools/size_baseline.py TARGET` (from the build record) and commits it.

Sizes are compared only on the image store the baseline was measured on: a graphdriver (overlay2) and
the containerd store count an image's size differently.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from gpuforge.errors import ConfigError

BASELINE = Path(str(resources.files("gpuforge.render") / "data" / "size-baseline.json"))
TOLERANCE = 0.05


def load(path: Path = BASELINE) -> dict[str, dict[str, Any]]:
    """target id -> {"size": bytes, "store": ..., ...}; a malformed file is one clear line."""
    try:
        doc = json.loads(path.read_text()) if path.exists() else {"targets": {}}
    except (OSError, json.JSONDecodeError) as e:
        msg = f"{path}: not readable JSON ({e})"
        raise ConfigError(msg) from None
    targets = doc.get("targets") if isinstance(doc, dict) else None
    if not isinstance(targets, dict):
        msg = f"{path}: field 'targets' must be an object of target id -> {{size, store}}"
        raise ConfigError(msg)
    for tid, entry in targets.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("size"), int) and entry["size"] > 0
                and isinstance(entry.get("store"), str)):
            msg = f"{path}: targets.{tid}: needs 'size' (a positive integer of bytes) and 'store' (a string)"
            raise ConfigError(msg)
    return targets


def problem(target_id: str, size: int, store: str, *, path: Path = BASELINE,
            tolerance: float = TOLERANCE) -> str | None:
    """Why `size` is not the baseline's (None: within tolerance, or nothing to compare with)."""
    base = load(path).get(target_id)
    if base is None or base["store"] != store or size <= 0:
        return None
    change = size / base["size"] - 1
    if abs(change) <= tolerance:
        return None
    return (f"image is {size / 1e9:.3f} GB, {change:+.1%} from the recorded baseline {base['size'] / 1e9:.3f} GB "
            f"(allowed ±{tolerance:.0%}, {path.name}); if intended, record it: python tools/size_baseline.py {target_id}")


def note(target_id: str, size: int, store: str, *, path: Path = BASELINE) -> str:
    """One line saying what the check compared (printed with every build)."""
    base = load(path).get(target_id)
    if base is None:
        return f"size check: no baseline for {target_id} (python tools/size_baseline.py {target_id} records one)"
    if base["store"] != store:
        return f"size check: baseline measured on {base['store']}, this engine stores images in {store}: not compared"
    return f"size check: {size / 1e9:.3f} GB, baseline {base['size'] / 1e9:.3f} GB ({size / base['size'] - 1:+.1%})"
