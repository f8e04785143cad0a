"""How the router's event loop is doing: its lag and how many tasks it holds.

A router that blocks its loop delays every stream at once, and one that leaks tasks grows
until it falls over; both show here before they show anywhere else. The lag is measured
by a task that asks to wake every `interval_s` and records how late it woke
(`narwhal_event_loop_lag_seconds`, a histogram); the task count is read at scrape time
(`narwhal_event_loop_tasks`).
"""

from __future__ import annotations

import asyncio
import contextlib

from prometheus_client import CollectorRegistry, Gauge, Histogram

_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class LoopMonitor:
    def __init__(self, registry: CollectorRegistry, interval_s: float = 0.1) -> None:
        self._interval = interval_s
        self._task: asyncio.Task[None] | None = None
        self.lag = Histogram(
            "narwhal_event_loop_lag_seconds",
            f"How late the event loop ran a callback due every {interval_s:g} s.",
            buckets=_LAG_BUCKETS,
            registry=registry,
        )
        self.tasks = Gauge(
            "narwhal_event_loop_tasks",
            "asyncio tasks alive in the router (requests, streams, monitors).",
            registry=registry,
        )
        self.tasks.set_function(_task_count)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="narwhal-loop-monitor")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self._interval
            await asyncio.sleep(self._interval)
            self.lag.observe(max(0.0, loop.time() - due))


def _task_count() -> float:
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:  # scraped outside the loop (tests reading the registry directly)
        return 0.0
