"""The pytest plugins a validator run loads: these and no other. Every pytest the validators run under (a validate,
the GPU smoke, the collection of the required checks) starts with them, so what runs is what was collected.

An autoloaded plugin installed beside gpuforge (pytest-randomly, pytest-rerunfailures) would reorder or retry
checks, and hypothesis's alone added 0.7 s to every start (1.4 -> 0.6 s). testinfra carries `--hosts` and the host
fixture the checks stand on; pytest-timeout (the validate extra) keeps `--pytest-args "--timeout N"` working where it
is installed (the GPU machine's carried wheels may lack it: asked for by name, a missing plugin would stop the run).
"""

from __future__ import annotations

import importlib.util

PLUGIN_ARGS = ("-p", "no:cacheprovider", "-p", "testinfra.plugin",
               *(("-p", "pytest_timeout") if importlib.util.find_spec("pytest_timeout") else ()))
PLUGIN_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
