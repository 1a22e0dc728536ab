"""A build's own name in the registry: its build identifier and the version tag it is pushed under.

The build identifier is the UTC time the build was recorded, to the second (`20261206T203015Z`): every build of a
target gets its own, and they sort as they were made. The version tag is matrix.yaml's `version_template`
(default `{tag}-{build}`: `pt271-cu126-py311-debian12-runtime-wheels-20261206T203015Z`), rendered when the build
is recorded and kept in its build record; push, validate --attest and promote name the build by it. It never moves
(`push --replace` is the one, recorded, way); the target's tag and the environment tags follow builds and promotions
(docs/decisions/2026-12-06-version-tags.md).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from gpuforge import grammar

_FORMAT = "%Y%m%dT%H%M%SZ"  # grammar.BUILD_ID
_BUILD_ID_RE = re.compile(rf"{grammar.BUILD_ID}\Z")


@dataclass(frozen=True, kw_only=True, order=True)
class BuildId:
    """When a build was recorded (UTC, whole seconds); str() is the identifier a version tag carries."""

    at: dt.datetime

    @classmethod
    def at_time(cls, when: dt.datetime) -> BuildId:
        """The identifier of a build recorded at `when` (an aware time; turned to UTC, fractions dropped)."""
        if when.tzinfo is None:
            msg = "a build identifier needs an aware time (UTC)"
            raise ValueError(msg)
        return cls(at=when.astimezone(dt.UTC).replace(microsecond=0))

    @classmethod
    def parse(cls, text: str) -> BuildId:
        if not _BUILD_ID_RE.match(text):
            msg = f"{text!r} is not a build identifier (YYYYMMDDTHHMMSSZ, UTC, e.g. 20261206T203015Z)"
            raise ValueError(msg)
        try:
            return cls(at=dt.datetime.strptime(text, _FORMAT).replace(tzinfo=dt.UTC))
        except ValueError:
            msg = f"{text!r} is not a build identifier: not a date and time"
            raise ValueError(msg) from None

    def iso(self) -> str:
        """The same instant as the build record's `built_at` writes it."""
        return self.at.isoformat(timespec="seconds")

    def __str__(self) -> str:
        return self.at.strftime(_FORMAT)


# Every identifier has this length; plan-time checks render templates with it to hold tags to their limits.
SAMPLE = BuildId(at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
