"""Fixtures for the deploy/ checks: Prometheus's promtool.

Where promtool is missing, the tests that need it are skipped, except in CI (the `CI`
environment variable set), where it is a failure: scripts/test installs it (Debian's
`prometheus` package ships it), as it does etcd for the high-availability tests.
"""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture(scope="session")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool is not installed (Debian: apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found
