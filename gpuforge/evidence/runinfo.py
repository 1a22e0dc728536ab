"""Who is signing: this run's id, the checkout's git revision, the host. Written into every statement
gpuforge signs (validation runs, promotion records) so status and history can say where a decision came from."""

from __future__ import annotations

import functools
import getpass
import socket

from gpuforge import __version__, paths
from gpuforge.engine import containers
from gpuforge.errors import ConfigError
from gpuforge.state.promotions import RunInfo


@functools.cache
def _git() -> tuple[str | None, bool | None]:
    try:
        return paths.checkout_revision()
    except ConfigError:  # no checkout here (an installed gpuforge run elsewhere): nothing to name
        return None, None


def current() -> RunInfo:
    rev, dirty = _git()
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = ""
    return RunInfo(id=containers.run_id(), git_revision=rev, git_dirty=dirty, gpuforge_version=__version__,
                   host=socket.gethostname(), user=user)
