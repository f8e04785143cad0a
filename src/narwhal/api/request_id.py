"""X-Request-Id: every request's own id, unique to it, carrying the client's id when sane.

The id goes to the engines (vLLM makes it its own request id, and the response's `id`
from it), into the router's logs and back to the client in X-Request-Id. Two clients
that send the same id (a retrying client, a constant in someone's code, or an attempt to
collide with another client's request at the engine) must still get requests that
nothing can mix up, so a client's id is only ever a prefix: `<client id>-<router id>`,
where the router's part is unique to the request. The client can still find its own id
at the start of every id the router and the engines show.
"""

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
    own = f"{_PREFIX}{next(_counter):016x}"
    if offered is not None and _SANE.fullmatch(offered):
        return f"{offered}-{own}"
    return own
