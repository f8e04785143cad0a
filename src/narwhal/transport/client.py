"""A relay worker's side: the decision process's core, as an `AsyncDecisionCore`.

A request's own calls (`offer`, `counted`, `failed`) are one frame each, answered by
call number; events go without an answer; wakeups and the fleet view come when the
decision process sends them (`on_wakeups`: the gate's `wake`). So a request costs its
worker one round trip to be admitted, and its events cost none.

A worker never admits on its own. Until it has the decision process's first view, and
whenever the connection is down, `readiness()` says `decision_unreachable` (the 503 the
attempt runner answers), a call answers `Refused` with that 503, and `on_lost()` is told
so that the requests waiting in the queue get it too; the client reconnects with
backoff meanwhile. Connected, every offer is the decision process's to refuse: its state
is read there first, so a worker never refuses on a view a moment old. Streams already
placed keep running: they need nothing from here, and what they report while the link
is down is dropped, since the decision process that would take it has released them
already (a restarted one starts empty).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import Any, Final

from narwhal.decision.core import AdmissionCounts
from narwhal.decision.messages import (
    NO_WAKEUPS,
    Answer,
    Counted,
    Failed,
    Finished,
    FirstToken,
    Offer,
    PrefillDone,
    Progress,
    Reconsider,
    Refused,
    Wakeups,
)
from narwhal.errors import RouterUnavailable
from narwhal.observability.merged import Family
from narwhal.protocol.dialects import DialectCapabilities
from narwhal.transport.frames import FrameError, FrameWriter, frames_from
from narwhal.transport.view import FleetView

log = logging.getLogger("narwhal.transport")

UNREACHABLE: Final = "decision_unreachable"
PUSH_EVERY_S: Final = 0.1
# A call unanswered this long means the decision process is stuck: the request is told
# 503 rather than held (the decision process answers in microseconds).
CALL_TIMEOUT_S: Final = 5.0
_RETRY_S: Final = (0.05, 0.1, 0.2, 0.5, 1.0)
_NO_COUNTS: Final = AdmissionCounts(0, 0, 0, 0)


class RemoteCore:
    def __init__(
        self,
        path: str,
        default_capabilities: Callable[[str], DialectCapabilities],
        *,
        call_timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        """`path`: the decision process's socket; `default_capabilities(engine)`: what an
        engine the view does not name yet can do (its configured dialect's)."""
        self._path = path
        self._default_capabilities = default_capabilities
        self._call_timeout_s = call_timeout_s
        self._writer: FrameWriter | None = None
        self._view: FleetView | None = None
        self._calls: dict[int, tuple[asyncio.Future[Answer], str]] = {}  # by call number
        self._numbers = itertools.count(1)
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self.on_wakeups: Callable[[Wakeups], None] = lambda wakeups: None
        self.on_lost: Callable[[], None] = lambda: None
        # Told the view's readiness each time it changes (None: admitting), and the fleet's
        # engine names each time they change.
        self.on_readiness: Callable[[str | None], None] = lambda reason: None
        self.on_engines: Callable[[tuple[str, ...]], None] = lambda names: None
        # This worker's metrics as plain values, sent when the decision process asks, and
        # every PUSH_EVERY_S when `tally()` (what it has counted: requests offered and
        # ended) moved, so that a worker killed outright leaves at most that much uncounted.
        self.families: Callable[[], tuple[Family, ...]] = tuple
        self.tally: Callable[[], object] = lambda: None
        self._pushed: object = None

    async def start(self, wait_s: float | None = None) -> None:
        """Connect (and keep reconnecting) in the background; with `wait_s`, wait up to
        that long for the first view."""
        self._task = asyncio.create_task(self._run(), name="narwhal-remote-core")
        if wait_s is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._connected.wait()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._lost()

    @property
    def connected(self) -> bool:
        return self._writer is not None and self._view is not None

    # --- the link --------------------------------------------------------------------------

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self._path)
            except OSError as e:
                if failures == 0:
                    log.warning("the decision process at %s is unreachable: %s", self._path, e)
                await asyncio.sleep(_RETRY_S[min(failures, len(_RETRY_S) - 1)])
                failures += 1
                continue
            self._writer = FrameWriter(writer)
            self._pushed = None
            pusher = asyncio.create_task(self._push_counts(), name="narwhal-push-counts")
            try:
                await self._read(reader)
            except (FrameError, ConnectionError) as e:
                log.error("the link to the decision process failed: %s", e)
            finally:
                pusher.cancel()
                writer.transport.abort()
                self._lost()
            failures = 0
            log.warning("the decision process went away: refusing until it is back")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        async for frame in frames_from(reader):
            kind = frame[0]
            if kind == "answer" and len(frame) == 3:
                call = self._calls.pop(frame[1], None)
                if call is not None and not call[0].done():
                    call[0].set_result(frame[2])
            elif kind == "wakeups" and len(frame) == 2:
                self.on_wakeups(frame[1])
            elif kind == "scrape" and len(frame) == 2:
                self._send(("families", frame[1], self.families()))
            elif kind == "view" and len(frame) == 2:
                before = self._view
                if before is None:
                    log.info("connected to the decision process at %s", self._path)
                view = self._view = frame[1]
                self._connected.set()
                if before is None or before.readiness != view.readiness:
                    self.on_readiness(view.readiness)
                names = tuple(name for name, _ in view.capabilities)
                if before is None or names != tuple(name for name, _ in before.capabilities):
                    self.on_engines(names)
            else:
                raise FrameError(f"a frame of an unknown kind or shape: {kind!r}")

    async def _push_counts(self) -> None:
        while True:
            await asyncio.sleep(PUSH_EVERY_S)
            self.push_counts()

    def push_counts(self) -> None:
        """Send this worker's metrics now if what it counted moved since the last time (a
        worker shutting down sends them last)."""
        tally = self.tally()
        if tally != self._pushed and self._send(("families", 0, self.families())):
            self._pushed = tally

    def _lost(self) -> None:
        was_connected = self._view is not None
        self._writer = None
        self._view = None
        self._connected.clear()
        calls, self._calls = self._calls, {}
        for future, request_id in calls.values():
            if not future.done():
                future.set_result(_unreachable(request_id))
        if was_connected:
            self.on_lost()

    def _send(self, frame: tuple[Any, ...]) -> bool:
        writer = self._writer
        if writer is None or self._view is None or writer.closing:
            return False
        writer.send(frame)
        return True

    async def _call(self, kind: str, request_id: str, message: object) -> tuple[Answer, Wakeups]:
        number = next(self._numbers)
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        if not self._send((kind, number, message)):
            return _unreachable(request_id), NO_WAKEUPS
        self._calls[number] = (future, request_id)
        try:
            async with asyncio.timeout(self._call_timeout_s):
                return await future, NO_WAKEUPS
        except TimeoutError:
            log.error("the decision process did not answer %s of %s in time", kind, request_id)
            return _unreachable(request_id), NO_WAKEUPS
        finally:
            self._calls.pop(number, None)

    # --- AsyncDecisionCore -----------------------------------------------------------------

    async def offer(self, offer: Offer, now: float) -> tuple[Answer, Wakeups]:
        return await self._call("offer", offer.request_id, offer)

    async def counted(self, counted: Counted, now: float) -> tuple[Answer, Wakeups]:
        return await self._call("counted", counted.request_id, counted)

    async def failed(self, event: Failed, now: float) -> tuple[Answer, Wakeups]:
        return await self._call("failed", event.request_id, event)

    def prefill_done(self, event: PrefillDone, now: float) -> Wakeups:
        self._send(("prefill_done", event))
        return NO_WAKEUPS

    def first_token(self, event: FirstToken, now: float) -> Wakeups:
        self._send(("first_token", event))
        return NO_WAKEUPS

    def progress(self, event: Progress, now: float) -> None:
        self._send(("progress", event))

    def finished(self, event: Finished, now: float) -> Wakeups:
        self._send(("finished", event))
        return NO_WAKEUPS

    def reconsider(self, event: Reconsider, now: float) -> Wakeups:
        self._send(("reconsider", event))
        return NO_WAKEUPS

    def readiness(self) -> str | None:
        """`decision_unreachable` without the decision process, else None: whether the
        router admits is the decision process's to say at each offer (its state is read
        there first), since the view may be a moment behind (just active again, say)."""
        return UNREACHABLE if self._view is None else None

    def max_model_len(self) -> int | None:
        view = self._view
        return None if view is None else view.max_model_len

    def capabilities(self, engine: str) -> DialectCapabilities:
        view = self._view
        known = None if view is None else view.capabilities_of(engine)
        return self._default_capabilities(engine) if known is None else known

    def could_retry(self, request_id: str, engine: str) -> bool:
        view = self._view
        return view is not None and engine in view.retry_elsewhere

    def counts(self) -> AdmissionCounts:
        view = self._view
        return _NO_COUNTS if view is None else view.counts


def _unreachable(request_id: str) -> Refused:
    return Refused(request_id, RouterUnavailable.not_admitting(UNREACHABLE))
