"""What an engine has shown of how it schedules prompts (sans-IO): whether it serves one
request at a time, and how many prompt tokens one of its steps holds.

Both start from the profile's concurrent probes (`narwhal.models.profile`) and the first
is followed by traffic: a first token that came while others of Narwhal's decoded there
overlaps, and one that came only once every decode placed before it had finished is
serialized. An engine without continuous batching (`transformers serve` by default)
shows only the second, several times.

The step budget is what the engine was configured with (`max_num_batched_tokens`, or
vLLM's GPU default), or what the probes showed where a step held less: a vLLM on CPU
defaults to 2,048 tokens a step, and nothing of its configuration is on the wire.
"""

from __future__ import annotations

from typing import Final

from narwhal.models.profile import Profile

# First tokens that waited for every decode ahead, with none overlapping, before an engine
# is taken to serve one request at a time.
SERIAL_EVIDENCE: Final = 3


class EngineDiscipline:
    __slots__ = ("_overlapped", "_serialized", "_step_seen")

    def __init__(self) -> None:
        self._overlapped = 0.0
        self._serialized = 0.0
        # The most prompt tokens a step holds, as the concurrent probes showed (None: no
        # less than the configured budget as far as they showed).
        self._step_seen: int | None = None

    def install(self, profile: Profile) -> None:
        """What the probes sent together showed (a new profile replaces what was seen)."""
        one_at_a_time = profile.prefill_discipline == "one_at_a_time"
        self._serialized = float(SERIAL_EVIDENCE) if one_at_a_time else 0.0
        self._overlapped = 1.0 if profile.prefill_discipline in ("batched", "serial") else 0.0
        self._step_seen = profile.concurrent_step_tokens

    def first_token(self, beside: float, decoding_at: float) -> None:
        """A prefill's first token came with `beside` sequences decoding there, after it
        was placed with `decoding_at` of them."""
        if beside >= 1:
            self._overlapped += 1
        elif decoding_at >= 1:
            self._serialized += 1

    @property
    def one_at_a_time(self) -> bool:
        """Whether the engine runs one request at a time, prefill and whole output: a
        prompt placed while others decoded there got its first token only after they had
        all finished, several times, and never while another was decoding."""
        return self._serialized >= SERIAL_EVIDENCE and self._overlapped == 0

    def step_budget(self, configured: int) -> int:
        """The prompt tokens a step holds: the configured budget, or less where the
        probes showed less."""
        seen = self._step_seen
        return configured if seen is None else min(configured, seen)
