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
- Either way no request starts after the stage's end, the stage waits for the
  ones in flight (each bounded by --timeout), and the next stage starts from an
  idle client. Warm-up requests go first and are not recorded.
- A stage's window runs from its start to its last response; the client's CPU
  (user + system, `getrusage`) is measured over the same window.
- `interrupt()` (Ctrl-C) stops starting requests, cancels those in flight
  (they are not recorded) and ends the run after the current stage.
"""

from __future__ import annotations

import asyncio
import math
import random
import resource
import time
from dataclasses import dataclass

import aiohttp
from yarl import URL

from narwhal.bench.client import execute
from narwhal.bench.config import StagePlan
from narwhal.bench.progress import Counters
from narwhal.bench.record import Record
from narwhal.bench.stats import error_counts
from narwhal.bench.workload import Workload

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
    arrival_span_s: float = 0.0  # open loop: stage start to the last arrival
    max_lag_s: float = 0.0  # open loop: the latest a request started after its arrival

    @property
    def offered_per_s(self) -> float:
        """The arrival rate actually generated (open loop); NaN when unknown."""
        if self.plan.rate is None or self.issued < 2 or self.arrival_span_s <= 0:
            return math.nan
        return (self.issued - 1) / self.arrival_span_s


@dataclass(slots=True)
class _Arrivals:
    issued: int = 0
    queued: int = 0
    span_s: float = 0.0
    max_lag_s: float = 0.0


class Runner:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        workload: Workload,
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
        self._stopping = False
        self._active: set[asyncio.Task[None]] = set()
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
        records: list[Record] = []
        await self._closed(plan, records, None)
        self.warmup_errors = error_counts(records)
        self._next_index = 0
        self._origin = perf()

    async def run_stage(self, plan: StagePlan, number: int) -> StageResult:
        records: list[Record] = []
        self._counters.begin(plan.name, plan.requests, plan.duration_s)
        cpu0 = cpu_seconds()
        start = perf()
        deadline = None if plan.duration_s is None else start + plan.duration_s
        if plan.rate is None:
            arrivals = _Arrivals(issued=await self._closed(plan, records, deadline))
        else:
            arrivals = await self._open(plan, plan.rate, number, records, deadline)
        window = perf() - start
        cpu = cpu_seconds() - cpu0
        return StageResult(
            plan=plan,
            records=records,
            started=start - self._origin,
            window_s=window,
            cpu_s=cpu,
            issued=arrivals.issued,
            interrupted=self._stopping,
            client_queued=arrivals.queued,
            arrival_span_s=arrivals.span_s,
            max_lag_s=arrivals.max_lag_s,
        )

    async def _one(self, records: list[Record]) -> None:
        spec = self._workload.next()
        index = self._next_index
        self._next_index += 1
        target = index % len(self._urls)
        record = Record(index, target, spec.prompt_tokens, spec.max_tokens)
        await execute(
            self._session,
            self._urls[target],
            spec.body,
            record,
            stream=self._stream,
            origin=self._origin,
            keep_marks=self._keep_marks,
            samples=self.error_samples,
        )
        records.append(record)
        counters = self._counters
        counters.finished += 1
        if record.error is not None:
            counters.failed += 1

    async def _closed(self, plan: StagePlan, records: list[Record], deadline: float | None) -> int:
        issued = 0

        async def worker() -> None:
            nonlocal issued
            while issued < plan.requests and not self._stopping:
                if deadline is not None and perf() >= deadline:
                    return
                issued += 1
                await self._one(records)

        workers = [
            asyncio.create_task(worker()) for _ in range(min(plan.concurrency, plan.requests))
        ]
        self._active.update(workers)
        try:
            await asyncio.gather(*workers, return_exceptions=True)
        finally:
            self._active.difference_update(workers)
        return issued

    async def _open(
        self,
        plan: StagePlan,
        rate: float,
        number: int,
        records: list[Record],
        deadline: float | None,
    ) -> _Arrivals:
        rng = random.Random(f"{self._seed}:{number}")
        inflight: set[asyncio.Task[None]] = set()
        out = _Arrivals()
        active = self._active

        def finished(task: asyncio.Task[None]) -> None:
            inflight.discard(task)
            active.discard(task)

        # The dispatcher itself is cancellable by interrupt(), so a long gap between
        # arrivals does not delay Ctrl-C.
        me = asyncio.current_task()
        assert me is not None
        active.add(me)
        start = arrival = perf()
        try:
            for i in range(plan.requests):
                if i:
                    arrival += rng.expovariate(rate)
                if deadline is not None and arrival >= deadline:
                    break
                delay = arrival - perf()
                if delay > 0:
                    await asyncio.sleep(delay)
                if self._stopping:
                    break
                lag = -delay if delay < 0 else perf() - arrival
                if lag > out.max_lag_s:
                    out.max_lag_s = lag
                if len(inflight) >= plan.concurrency:
                    out.queued += 1
                task = asyncio.create_task(self._one(records))
                inflight.add(task)
                active.add(task)
                task.add_done_callback(finished)
                out.issued += 1
                out.span_s = arrival - start
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            me.uncancel()
        finally:
            active.discard(me)
        if inflight:
            await asyncio.gather(*inflight, return_exceptions=True)
        return out
