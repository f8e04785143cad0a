"""The prefills placed on one engine whose first token has not come yet (sans-IO).

Each is kept with what its placement knew (its features, projection and bound, the
engine's load then), and with whether it stayed alone there: a prompt placed on the
same engine after it, before its first token, may have shared its steps (an engine
batches what arrives while a prefill runs), and then its first token is no longer the
prompt's own prefill. A burst onto an idle engine once taught the whole burst's time as
one prompt's prefill, to the fit and to the bound the prompt-alone 429 reads. One count
of placements tells it in O(1): a prefill stayed alone while the count is its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(slots=True)
class PendingPrefill:
    features: tuple[float, float, float, float]
    estimate: float
    solo: bool  # nothing ahead of it when placed: its service time is its own
    placed_at: float
    projected: float | None  # its TTFT as projected at placement (None: not projected)
    upper: float  # the bound on that projection, then
    decoding_at: float  # sequences decoding there when it was placed
    output: float  # its expected output tokens
    idle: bool  # placed with nothing of Narwhal's in flight there
    placement: int = 0  # the engine's placements when it was placed (itself included)


class PendingPrefills:
    """One engine's prefills in flight, by key."""

    __slots__ = ("_by_key", "_placements")

    def __init__(self) -> None:
        self._by_key: dict[object, PendingPrefill] = {}
        self._placements = 0  # prefills placed here, ever

    def __len__(self) -> int:
        return len(self._by_key)

    def __iter__(self) -> Iterator[PendingPrefill]:
        return iter(self._by_key.values())

    def add(self, key: object, pending: PendingPrefill) -> None:
        self._placements += 1
        pending.placement = self._placements
        self._by_key[key] = pending

    def finish(self, key: object) -> tuple[PendingPrefill, bool] | None:
        """The prefill of `key`, gone from here, and whether it stayed alone (None: not
        here)."""
        pending = self._by_key.pop(key, None)
        if pending is None:
            return None
        return pending, pending.placement == self._placements

    def drop(self, key: object) -> None:
        self._by_key.pop(key, None)
