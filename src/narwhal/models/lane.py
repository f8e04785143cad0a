"""One engine's prefill lane (sans-IO): the prefill work Narwhal has placed there, in order.

An engine prefills its waiting requests first come, first served (vLLM's scheduler
admits the queue in order and chunks prefills within a token budget), so the time until
a new request's prefill can finish is the work still ahead of it plus its own. The lane
holds each unfinished prefill with its estimated service time; the head has been in
service since it was placed or since the one before it finished, whichever is later:

    remaining(now) = sum of estimates - min(head's estimate, time the head has been served)

When a prefill finishes (the first token, or a prefill engine's answer), `finish`
returns its measured service time by the departure rule of a first-come-first-served
server: finish time - max(placed time, the previous finish on this engine). Over a busy
period these add up to exactly the time the engine spent, whatever the batching inside
a step, which is what the projection for later requests needs. Constant time per call.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Work:
    estimate: float
    placed_at: float


class PrefillLane:
    __slots__ = ("_last_finish", "_total", "_works")

    def __init__(self) -> None:
        self._works: dict[object, _Work] = {}  # insertion order is placement order
        self._total = 0.0
        self._last_finish = float("-inf")

    def __len__(self) -> int:
        return len(self._works)

    def add(self, key: object, estimate: float, now: float) -> None:
        self.remove(key)
        self._works[key] = _Work(max(0.0, estimate), now)
        self._total += max(0.0, estimate)

    def remove(self, key: object) -> None:
        """A prefill that will not finish here (failed, cancelled)."""
        work = self._works.pop(key, None)
        if work is not None:
            self._total -= work.estimate
            if not self._works:
                self._total = 0.0  # no rounding residue left behind

    def finish(self, key: object, now: float) -> float | None:
        """The prefill finished at `now`: its measured service time (None if unknown)."""
        work = self._works.pop(key, None)
        if work is None:
            return None
        self._total -= work.estimate
        if not self._works:
            self._total = 0.0
        started = max(work.placed_at, self._last_finish)
        self._last_finish = max(self._last_finish, now)
        return max(0.0, now - started)

    def waited(self, key: object, now: float) -> bool:
        """Whether the prefill `key` had work ahead of it when it was placed."""
        work = self._works.get(key)
        return work is not None and work.placed_at < self._last_finish

    def remaining(self, now: float) -> float:
        """Seconds of prefill work still ahead of a request placed now."""
        works = self._works
        if not works:
            return 0.0
        head = next(iter(works.values()))
        served = now - max(head.placed_at, self._last_finish)
        return max(0.0, self._total - min(head.estimate, max(0.0, served)))

    def clear(self) -> None:
        self._works.clear()
        self._total = 0.0
