"""The container image builds and serves: scripts/container_smoke.sh, which builds a local
Debian base with debootstrap, the image on it with buildah, and curls `narwhal serve`
started inside. It needs root, buildah and debootstrap, and minutes the first time, so it
runs only when asked: NARWHAL_CONTAINER_SMOKE=1."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "container_smoke.sh"


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.skipif(
    os.environ.get("NARWHAL_CONTAINER_SMOKE") != "1",
    reason="builds a container image; set NARWHAL_CONTAINER_SMOKE=1 to run it",
)
def test_the_image_builds_and_serves_health_ready_and_a_completion() -> None:
    result = subprocess.run(
        [str(SCRIPT)], capture_output=True, text=True, timeout=2300, check=False
    )
    print(result.stdout)  # each step's time and the image's size (pytest -rP shows them)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "container smoke: passed" in result.stdout
