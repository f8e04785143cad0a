"""The decision process's side: a `DecisionCore` served to relay workers on a Unix socket.

Each worker is one connection (a `_Link`). Frames from a worker:

    ("offer", call, Offer) | ("counted", call, Counted) | ("failed", call, Failed)
        answered ("answer", call, Answer)
    ("prefill_done", PrefillDone) | ("first_token", FirstToken) | ("finished", Finished)
    | ("reconsider", Reconsider) | ("progress", Progress)
        sent without an answer

and to it, besides answers: ("wakeups", Wakeups), the queued requests of that worker
that an event anywhere placed or found unplaceable, ("view", FleetView) on change, and
("scrape", n), which the worker answers ("families", n, its metrics as plain values),
before each scrape of the merged `/metrics` and every `SCRAPE_EVERY_S`
(`narwhal.observability.merged`: a worker that dies has its last families kept).

The server keeps which worker holds each request (from its offer to its `Finished`), so a
wakeup goes to the worker whose handler waits for it, and when a worker's connection
ends (the worker died) every request it held is finished here, once: its retention
place, slots and queue place go back, and the wakeups that frees go to the others.

Time is this process's monotonic clock, read as each frame is handled (the same clock
as the workers', on one host).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from narwhal.decision.core import DecisionCore
from narwhal.decision.messages import Finished, Wakeups
from narwhal.observability.merged import MergedRegistry
from narwhal.transport.frames import FrameError, FrameWriter, frames_from
from narwhal.transport.view import VIEW_EVERY_S, FleetView, view_of

log = logging.getLogger("narwhal.transport")

# A worker that stops reading its frames is cut off past this much unsent to it: it
# would hold this process's memory without bound, and a worker that cannot read its
# answers is not serving anyway (its requests are released as for a dead worker).
MAX_UNSENT_BYTES: Final = 64 * 1024 * 1024
SCRAPE_EVERY_S: Final = 1.0
SCRAPE_TIMEOUT_S: Final = 1.0
_CALLS: Final = frozenset({"offer", "counted", "failed"})
_EVENTS: Final = frozenset({"prefill_done", "first_token", "finished", "reconsider", "progress"})


class _Link:
    __slots__ = ("frames", "name", "owned", "scraped", "writer")

    def __init__(self, name: str, writer: asyncio.StreamWriter) -> None:
        self.name = name
        self.writer = writer
        self.frames = FrameWriter(writer)
        self.owned: set[str] = set()  # the requests it offered and has not finished
        self.scraped: dict[int, asyncio.Future[None]] = {}  # scrapes it has not answered

    def send(self, frame: tuple[Any, ...]) -> None:
        frames = self.frames
        if frames.closing:
            return
        frames.send(frame)
        if frames.unsent_bytes() > MAX_UNSENT_BYTES:
            log.error("relay worker %s reads nothing it is sent: cut off", self.name)
            self.writer.transport.abort()


class CoreServer:
    def __init__(
        self,
        core: DecisionCore,
        engines: Callable[[], Iterable[str]],
        *,
        clock: Callable[[], float] = time.monotonic,
        released: Callable[[int], None] | None = None,
        merged: MergedRegistry | None = None,
        view_every_s: float = VIEW_EVERY_S,
    ) -> None:
        """`engines()`: the fleet's engine names (for the view); `released(n)`: told how
        many requests a worker held when its connection ended; `merged`: where the
        workers' metrics go (None: they are not asked for them)."""
        self._merged = merged
        self._scrapes = 0
        self._scraper: asyncio.Task[None] | None = None
        self._core = core
        self._engines = engines
        self._clock = clock
        self._released = released
        self._view_every_s = view_every_s
        self._links: set[_Link] = set()
        self._owner: dict[str, _Link] = {}
        self._view: FleetView | None = None
        self._server: asyncio.Server | None = None
        self._viewer: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._serial = 0

    @property
    def workers(self) -> int:
        """Workers connected now."""
        return len(self._links)

    def held(self) -> int:
        """Requests the workers hold now, across all of them."""
        return len(self._owner)

    async def start(self, path: str) -> None:
        """Listen on the Unix socket `path` (a stale socket file there is replaced)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._server = await asyncio.start_unix_server(self._serve, path)
        os.chmod(path, 0o600)
        self._viewer = asyncio.create_task(self._push_views(), name="narwhal-core-views")
        if self._merged is not None:
            self._scraper = asyncio.create_task(self._scrape_often(), name="narwhal-scrapes")

    async def scrape(self, timeout_s: float = SCRAPE_TIMEOUT_S) -> None:
        """Ask every worker for its metrics and wait (at most `timeout_s`) for them."""
        self._scrapes += 1
        number = self._scrapes
        loop = asyncio.get_running_loop()
        waits = []
        for link in list(self._links):
            future: asyncio.Future[None] = loop.create_future()
            link.scraped[number] = future
            link.send(("scrape", number))
            waits.append(future)
        if waits:
            await asyncio.wait(waits, timeout=timeout_s)
        for link in self._links:
            link.scraped.pop(number, None)

    async def _scrape_often(self) -> None:
        while True:
            await asyncio.sleep(SCRAPE_EVERY_S)
            await self.scrape()

    async def close(self) -> None:
        for task in (self._viewer, self._scraper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for link in list(self._links):
            link.writer.transport.abort()
        for task in list(self._handlers):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        self._serial += 1
        link = _Link(f"#{self._serial}", writer)
        self._links.add(link)
        log.info("relay worker %s connected", link.name)
        try:
            link.send(("view", self._current_view()))
            async for frame in frames_from(reader):
                self._handle(link, frame)
        except (FrameError, ConnectionError) as e:
            log.error("relay worker %s: the connection failed: %s", link.name, e)
        except Exception:
            log.exception("relay worker %s: a frame could not be handled", link.name)
        finally:
            self._links.discard(link)
            self._release(link)
            writer.transport.abort()
            if task is not None:
                self._handlers.discard(task)

    def _handle(self, link: _Link, frame: tuple[Any, ...]) -> None:
        kind = frame[0]
        core = self._core
        now = self._clock()
        if kind in _CALLS and len(frame) == 3:
            call, message = frame[1], frame[2]
            if kind == "offer":
                self._hold(link, message.request_id)
                answer, woken = core.offer(message, now)
            elif kind == "counted":
                answer, woken = core.counted(message, now)
            else:
                answer, woken = core.failed(message, now)
            link.send(("answer", call, answer))
            self._route(woken)
        elif kind == "families" and len(frame) == 3:
            if self._merged is not None:
                self._merged.update(link.name, frame[2])
            waiting = link.scraped.pop(frame[1], None)
            if waiting is not None and not waiting.done():
                waiting.set_result(None)
        elif kind in _EVENTS and len(frame) == 2:
            message = frame[1]
            if kind == "progress":
                core.progress(message, now)
            elif kind == "finished":
                self._unhold(message.request_id)
                self._route(core.finished(message, now))
            elif kind == "first_token":
                self._route(core.first_token(message, now))
            elif kind == "prefill_done":
                self._route(core.prefill_done(message, now))
            else:
                self._route(core.reconsider(message, now))
        else:
            raise FrameError(f"a frame of an unknown kind or shape: {kind!r}")

    def _hold(self, link: _Link, request_id: str) -> None:
        owner = self._owner.get(request_id)
        if owner is not None and owner is not link:
            # Request ids are unique per worker and carry its prefix: two workers never
            # offer one id. If they did, the first keeps it.
            raise FrameError(f"request {request_id} is another worker's")
        self._owner[request_id] = link
        link.owned.add(request_id)

    def _unhold(self, request_id: str) -> None:
        link = self._owner.pop(request_id, None)
        if link is not None:
            link.owned.discard(request_id)

    def _route(self, wakeups: Wakeups) -> None:
        """Each wakeup to the worker whose request it names."""
        if not wakeups:
            return
        owner = self._owner
        by_link: dict[_Link, tuple[list[Any], list[str]]] = {}
        for placed in wakeups.placed:
            link = owner.get(placed.request_id)
            if link is not None:
                by_link.setdefault(link, ([], []))[0].append(placed)
        for request_id in wakeups.unplaceable:
            link = owner.get(request_id)
            if link is not None:
                by_link.setdefault(link, ([], []))[1].append(request_id)
        for link, (placed_list, unplaceable) in by_link.items():
            link.send(("wakeups", Wakeups(tuple(placed_list), tuple(unplaceable))))

    def _release(self, link: _Link) -> None:
        """The worker is gone: everything its requests held goes back, each once, and
        what it counted stays counted."""
        if self._merged is not None:
            self._merged.retire(link.name)
        owned = list(link.owned)
        for request_id in owned:
            self._unhold(request_id)
            self._route(self._core.finished(Finished(request_id), self._clock()))
        if owned:
            log.warning(
                "relay worker %s disconnected holding %d request(s): released",
                link.name,
                len(owned),
            )
        if self._released is not None:
            self._released(len(owned))

    def _current_view(self) -> FleetView:
        view = self._view = view_of(self._core, self._engines)
        return view

    async def _push_views(self) -> None:
        while True:
            await asyncio.sleep(self._view_every_s)
            before = self._view
            view = self._current_view()
            if view != before:
                for link in list(self._links):
                    link.send(("view", view))
