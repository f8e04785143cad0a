"""Whether this router admits traffic at all: HA role, fencing, maintenance, shutdown.

Set by the components that know (HA, fleet monitoring, the shutdown sequence); read by the
front before admission and by /ready. A reason makes every completion request a 503
`router_unavailable` with Retry-After: 1.
"""

from __future__ import annotations


class RouterState:
    """Whether this router admits traffic at all (HA role, fencing, shutdown)."""

    def __init__(self) -> None:
        self.revision: int | None = None
        self._reason: str | None = None

    def unavailable_reason(self) -> str | None:
        return self._reason

    def set_unavailable(self, reason: str | None) -> None:
        self._reason = reason
