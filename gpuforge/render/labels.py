"""Image label names: one rule shared by rendering (which writes them) and validators (which read them)."""

from __future__ import annotations

NS = "io.gpuforge"
# Expected-version keys that are not labels (the target id has its own label, `io.gpuforge.target`).
NOT_LABELS = ("id",)


def label_key(key: str) -> str:
    """>>> label_key("size_budget_gb")
    'io.gpuforge.size-budget-gb'
    """
    return f"{NS}.{key.replace('_', '-')}"


def label_value(value: object) -> str:
    return ",".join(value) if isinstance(value, list | tuple) else str(value)


def expected_labels(expected) -> dict[str, str]:
    """The labels of a target's expected values (a gpuforge.image.expected.Expected)."""
    given = expected.as_dict()
    out = {label_key(k): label_value(v) for k, v in given.items() if k not in NOT_LABELS}
    out[f"{NS}.target"] = given["id"]
    return out
