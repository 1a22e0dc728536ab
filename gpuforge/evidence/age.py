"""A signed statement's age: its signing time read one way wherever evidence is judged (promotion's time to live,
attach, reuse, status's expiry, the fleet's pools)."""

from __future__ import annotations

import datetime as dt


def epoch(iso: str | None) -> float | None:
    """`iso` as seconds since 1970 (UTC when it names no zone); None when it is missing."""
    if not iso:
        return None
    d = dt.datetime.fromisoformat(iso)
    return (d if d.tzinfo else d.replace(tzinfo=dt.UTC)).timestamp()


def signed_time(iso: str | None) -> dt.datetime | None:
    """A statement's signing time (ISO 8601, UTC when it names no zone); None when it is missing or not such a time:
    a statement signed by other means is judged or shown as of unknown age, never a traceback."""
    try:
        t = dt.datetime.fromisoformat(str(iso)) if iso else None
    except ValueError:
        return None
    return t if t is None or t.tzinfo else t.replace(tzinfo=dt.UTC)


def age_days(iso: str | None, now: dt.datetime | None = None) -> float | None:
    """Days since `iso` (signed_time); None when it has none."""
    t = signed_time(iso)
    return None if t is None else ((now or dt.datetime.now(dt.UTC)) - t).total_seconds() / 86400
