"""A push through the engine (its push, or its BuildKit exporting to a registry) that the registry answers with a 5xx
is pushed again, at most ATTEMPTS times in all, saying so.

Why: a 5xx is the registry's own trouble, often passing. Debian's docker-registry (distribution 2.8) writes a tag's
link file in place (truncate, then write), and BuildKit's pusher HEADs and PUTs one tag for each manifest of an index
it pushes, side by side: a HEAD that lands between the truncate and the write reads an empty link and is answered
500 (seen in CI as `unexpected status from HEAD request to .../manifests/<tag>-zstd: 500 Internal Server Error`).
Pushing again is cheap and safe: blobs already there are skipped, and a tag write is idempotent. Clients people use
do the same (go-containerregistry retries 500, 502, 503 and 504; skopeo has --retry-times). A 4xx (auth, a refused
or unknown name) is never retried: it would only fail again."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from gpuforge.errors import RegistryError

T = TypeVar("T")

ATTEMPTS = 3
PAUSE_S = 2.0  # before the 2nd attempt; doubled before each next one

# the status line as BuildKit, containerd, the engine's push stream and skopeo print it
_TRANSIENT = re.compile(r"\b(500 Internal Server Error|502 Bad Gateway|503 Service Unavailable|504 Gateway Time-?out)\b",
                        re.IGNORECASE)


def transient(text: str) -> str | None:
    """The registry's 5xx status named in `text` (an error line, a log's tail), or None: retry only then."""
    m = _TRANSIENT.search(text)
    return m.group(1) if m else None


def again(what: str, status: str, attempt: int) -> None:
    """Say that `what` is tried again after the registry answered `status` on `attempt`, and wait before it."""
    pause = PAUSE_S * 2 ** (attempt - 1)
    print(f"gpuforge: the registry answered {status} to the {what} (attempt {attempt} of {ATTEMPTS}); "
          f"pushing again in {pause:.0f} s", file=sys.stderr, flush=True)
    time.sleep(pause)


def pushed(push: Callable[[], T], what: str) -> T:
    """`push()` again while it fails with a RegistryError naming a 5xx, at most ATTEMPTS calls in all."""
    for attempt in range(1, ATTEMPTS):
        try:
            return push()
        except RegistryError as e:
            status = transient(str(e))
            if status is None:
                raise
            again(what, status, attempt)
    return push()
