"""An engine's KV cache, as far as placement can see it (sans-IO): how big it is, learned
from what the engine reports in use beside what Narwhal's requests hold there, and how
many decode tokens a prefill must wait for before the cache has room for it.

A full cache admits no prefill until decodes finish and free theirs (vLLM admits no prompt
it has no blocks for), and a cache that overflows preempts sequences, whose prefill is
done again ahead of everyone's (hidden work the lane cannot see, as vLLM's recompute
preemption does). So a prompt is placed only where it leaves the decodes there room to
grow into.
"""

from __future__ import annotations

from typing import Final

from narwhal.models.decode import DecodeBook

# Its size is learned while it is at least this full (emptier, the share in use says too
# little of the size).
LEARN_FROM: Final = 0.3
HEADROOM: Final = 0.9  # the share of the cache placement fills
_LEARNING_RATE: Final = 0.1


class KvCacheRoom:
    def __init__(self) -> None:
        self.capacity: float | None = None  # tokens, learned from the engine's metrics

    def wait_tokens(
        self,
        prompt_tokens: int,
        kv_usage: float,
        held: float,
        waiting: float,
        decoding: DecodeBook,
        now: float,
    ) -> float:
        """Decode tokens (of the request whose end frees the last of it) until the cache
        has room for this prompt and those `waiting` ahead of it; 0 when it has room now,
        or when Narwhal's requests are not what fills it (nothing to project by).
        `kv_usage`: the share in use the engine reported; `held`: the KV tokens Narwhal's
        requests hold there, prompts in the lane included."""
        if kv_usage >= LEARN_FROM and held > 0:
            estimate = held / kv_usage
            known = self.capacity
            self.capacity = (
                estimate if known is None else known + _LEARNING_RATE * (estimate - known)
            )
        capacity = self.capacity
        if capacity is None:
            return 0.0
        # In use: what the engine said (up to a probe interval old), or what Narwhal has
        # placed there since, whichever is more.
        in_use = max(kv_usage * capacity, held - waiting)
        room = HEADROOM * capacity - in_use
        needed = prompt_tokens + waiting - room
        if needed <= 0:
            return 0.0
        tokens = decoding.tokens_until_freed(needed, now)
        return 0.0 if tokens is None else tokens
