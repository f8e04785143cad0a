"""Drives the load: warm-up, then one closed- or open-loop stage after another.

- Closed loop: `concurrency` workers each send the next request as soon as
  their previous one ends, until `requests` were sent or `duration_s` passed.
- Open loop: requests arrive as a Poisson process at `rate` per second
  (exponential gaps from a generator seeded by `--seed` and the stage number)
  until `requests` were sent or `duration_s` passed; an arrival never waits
  for earlier responses.
  Arrivals past the connection pool's `concurrency` wait for a connection,
  and that wait is part of their TTFT; they are counted as `client_queued`.
  A request starts when its arrival is due or, if the client is late, at once;
  the largest such lateness is reported (`max_lag_s`), so an overloaded
  client shows rather than silently lowering the offered load.
- Conversations (`--workload multi-turn`): the unit that arrives is a
  conversation, whose turns follow one another (the next one starts when the
  previous reply has ended, after its think time). Closed loop: `concurrency`
  users, each starting its next conversation when its last one ends. Open loop:
  conversations arrive as a Poisson process at `rate / mean turns` per second,
  so that in steady state requests are sent at `rate` per second, as in the
  other workloads; conversations ended early by a failure send fewer, and the
  load ramps up over the first conversations' lifetime and down over the last
  ones', so the report shows the request rate actually generated. `requests`
  bounds the turns: conversations start while the turns planned for the stage
  are fewer (the last one is shortened to fit; the turns a conversation ended
  early did not send are given back), so every conversation started can finish
  unless the stage's `duration_s` ends first: a turn due after it is not sent,
  and its conversation counts as cut. A conversation's turns all go to one
  `--url` (round-robin by conversation), as one client's session would.
  A request that finds `concurrency` requests in flight counts as
  `client_queued`; the start lag is the conversations' arrivals'.
- `duration_s` (`--duration`) bounds when requests start, not when they end:
  no request starts `duration_s` or more after the stage began; the requests in
  flight then run to their end (each bounded by --timeout) and are recorded and
  counted like any other, so a stage lasts up to `duration_s` + --timeout.
  Either way (`requests` sent or `duration_s` passed) the stage waits for the
  ones in flight, and the next stage starts from an idle client. Warm-up
  requests go first and are not recorded (for conversations: whole
  conversations, closed loop, until the warm-up's requests were sent).
- A stage's measured window runs from its first request's send to the end of its
  last response (`measured_window`): the denominator of every rate in its
  report. The client's CPU (user + system, `getrusage`) is measured over the
  whole stage, which starts when the first request is sent and ends once the
  last response has been recorded.
- `interrupt()` (Ctrl-C) stops starting requests, cancels those in flight
  (they are not recorded) and ends the run after the current stage.
"""

from __future__ import annotations

import asyncio
import math
import random
import resource
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from yarl import URL

from narwhal.bench.client import execute
from narwhal.bench.config import StagePlan
from narwhal.bench.conversation import (
    COMPLETED,
    CUT,
    FAILED,
    UNREADABLE,
    Conversation,
    ConversationCounts,
    Conversations,
)
from narwhal.bench.histogram import LogHistogram
from narwhal.bench.progress import Counters
from narwhal.bench.record import Record
from narwhal.bench.reply import reply_text
from narwhal.bench.stats import error_counts, measured_window
from narwhal.bench.workload import RequestSource, RequestSpec

perf = time.perf_counter


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(slots=True)
class StageResult:
    plan: StagePlan
    records: list[Record]
    started: float  # seconds since the run's origin
    window_s: float
    cpu_s: float
    issued: int
    interrupted: bool
    client_queued: int = 0  # open loop: arrivals that found the pool full
    arrival_span_s: float = 0.0  # open loop: stage start to the last request's start
    max_lag_s: float = 0.0  # open loop: the latest a request started after its arrival
    conversations: ConversationCounts | None = None  # conversation workloads only
    conversation_rate: float = math.nan  # open loop: conversations' arrivals per second
    itl: LogHistogram = field(default_factory=LogHistogram)  # successful streams' gaps
    health_latency_s: list[float] = field(default_factory=list)  # --health-probe's answers

    @property
    def offered_per_s(self) -> float:
        """The request rate actually generated (open loop); NaN when unknown."""
        if self.plan.rate is None or self.issued < 2 or self.arrival_span_s <= 0:
            return math.nan
        return (self.issued - 1) / self.arrival_span_s


@dataclass(slots=True)
class _Arrivals:
    issued: int = 0  # requests sent
    queued: int = 0
    span_s: float = 0.0
    max_lag_s: float = 0.0


