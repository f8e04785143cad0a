"""X-Request-Id: taken from the client when it is sane, otherwise generated."""

from __future__ import annotations

import itertools
import os
import re
from contextvars import ContextVar

HEADER = "X-Request-Id"
# The id of the request being handled: set by the middleware in the request's own task,
# read by handlers (aiohttp runs each request in a task of its own, with its own context).
current_request_id: ContextVar[str] = ContextVar("narwhal_request_id")
# Echoed into logs, engine requests and response ids: a short, printable token only.
_SANE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}")
# Unique without a random draw per request: a random prefix per process, then a counter.
_PREFIX = os.urandom(8).hex()
_counter = itertools.count(1)


def choose_request_id(offered: str | None) -> str:
    if offered is not None and _SANE.fullmatch(offered):
        return offered
    return f"{_PREFIX}{next(_counter):016x}"
