"""Leader election and self-fencing on an etcd lease, as a sans-IO state machine.

The machine never touches the network or a clock: the driver (`ha/leadership.py`) asks
it for the next action, performs it against etcd, and hands back the answer together
with the moment the request was *sent*. Every time comes in as an argument, so the tests
walk it through every order of answers, failures and delays with a fake clock.

    standby ── Grant ─▶ Campaign ──won──▶ active ── Renew every renew_interval ──┐
       ▲  ▲                 │lost           │  ▲                                  │
       │  └──── Watch ◀─────┘               │  └──── confirmed (lease and key) ◀──┘
       │       (until the key changes)      │ no renewal confirmed by the fence time
       │                                    ▼
       └── the key is gone or another's ── fenced ── Renew (retry) ── still ours ─▶ active

Why a router may admit: etcd counts a lease's TTL from when it *processed* the grant or
the keepalive, which is after this router sent it. So once a renewal sent at `s` is
confirmed, the lease cannot expire at etcd before `s + ttl`, and the key it carries
cannot be deleted before then; no standby can win before the key is deleted, because a
campaign creates the key only if it is absent. The router therefore admits until
`s + ttl - margin` and fences itself at that instant unless a later renewal has been
confirmed. The margin covers the difference between the two clocks' rates and the moment
between a router's check and its request reaching an engine. A lease can outlive its TTL
(etcd's new leader extends every lease after an election), which is safe: the standby
waits for etcd itself to delete the key, however late.

A fenced router does not campaign at once: it first asks (by renewing) whether it still
holds the key under the same lease. If it does, it is active again with the same
revision; if the lease is gone, or the key is someone else's, it is a standby.
A standby that cannot reach etcd is fenced too: no router can prove leadership then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["active", "standby", "fenced"]


@dataclass(frozen=True, slots=True)
class Grant:
    """Ask etcd for a new lease of `ttl_s` whole seconds."""

    ttl_s: int


@dataclass(frozen=True, slots=True)
class Campaign:
    """Create the leader key under `lease`, only if it is absent, in one transaction."""

    lease: int


@dataclass(frozen=True, slots=True)
class Renew:
    """Keep `lease` alive, then read the key: is it still ours, at `revision`?"""

    lease: int
    revision: int


@dataclass(frozen=True, slots=True)
class Watch:
    """Wait until the leader key changes after `revision`, or until `until`."""

    revision: int
    until: float


@dataclass(frozen=True, slots=True)
class Pause:
    """Nothing to do before `until` (or before the answer of a watch)."""

    until: float


Action = Grant | Campaign | Renew | Watch | Pause


@dataclass(frozen=True, slots=True)
class Timing:
    """The election's durations, in seconds; `check()` refuses what cannot be safe."""

    ttl_s: int
    renew_interval_s: float
    margin_s: float
    retry_s: float  # the first retry after a failed etcd call (doubling up to renew_interval_s)

    def check(self) -> None:
        if self.ttl_s < 1:
            raise ValueError("the lease TTL must be at least 1 s")
        if not 0 < self.margin_s < self.ttl_s:
            raise ValueError("the fencing margin must be positive and below the TTL")
        if not 0 < self.renew_interval_s < self.ttl_s - self.margin_s:
            raise ValueError("renewals must come before the fencing margin (ttl - margin)")
        if self.retry_s <= 0:
            raise ValueError("the retry delay must be positive")


