"""X-Request-Id: taken from the client when it is sane, otherwise generated."""

from __future__ import annotations

import os
import re

HEADER = "X-Request-Id"
# Echoed into logs, engine requests and response ids: a short, printable token only.
_SANE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}")


def choose_request_id(offered: str | None) -> str:
    if offered is not None and _SANE.fullmatch(offered):
        return offered
    return os.urandom(16).hex()
