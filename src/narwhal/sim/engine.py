"""The engine's step loop: one task that runs the scheduler against the clock.

Each step is planned, slept for (its modelled duration times `--time-scale`), then
applied; the sequences that got a token are woken. The loop keeps a model clock and
sleeps until the step's due time rather than for its duration, so sleep overshoot
does not accumulate into slower tokens. With time-scale 0 (or when the loop is behind)
steps run back to back; the loop still yields every couple of milliseconds, so
handlers can write and new requests can arrive, and the tokens of several steps are
then written together, as they were all due already.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Final

from narwhal.sim.metrics import SimMetrics
from narwhal.sim.model import Scheduler, Sequence
from narwhal.sim.options import SimOptions

_log = logging.getLogger(__name__)
_YIELD_EVERY_S: Final = 0.002
_MAX_LAG_S: Final = 0.02  # behind by more than this, the loop stops trying to catch up


def _engine_reason(finish_reason: str) -> str:
    """vLLM labels request_success by the engine's reason: tool calls stopped by EOS."""
    return finish_reason if finish_reason in ("length", "abort") else "stop"


class Engine:
    def __init__(self, options: SimOptions, metrics: SimMetrics | None = None) -> None:
        self.options = options
        self.clock = time.monotonic
        self.started_at = self.clock()
        drift_at = None
        if options.drift_after_s is not None:
            drift_at = self.started_at + options.drift_after_s
        self.scheduler = Scheduler(options, drift_at=drift_at)
        self.metrics = metrics
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def gauges(self) -> tuple[int, int, float]:
        s = self.scheduler
        return s.num_running, s.num_waiting, s.kv_usage

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="narwhal-sim-engine")
        self._task.add_done_callback(self._report_crash)

    @staticmethod
    def _report_crash(task: asyncio.Task[None]) -> None:
        # A dead step loop would leave every request hanging: make it loud.
        if not task.cancelled() and task.exception() is not None:
            _log.critical("narwhal sim engine loop died", exc_info=task.exception())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def now(self) -> float:
        return self.clock()

    def submit(self, seq: Sequence) -> None:
        self.scheduler.add(seq, self.clock())
        self._wake.set()

    def abort(self, seq: Sequence) -> None:
        if seq.finished:
            return
        self.scheduler.abort(seq)
        if self.metrics is not None:
            self.metrics.finished("abort")
        self._wake.set()

    def release_held(self, seq: Sequence) -> None:
        self.scheduler.release_held(seq)
        self._wake.set()

    async def wait_progress(self, seq: Sequence) -> None:
        """Until the engine gives `seq` another token (or finishes it)."""
        waiter = asyncio.get_running_loop().create_future()
        seq.waiter = waiter
        try:
            await waiter
        finally:
            seq.waiter = None

    async def _idle(self) -> None:
        self._wake.clear()
        wake_at = self.scheduler.next_ready_time()
        if wake_at is None:
            await self._wake.wait()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), max(0.0, wake_at - self.clock()))

    async def _run(self) -> None:
        scheduler = self.scheduler
        scale = self.options.time_scale
        clock = self.clock
        due = clock()
        last_yield = due
        while True:
            now = clock()
            step = scheduler.schedule(now)
            if step is None:
                await self._idle()
                due = last_yield = clock()
                continue
            if scale > 0:
                due = max(due, now - _MAX_LAG_S) + step.duration * scale
                delay = due - clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                    last_yield = clock()
            result = scheduler.finish_step(step, clock())
            self._account(result.progressed, result.finished, scheduler.preemptions)
            for seq in result.progressed:
                waiter = seq.waiter
                if waiter is not None and (seq.streaming or seq.finished) and not waiter.done():
                    waiter.set_result(None)
            if clock() - last_yield > _YIELD_EVERY_S:
                await asyncio.sleep(0)
                last_yield = clock()

    def _account(
        self, progressed: list[Sequence], finished: list[Sequence], preemptions: int
    ) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        now = self.clock()
        itl = metrics.itl
        for seq in progressed:
            if seq.produced == 1:
                metrics.ttft.observe(now - seq.arrival)
                metrics.prompt_tokens += seq.prompt_len
            else:
                itl.observe(now - seq.last_token_at)
            seq.last_token_at = now
        metrics.generation_tokens += len(progressed)
        metrics.preemptions = preemptions
        for seq in finished:
            metrics.e2e.observe(now - seq.arrival)
            metrics.cached_tokens += seq.cached_tokens or 0
            if seq.produced > 1 and seq.first_token_at is not None:
                metrics.tpot.observe((now - seq.first_token_at) / (seq.produced - 1))
            metrics.finished(_engine_reason(seq.finish_reason))
