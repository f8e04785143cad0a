"""The wait on an engine that serves one request at a time (sans-IO): no continuous
batching, or a single slot (`EngineDiscipline.one_at_a_time`). A prompt's first token
comes after what the requests decoding there have left, then each prompt waiting ahead
with its whole expected output, then its own prefill.

Its bound cannot come from a histogram of past errors: the wait is the outputs of every
request ahead, whose lengths are known only in expectation, and a few long outputs make
it (a request or two a second). Each length is taken as varying by the learned
coefficient of variation around its expectation; the sum's spread is the root of their
squares, taken at the bound's quantile.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final

from narwhal.models.decode import DecodeBook
from narwhal.models.pending import PendingPrefill

# The normal quantile of the bound (99.5%), for a sum of output lengths.
SPREAD_Z: Final = 2.58


def wait(
    decoding: DecodeBook, pending: Iterable[PendingPrefill], step_s: float, now: float
) -> float:
    """Seconds until the engine gets to a new prompt: the decodes' remaining tokens and
    each waiting prompt's prefill and output, at `step_s` a decode step."""
    left = sum(decoding.remaining(now)) * step_s
    for ahead in pending:
        left += ahead.estimate + ahead.output * step_s
    return left


def spread(
    decoding: DecodeBook, pending: Iterable[PendingPrefill], step_s: float, now: float
) -> float:
    """How far past `wait` the first token may come, at the bound's quantile."""
    square = sum(r * r for r in decoding.remaining(now))
    square += sum(p.output * p.output for p in pending)
    if square <= 0:
        return 0.0
    cv = decoding.lengths.variation()
    return SPREAD_Z * cv * math.sqrt(square) * step_s
