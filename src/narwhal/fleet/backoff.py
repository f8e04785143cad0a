"""When to probe an engine next (sans-IO; the random generator is passed in).

A healthy engine is probed every `interval`. After failed health checks the pause
doubles per failure, capped at 4 intervals: a dead engine is not hammered, and one that
comes back waits at most about 4 intervals (plus jitter) to be noticed. The first
failure keeps the plain interval, so the second strike that confirms a timeout comes
as quickly as the first. Every pause is jittered by ±10% so that engines started
together do not stay probed in lockstep.
"""

from __future__ import annotations

import random
from typing import Final

MAX_BACKOFF: Final = 4.0
JITTER: Final = 0.1


def backoff_factor(consecutive_failures: int) -> float:
    """1, 1, 2, 4, 4, ... for 0, 1, 2, 3, 4, ... consecutive failures."""
    if consecutive_failures <= 1:
        return 1.0
    return min(2.0 ** (consecutive_failures - 1), MAX_BACKOFF)


def next_delay(interval: float, consecutive_failures: int, rng: random.Random) -> float:
    """Seconds from the start of one probe round to the start of the next."""
    return interval * backoff_factor(consecutive_failures) * rng.uniform(1 - JITTER, 1 + JITTER)