@dataclass(slots=True)
class _Stage:
    """What one stage's requests share while it runs."""

    records: list[Record]
    pool: int  # the most requests in flight before one waits for a connection
    deadline: float | None
    started: float
    arrivals: _Arrivals
    counts: ConversationCounts
    planned: int = 0  # conversations: turns planned, less those not sent after an early end
    itl: LogHistogram = field(default_factory=LogHistogram)


class Runner:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        workload: RequestSource | Conversations,
        urls: list[URL],
        *,
        stream: bool,
        keep_marks: bool,
        seed: int,
        counters: Counters | None = None,
    ) -> None:
        self._session = session
        self._workload = workload
        self._urls = urls
        self._stream = stream
        self._keep_marks = keep_marks
        self._seed = seed
        self._counters = counters or Counters()
        self._origin = perf()
        self._next_index = 0
        self._in_flight = 0
        self._stopping = False
        self._active: set[asyncio.Task[object]] = set()
        self.error_samples: dict[str, str] = {}  # one explanation per error key
        self.warmup_errors: dict[str, int] = {}  # warm-up requests are not recorded, but
        # their failures are reported: a target failing from the start should be seen

    @property
    def stopping(self) -> bool:
        return self._stopping

    def interrupt(self) -> None:
        self._stopping = True
        for task in list(self._active):
            task.cancel()

    async def warmup(self, count: int, parallel: int) -> None:
        """Send `count` unrecorded requests, `parallel` at a time, so connections are open."""
        if count <= 0:
            return
        plan = StagePlan("warm-up", None, max(1, min(parallel, count)), count, None)
        self._counters.begin("warm-up", count, None)
        stage = self._stage(plan, None, perf())
        await self._closed(plan, stage)
        self.warmup_errors = error_counts(stage.records)
        self._next_index = 0
        self._origin = perf()

    async def run_stage(self, plan: StagePlan, number: int) -> StageResult:
        self._counters.begin(plan.name, plan.requests, plan.duration_s)
        cpu0 = cpu_seconds()
        start = perf()
        deadline = None if plan.duration_s is None else start + plan.duration_s
        stage = self._stage(plan, deadline, start)
        if plan.rate is None:
            await self._closed(plan, stage)
        else:
            await self._open(plan, plan.rate, number, stage)
        span = perf() - start
        cpu = cpu_seconds() - cpu0
        arrivals = stage.arrivals
        source = self._workload
        conversations = isinstance(source, Conversations)
        return StageResult(
            plan=plan,
            records=stage.records,
            started=start - self._origin,
            window_s=measured_window(stage.records, span),
            cpu_s=cpu,
            issued=arrivals.issued,
            interrupted=self._stopping,
            client_queued=arrivals.queued,
            arrival_span_s=arrivals.span_s,
            max_lag_s=arrivals.max_lag_s,
            conversations=stage.counts if conversations else None,
            conversation_rate=_conversation_rate(plan.rate, source),
            itl=stage.itl,
        )

    def _stage(self, plan: StagePlan, deadline: float | None, started: float) -> _Stage:
        return _Stage([], plan.concurrency, deadline, started, _Arrivals(), ConversationCounts())

    def _record(self, spec: RequestSpec, target: int | None = None) -> Record:
        index = self._next_index
        self._next_index += 1
        if target is None:
            target = index % len(self._urls)
        record = Record(index, target, spec.prompt_tokens, spec.max_tokens)
        record.system_prompt = spec.system_prompt
        return record

    async def _send(
        self, record: Record, body: bytes, stage: _Stage, body_parts: list[bytes] | None = None
    ) -> None:
        await execute(
            self._session,
            self._urls[record.target],
            body,
            record,
            stream=self._stream,
            origin=self._origin,
            keep_marks=self._keep_marks,
            samples=self.error_samples,
            body_parts=body_parts,
            itl=stage.itl,
        )
        stage.records.append(record)
        counters = self._counters
        counters.finished += 1
        if record.error is not None:
            counters.failed += 1

    async def _one(self, source: RequestSource, stage: _Stage) -> None:
        spec = source.next()
        await self._send(self._record(spec), spec.body, stage)

    async def _turns(self, conversation: Conversation, stage: _Stage) -> str:
        """Play a conversation's turns until it ends; say how it ended."""
        script = conversation.script
        target = script.number % len(self._urls)
        chat = conversation.shape.chat
        ended = perf()  # when the last reply ended
        while not conversation.done:
            due = ended + conversation.pause_s
            if stage.deadline is not None and due >= stage.deadline:
                return CUT  # at once: the stage does not wait out a think time
            # The loop's timers may fire a little early (uvloop's by up to a millisecond):
            # sleep again until the think time has really passed (a deadline, not a poll).
            while (delay := due - perf()) > 0:  # noqa: ASYNC110
                await asyncio.sleep(delay)
            if self._stopping:
                return CUT
            spec = conversation.next_request()
            record = self._record(spec, target)
            record.conversation, record.turn = script.number, conversation.sent
            arrivals = stage.arrivals
            arrivals.issued += 1
            arrivals.span_s = perf() - stage.started
            if self._in_flight >= stage.pool:
                arrivals.queued += 1
            body_parts: list[bytes] = []
            self._in_flight += 1
            try:
                await self._send(record, spec.body, stage, body_parts)
            finally:
                self._in_flight -= 1
            ended = perf()
            if record.error is not None:
                return FAILED
            reply = reply_text(body_parts, chat=chat, stream=self._stream)
            if reply is None:
                return UNREADABLE
            conversation.received(reply)
        return COMPLETED

    def _start_conversation(
        self, source: Conversations, stage: _Stage, requests: int
    ) -> Conversation:
        conversation = source.start(requests - stage.planned)
        stage.planned += conversation.script.turns
        stage.counts.started += 1
        return conversation

    async def _converse(self, conversation: Conversation, stage: _Stage) -> str:
        ending = CUT  # cancelled by interrupt() mid-turn
        try:
            ending = await self._turns(conversation, stage)
        finally:
            stage.counts.add(ending)
            stage.planned -= conversation.script.turns - conversation.sent
        return ending

    async def _closed(self, plan: StagePlan, stage: _Stage) -> None:
        source = self._workload
        deadline = stage.deadline

        def more() -> bool:
            if self._stopping or (deadline is not None and perf() >= deadline):
                return False
            if isinstance(source, Conversations):
                return stage.planned < plan.requests
            return stage.arrivals.issued < plan.requests

        async def worker() -> None:
            while more():
                if isinstance(source, Conversations):
                    conversation = self._start_conversation(source, stage, plan.requests)
                    if await self._converse(conversation, stage) == CUT:
                        return  # this user would idle past the stage's end
                else:
                    stage.arrivals.issued += 1
                    await self._one(source, stage)

        workers = [
            asyncio.create_task(worker()) for _ in range(min(plan.concurrency, plan.requests))
        ]
        self._active.update(workers)
        try:
            await asyncio.gather(*workers, return_exceptions=True)
        finally:
            self._active.difference_update(workers)

    async def _open(self, plan: StagePlan, rate: float, number: int, stage: _Stage) -> None:
        source = self._workload
        inflight: set[asyncio.Task[object]] = set()
        out = stage.arrivals
        if isinstance(source, Conversations):
            rate = _conversation_rate(rate, source)

            def more() -> bool:
                return stage.planned < plan.requests

            def launch() -> Coroutine[Any, Any, object]:
                # Started here, not in the task: the next `more()` sees its turns planned.
                conversation = self._start_conversation(source, stage, plan.requests)
                return self._converse(conversation, stage)

        else:
            arrived = 0

            def more() -> bool:
                return arrived < plan.requests

            def launch() -> Coroutine[Any, Any, object]:
                nonlocal arrived
                arrived += 1
                if len(inflight) >= plan.concurrency:
                    out.queued += 1
                out.issued += 1
                out.span_s = arrival - stage.started
                return self._one(source, stage)

        offsets = arrival_offsets(self._seed, number, rate)
        active = self._active

        def finished(task: asyncio.Task[object]) -> None:
            inflight.discard(task)
            active.discard(task)

        # The dispatcher itself is cancellable by interrupt(), so a long gap between
        # arrivals does not delay Ctrl-C.
        me = asyncio.current_task()
        assert me is not None
        active.add(me)
        arrival = stage.started
        try:
            while more():
                arrival = stage.started + next(offsets)
                if stage.deadline is not None and arrival >= stage.deadline:
                    break
                delay = arrival - perf()
                if delay > 0:
                    await asyncio.sleep(delay)
                if self._stopping:
                    break
                lag = -delay if delay < 0 else perf() - arrival
                if lag > out.max_lag_s:
                    out.max_lag_s = lag
                task = asyncio.create_task(launch())
                inflight.add(task)
                active.add(task)
                task.add_done_callback(finished)
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            me.uncancel()
        finally:
            active.discard(me)
        if inflight:
            await asyncio.gather(*inflight, return_exceptions=True)


def arrival_offsets(seed: int, stage: int, rate: float) -> Iterator[float]:
    """A Poisson process at `rate`/s: the arrivals' seconds after the stage's start (the
    first at 0), the same for the same seed, stage number and rate."""
    rng = random.Random(f"{seed}:{stage}")
    offset = 0.0
    while True:
        yield offset
        offset += rng.expovariate(rate)


def _conversation_rate(rate: float | None, source: RequestSource | Conversations) -> float:
    """Conversations' arrivals per second that send `rate` requests per second."""
    if rate is None or not isinstance(source, Conversations):
        return math.nan
    return rate / source.mean_turns
