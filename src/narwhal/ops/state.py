"""Whether this router admits traffic at all: shutdown, HA role, maintenance, monitoring.

Each owner sets its own reason and clears only its own: the shutdown sequence
(`shutting_down`), high availability (`standby`, `fenced`), whole-fleet maintenance
(`maintenance`) and fleet monitoring (`monitoring_degraded`). One owner clearing its
reason never hides another's. While any reason is set, every completion request is a 503
`router_unavailable` with Retry-After: 1, and /ready names the reason of the first owner
in that order.

High availability also installs a guard: a check, made on every read, that the lease is
provably held at this instant. The HA owner's reason is pushed when the election changes
role, which a blocked or paused event loop can deliver late; the guard cannot be late,
so a router that can no longer prove its lease never admits, even for the moment before
its fencing timer runs.

Each change of the resulting state is logged once with its reason, exported as
`narwhal_router_state{state}`, and announced to subscribers (the dispatcher refuses the
requests waiting in the admission queue).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final, Literal

from prometheus_client import CollectorRegistry, Gauge

Owner = Literal["shutdown", "ha", "maintenance", "monitoring"]
OWNERS: Final[tuple[Owner, ...]] = ("shutdown", "ha", "maintenance", "monitoring")
# Every value `narwhal_router_state{state}` can take, so each series exists from the start.
STATES: Final = (
    "active",
    "standby",
    "fenced",
    "maintenance",
    "monitoring_degraded",
    "shutting_down",
)
log = logging.getLogger("narwhal.state")


class RouterState:
    """One reason per owner; the router admits only while none is set (and the guard holds)."""

    def __init__(
        self, registry: CollectorRegistry | None = None, initial: dict[Owner, str] | None = None
    ) -> None:
        """`initial`: the reasons the router starts with (not logged as changes)."""
        self.revision: int | None = None  # the etcd leadership revision while active
        self._reasons: dict[Owner, str] = dict(initial or {})
        # The first owner's reason, kept current on set().
        self._current = next((self._reasons[o] for o in OWNERS if o in self._reasons), None)
        self._guard: Callable[[], bool] | None = None
        self._subscribers: list[Callable[[str | None], None]] = []
        self._gauge: Gauge | None = None
        self._revision_gauge: Gauge | None = None
        if registry is not None:
            self._gauge = Gauge(
                "narwhal_router_state",
                "1 for this router's current state (active, standby, fenced, maintenance, "
                "monitoring_degraded, shutting_down), 0 for the others",
                ["state"],
                registry=registry,
            )
            self._revision_gauge = Gauge(
                "narwhal_router_leadership_revision",
                "The etcd revision at which this router won leadership (its fencing token); "
                "0 while it does not hold it, or without high availability",
                registry=registry,
            )
            self._export()

    def unavailable_reason(self) -> str | None:
        """Why the router refuses traffic right now, or None when it admits."""
        reason = self._current
        if reason is None and self._guard is not None and not self._guard():
            return "fenced"
        return reason

    def reason(self, owner: Owner) -> str | None:
        """The reason `owner` has set, or None (whatever the other owners have set)."""
        return self._reasons.get(owner)

    def set(self, owner: Owner, reason: str | None, why: str = "") -> None:
        """Set (or, with None, clear) `owner`'s reason; `why` goes into the change's log line."""
        if self._reasons.get(owner) == reason:
            return
        if reason is None:
            del self._reasons[owner]
        else:
            self._reasons[owner] = reason
        was = self._current
        self._current = next((self._reasons[o] for o in OWNERS if o in self._reasons), None)
        if self._current == was:
            return
        before, after = was or "active", self._current or "active"
        detail = f" ({why})" if why else ""
        if self._current is None:
            log.info("router state: %s -> %s%s", before, after, detail)
        else:
            log.warning("router state: %s -> %s%s", before, after, detail)
        self._export()
        for subscriber in list(self._subscribers):
            try:
                subscriber(self._current)
            except Exception:
                log.exception("router state: subscriber raised")

    def set_guard(self, guard: Callable[[], bool]) -> None:
        """`guard()`: whether leadership is provable at this instant (HA installs it)."""
        self._guard = guard

    def set_revision(self, revision: int | None) -> None:
        self.revision = revision
        if self._revision_gauge is not None:
            self._revision_gauge.set(revision or 0)

    def subscribe(self, callback: Callable[[str | None], None]) -> None:
        """Call `callback(reason)` whenever the state changes (None: admitting again)."""
        self._subscribers.append(callback)

    def _export(self) -> None:
        if self._gauge is None:
            return
        current = self._current or "active"
        for state in STATES:
            self._gauge.labels(state).set(1 if state == current else 0)
