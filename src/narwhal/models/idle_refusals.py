"""Refusals made while an engine is idle, and when the router probes it for them (sans-IO).

A bound is learned from the first tokens of what it admitted. When it refuses every
request while the engine has nothing of Narwhal's in flight, nothing is admitted, nothing
is measured, and nothing can lower it again. One slow first token on an idle engine was
seen to do that (a real vLLM on a host with a core held busy: one 3,242-token prompt
served in 0.33 s where its profile said 0.13 moved the prefill fit and the idle class's
error together, and every later request of the test, 64 of them in an overload, was
refused while the engine sat idle).

An idle engine's time costs no client anything, so the router measures it itself: a probe
of the refused prompt's length, placed and learned from as a client request is (the
lane, the prefill fit, the idle class's error: `EngineModel.prefill_placed(probe=True)`),
once refusals have gone on for `IDLE_REFUSALS_AFTER_S` with the engine idle. A client
request placed there ends the episode; the next needs refusals for as long again, and
its probe waits for the pace: 1, 2, 4 ... `_MOST_S` seconds after the one before, back
to 1 only once `_QUIET_S` have passed without one. So a workload whose long prompts are
refused on an idle engine while its short ones are admitted (each admission ending an
episode) gets a probe a half-minute at most, not one a second that would hold the
engine while clients arrive. If the engine is as slow as the bound says, the probes say
so too and the refusals stay right.
"""

from __future__ import annotations

import math
from typing import Final

IDLE_REFUSALS_AFTER_S: Final = 1.0  # refusals of an idle engine for this long: probe it
_FIRST_S: Final = 1.0  # the pause after a first probe, doubled after each
_MOST_S: Final = 30.0
_QUIET_S: Final = 60.0  # without a probe for this long, the pace starts over


class IdleRefusals:
    """One engine's refusals while idle: whether a probe is due, and its pace."""

    __slots__ = ("_gap", "_last_probe", "_next_at", "_since", "_tokens", "episode", "probes")

    def __init__(self) -> None:
        self._since: float | None = None  # the first refusal since the last probe
        self._tokens = 0  # the prompt tokens of the last refused request
        self._next_at = -math.inf
        self._gap = _FIRST_S
        self._last_probe = -math.inf
        self.probes = 0  # probes sent for it, ever
        self.episode = 0  # probes sent since the pace last started over

    def refused(self, prompt_tokens: int, now: float) -> None:
        """A request was refused by the bound while the engine was idle."""
        if self._since is None:
            self._since = now
        self._tokens = prompt_tokens

    def due(self, now: float, *, idle: bool) -> int | None:
        """The prompt length to probe the engine at now, or None."""
        since = self._since
        if since is None or not idle or now - since < IDLE_REFUSALS_AFTER_S:
            return None
        if now - self._last_probe >= _QUIET_S:
            self._gap, self._next_at, self.episode = _FIRST_S, -math.inf, 0
        return None if now < self._next_at else self._tokens

    def probing(self, now: float) -> None:
        """A probe goes: the next needs refusals after it, and waits twice as long."""
        self._since = None
        self._last_probe = now
        self._next_at = now + self._gap
        self._gap = min(_MOST_S, 2.0 * self._gap)
        self.probes += 1
        self.episode += 1

    def placed(self) -> None:
        """A client request was placed on the engine: it is learning from clients again
        (the pace of probes stays: see above)."""
        self._since = None
