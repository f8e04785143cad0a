"""A one-line progress bar on stderr, redrawn by its own timer.

The request path only bumps two integers in `Counters`; the bar reads them at
most ten times a second, so drawing never lands on the hot path.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from typing import TextIO


class Counters:
    """What the runner tells the bar about the current stage."""

    __slots__ = ("duration_s", "failed", "finished", "label", "started", "total")

    def __init__(self) -> None:
        self.label = ""
        self.total = 0
        self.duration_s: float | None = None
        self.started = time.perf_counter()
        self.finished = 0
        self.failed = 0

    def begin(self, label: str, total: int, duration_s: float | None) -> None:
        self.label = label
        self.total = total
        self.duration_s = duration_s
        self.started = time.perf_counter()
        self.finished = 0
        self.failed = 0


def render(counters: Counters, now: float, width: int) -> str:
    """The bar's text for the moment `now` (no carriage return), at most `width` wide."""
    elapsed = max(0.0, now - counters.started)
    fraction = counters.finished / counters.total if counters.total else 0.0
    if counters.duration_s:
        fraction = max(fraction, elapsed / counters.duration_s)
    fraction = min(1.0, fraction)
    rate = counters.finished / elapsed if elapsed > 0 else 0.0
    tail = (
        f" {counters.finished}/{counters.total} err {counters.failed}"
        f" {rate:.1f} req/s {elapsed:.1f}s"
    )
    head = f"{counters.label} "
    bar_width = max(0, min(30, width - len(head) - len(tail) - 2))
    filled = round(fraction * bar_width)
    text = f"{head}[{'#' * filled}{'.' * (bar_width - filled)}]{tail}"
    return text[:width]


async def show(counters: Counters, stream: TextIO, interval: float = 0.1) -> None:
    """Redraw until cancelled, then clear the line."""
    width = max(20, shutil.get_terminal_size().columns - 1)
    try:
        while True:
            await asyncio.sleep(interval)
            stream.write("\r" + render(counters, time.perf_counter(), width).ljust(width))
            stream.flush()
    finally:
        stream.write("\r" + " " * width + "\r")
        stream.flush()
