"""Running the election against etcd: the I/O half of high availability.

One task asks the `Election` for its next action, performs it through the `EtcdClient`,
and reports the answer with the moment the request was sent. After every step the role is
published to the `RouterState` (owner "ha"): `standby` and `fenced` refuse traffic, and
`active` carries the revision at which this router won. A timer at the fence time fences
the router even while an etcd call hangs, and the state's guard asks the election itself
on every admission check, so a late timer cannot let a request through either.

On winning, the operator state (drains, maintenance waves) is read from etcd before the
router calls itself active; while active it is read again at every renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Protocol

from narwhal.ha.election import Campaign, Election, Grant, Pause, Renew, Timing, Watch
from narwhal.ha.etcd import EtcdClient, EtcdError, EtcdUnavailable, LeaseNotFound
from narwhal.ops.state import RouterState

log = logging.getLogger("narwhal.ha")
_RESIGN_TIMEOUT_S = 1.0


class ReplicatedState(Protocol):
    """What the fleet's routers keep in etcd beside the lease, read back on winning and at
    every renewal (the operator's drains and waves: `narwhal.ops.operator_state`). High
    availability sits under operations: it asks for a reload, never for what is in it."""

    async def load(self) -> None: ...


class Leadership:
    def __init__(
        self,
        client: EtcdClient,
        timing: Timing,
        key: str,
        identity: str,
        state: RouterState,
        operator: ReplicatedState,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._timing = timing
        self._key = key
        self._value = json.dumps({"router": identity}).encode()
        self._state = state
        self._operator = operator
        self._clock = clock
        self.election = Election(timing, clock())
        self._task: asyncio.Task[None] | None = None
        self._fence_timer: asyncio.TimerHandle | None = None
        self._fenced_at: float | None = None  # when the armed timer fires
        self._granted_ttl_warned = False
        election = self.election
        state.set_guard(lambda: election.admitting(clock()))
        self._publish()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="narwhal-ha")

    async def resign(self) -> None:
        """Stop campaigning and revoke the lease (deleting the key), so a standby takes
        over at once instead of after the TTL. Best effort: the lease expires anyway."""
        await self._stop_task()
        lease = self.election.resign()
        self._publish()
        if lease is None:
            return
        with contextlib.suppress(EtcdUnavailable, EtcdError):
            async with asyncio.timeout(_RESIGN_TIMEOUT_S):
                await self._client.revoke(lease)
            log.info("ha: resigned leadership (lease revoked)")

    async def _stop_task(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task  # the fence timer goes at the next _publish(): no task, no timer

    async def _run(self) -> None:
        election, clock = self.election, self._clock
        while True:
            action = election.next_action(clock())
            self._publish()
            try:
                if isinstance(action, Pause):
                    await asyncio.sleep(max(0.0, action.until - clock()))
                elif isinstance(action, Grant):
                    sent = clock()
                    lease, ttl = await self._client.grant(action.ttl_s)
                    self._check_granted(ttl)
                    election.granted(lease, float(ttl), sent, clock())
                elif isinstance(action, Campaign):
                    await self._campaign(action.lease)
                elif isinstance(action, Renew):
                    await self._renew(action)
                elif isinstance(action, Watch):
                    await self._client.watch(
                        self._key, action.revision, max(0.0, action.until - clock())
                    )
                    election.watched(clock())
            except LeaseNotFound:
                election.lease_missing(clock())
            except (EtcdUnavailable, EtcdError) as e:
                election.failed(str(e), clock())
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug: keep the election alive, fenced if need be
                log.exception("ha: election step %s raised", type(action).__name__)
                election.failed(repr(e), clock())
            self._publish()

    async def _campaign(self, lease: int) -> None:
        result = await self._client.create_if_absent(self._key, self._value, lease)
        holder = result.holder
        # Ours already (an earlier answer was lost, or loading the operator state failed):
        # the transaction is not repeated, the win is.
        won = result.won or (holder is not None and holder.lease == lease)
        if won and holder is not None:
            await self._operator.load()  # before serving: drain what the last leader drained
            self.election.campaigned(True, holder.create_revision, self._clock())
            return
        self.election.campaigned(False, result.revision, self._clock())

    async def _renew(self, action: Renew) -> None:
        sent = self._clock()
        ttl = await self._client.keepalive(action.lease)
        holder = await self._client.get(self._key) if ttl > 0 else None
        self.election.renewed(
            float(ttl),
            None if holder is None else holder.lease,
            None if holder is None else holder.create_revision,
            sent,
            self._clock(),
        )
        if self.election.role == "active":
            await self._operator.load()

    def _check_granted(self, ttl: int) -> None:
        if ttl != self._timing.ttl_s and not self._granted_ttl_warned:
            self._granted_ttl_warned = True
            log.warning(
                "ha: etcd granted a lease of %d s for the %d s asked (its minimum TTL "
                "follows its election timeout); fencing follows the granted TTL",
                ttl,
                self._timing.ttl_s,
            )

    def _publish(self) -> None:
        election, state = self.election, self._state
        if election.role == "active":
            state.set_revision(election.revision)
            state.set("ha", None, election.why)
        else:
            state.set("ha", election.role, election.why)
            state.set_revision(None)
        self._arm_fence_timer()

    def _arm_fence_timer(self) -> None:
        """One timer at the current fence time, re-armed only when that time moves."""
        fence_at = self.election.fence_at if self._task is not None else None
        if fence_at == self._fenced_at:
            return
        if self._fence_timer is not None:
            self._fence_timer.cancel()
            self._fence_timer = None
        self._fenced_at = fence_at
        if fence_at is not None:
            delay = max(0.0, fence_at - self._clock())
            self._fence_timer = asyncio.get_running_loop().call_later(delay, self._fence)

    def _fence(self) -> None:
        self._fence_timer = None
        self._fenced_at = None
        self.election.tick(self._clock())
        self._publish()
