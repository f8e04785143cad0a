"""The `narwhal` command itself, as an installer checks it."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

from narwhal import DISTRIBUTION


def test_version_prints_the_installed_distributions() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "narwhal", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"narwhal {importlib.metadata.version(DISTRIBUTION)}"


def test_the_license_is_shipped_and_named_as_spdx() -> None:
    metadata = importlib.metadata.metadata(DISTRIBUTION)
    assert metadata["License-Expression"] == "Apache-2.0"
    files = importlib.metadata.files(DISTRIBUTION) or []
    assert any(path.name == "LICENSE" for path in files)