class Election:
    """One router's view of the election: its role, its lease and when it must act."""

    def __init__(self, timing: Timing, now: float) -> None:
        timing.check()
        self._timing = timing
        self.role: Role = "standby"
        self.why = "campaigning for leadership"  # the reason for the current role, for logs
        self.revision: int | None = None  # the key's create revision while we hold it
        self.lease: int | None = None
        self._lease_ttl = float(timing.ttl_s)  # as etcd granted it
        # Until when the lease provably lives, less the margin (from the latest confirmed
        # send). Meaningful only while `lease` is set.
        self._valid_until = now
        self._next_at = now  # when the next etcd call is due
        self._failures = 0
        self._holder_revision: int | None = None  # the revision a lost campaign saw
        self._watched = False  # the standby has waited once since its last campaign
        self._resigned = False

    # --- what the driver reads -------------------------------------------------------------

    def admitting(self, now: float) -> bool:
        """Whether the lease is provably held at `now`: the only licence to admit."""
        return self.role == "active" and now < self._valid_until

    @property
    def fence_at(self) -> float | None:
        """When an active router fences itself unless a renewal is confirmed first."""
        return self._valid_until if self.role == "active" else None

    def next_action(self, now: float) -> Action:
        self.tick(now)
        if self._resigned:
            return Pause(until=float("inf"))
        if now < self._next_at:
            return Pause(until=self._next_at)
        if self.lease is not None and self.revision is not None:
            return Renew(self.lease, self.revision)  # active, or fenced asking if still ours
        if self.role == "standby" and self._holder_revision is not None and not self._watched:
            self._watched = True
            return Watch(self._holder_revision, until=now + self._timing.renew_interval_s)
        if self.lease is None or now >= self._valid_until:
            self.lease = None
            return Grant(self._timing.ttl_s)
        return Campaign(self.lease)

    # --- what the driver reports -------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Fence if the lease can no longer be proven held at `now`."""
        if self.role == "active" and now >= self._valid_until:
            self._become(
                "fenced",
                f"no lease renewal confirmed within {self._lease_ttl - self._timing.margin_s:g} s",
            )
            self._next_at = now  # ask at once whether the key is still ours

    def granted(self, lease: int, ttl_s: float, sent_at: float, now: float) -> None:
        if self._resigned:
            return  # an answer still in flight at shutdown changes nothing
        self._failures = 0
        self.lease = lease
        self._lease_ttl = ttl_s
        self._valid_until = sent_at + ttl_s - self._timing.margin_s
        self._next_at = now
        if self.role == "fenced":
            self._become("standby", "etcd answers again")

    def campaigned(self, won: bool, revision: int, now: float) -> None:
        """The transaction's answer. Won: `revision` is the key's create revision (the
        fencing token). Lost: the store's revision at the transaction, after which the
        standby watches the key (never older, so compaction cannot have passed it)."""
        if self._resigned:
            return
        self._failures = 0
        self._watched = False
        self._next_at = now  # won: renew at once (validity is dated from the grant)
        if won and self.lease is not None:
            self.revision = revision
            self._holder_revision = None
            if now < self._valid_until:
                self._become("active", f"won leadership at revision {revision}")
            else:  # the answer came too late to prove the lease: ask again by renewing
                self._become("fenced", "won, but too late to prove the lease still lives")
            return
        self._holder_revision = revision
        if self.role != "standby":
            self._become("standby", f"another router leads (seen at revision {revision})")

    def lease_missing(self, now: float) -> None:
        """etcd no longer knows our lease (expired or revoked) for a campaign or renewal."""
        if self._resigned:
            return
        self._failures = 0
        self.lease = None
        self._lose("the lease expired at etcd", now)

    def renewed(
        self,
        ttl_left: float,
        holder_lease: int | None,
        holder_revision: int | None,
        sent_at: float,
        now: float,
    ) -> None:
        """A keepalive's answer (`ttl_left` 0: the lease is gone) and the key as read after it."""
        if self._resigned or self.lease is None or self.revision is None:
            return  # nothing was being renewed (an answer in flight at shutdown)
        self._failures = 0
        ttl_left = min(ttl_left, self._lease_ttl)
        if ttl_left <= 0:
            self.lease = None
            self._lose("the lease expired at etcd", now)
            return
        if holder_lease != self.lease or holder_revision != self.revision:
            # Our lease lives, but the key is gone or another's: campaign with the lease.
            self._valid_until = max(self._valid_until, sent_at + ttl_left - self._timing.margin_s)
            self._lose("the leader key is no longer ours", now)
            return
        valid = sent_at + ttl_left - self._timing.margin_s
        self._valid_until = max(self._valid_until, valid)
        self._next_at = sent_at + self._timing.renew_interval_s
        if self.role != "active" and now < self._valid_until:
            self._become("active", f"still the leader at revision {self.revision}")

    def watched(self, now: float) -> None:
        """The key changed, or the wait ended: campaign again."""
        self._next_at = now

    def failed(self, error: str, now: float) -> None:
        """An etcd call failed or timed out. Retry, sooner than the next renewal."""
        self._failures += 1
        delay = min(self._timing.renew_interval_s, self._timing.retry_s * 2 ** (self._failures - 1))
        self._next_at = now + delay
        self._watched = False
        if self.role == "standby":
            self._become("fenced", f"etcd unreachable: {error}")
        # An active router stays active until its fence time: the lease still provably lives.
        self.tick(now)

    def resign(self) -> int | None:
        """Stop for good (shutdown): the lease to revoke, so a standby takes over at once."""
        lease, self.lease, self.revision = self.lease, None, None
        self._resigned = True
        if self.role == "active":
            self._become("standby", "resigned")
        return lease

    # --- internals ---------------------------------------------------------------------------

    def _lose(self, why: str, now: float) -> None:
        self.revision = None
        self._next_at = now
        self._holder_revision = None
        self._watched = False
        self._become("standby", why)

    def _become(self, role: Role, why: str) -> None:
        self.role = role
        self.why = why
