"""A pytest plugin (`-p skip_everything`) that skips every check for a reason no reviewer listed: the
shape of a stray `pytest.skip` or a broken fixture. A run under it is complete but not evidence."""

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    pytest.skip("skipped by a stray plugin")
