"""Shared system prompts (`--workload shared-prefix`): a few long prompts, short suffixes.

K system prompts of `--system-prompt-tokens` each are made once from the seed and
sent exactly, byte for byte, by every request that picks them; each request adds
a user message of `--suffix-tokens` that no other request has. An engine's prefix
cache can therefore reuse exactly the system prompt and nothing past it, and a
router that sends a prompt's requests to the engine holding it shows in the hit
ratio and the TTFT.

Which prompt a request picks is uniform, or Zipf with `--system-prompt-zipf S`
(prompt i, counting from 1, weighs 1/i**S: a few popular prompts and a tail).
Everything is drawn from the seed in request order, so the same flags send the
same requests; the prompts are the same in every stage of a sweep (and after the
warm-up), as a deployment's system prompts would be.
"""

from __future__ import annotations

import bisect
import itertools
import random
from dataclasses import dataclass

from narwhal.bench.body import RequestShape, estimated_tokens
from narwhal.bench.workload import LengthRange, PromptText, RequestSpec

# Where system prompts start in the shared text (`PromptText.take`'s key), far from
# the small keys that user messages use: distinct labels keep them apart anyway,
# this only keeps them from starting at the same word.
_SYSTEM_KEY_BASE = 1 << 40


@dataclass(frozen=True, slots=True)
class SystemPromptSpec:
    count: int
    tokens: LengthRange  # each prompt's length, drawn once per prompt
    zipf: float | None  # None: every prompt equally likely


class SystemPrompts:
    """The run's K system prompts and the seeded choice among them."""

    def __init__(self, spec: SystemPromptSpec, seed: int, text: PromptText) -> None:
        rng = random.Random(f"{seed}:system-prompts")
        # "system N:" can be no prefix of another label (see PromptText.take), so
        # two prompts differ from their first characters on.
        self.texts = tuple(
            text.take(_SYSTEM_KEY_BASE + i, spec.tokens.draw(rng), label=f"system {i}:")
            for i in range(spec.count)
        )
        self._cumulative: list[float] | None = None
        if spec.zipf is not None:
            weights = (1.0 / (i + 1) ** spec.zipf for i in range(spec.count))
            self._cumulative = list(itertools.accumulate(weights))

    def pick(self, rng: random.Random) -> int:
        """The index of the next request's prompt."""
        if self._cumulative is None:
            return rng.randrange(len(self.texts))
        point = rng.random() * self._cumulative[-1]
        return min(bisect.bisect_right(self._cumulative, point), len(self.texts) - 1)

    def message(self, index: int) -> dict[str, str]:
        return {"role": "system", "content": self.texts[index]}


class SharedPrefixWorkload:
    """Yields the run's requests in order, as `Workload` does: one of the system prompts
    and a fresh suffix each."""

    def __init__(
        self,
        shape: RequestShape,
        prompts: SystemPrompts,
        text: PromptText,
        suffix_tokens: LengthRange,
        max_tokens: LengthRange,
        seed: int,
    ) -> None:
        self._shape = shape
        self._prompts = prompts
        self._text = text
        self._suffix_tokens = suffix_tokens
        self._max_tokens = max_tokens
        self._rng = random.Random(f"{seed}:shared-prefix")
        self._count = 0

    def next(self) -> RequestSpec:
        key = self._count
        self._count += 1
        rng = self._rng
        which = self._prompts.pick(rng)
        suffix = self._text.take(key, self._suffix_tokens.draw(rng))
        max_tokens = self._max_tokens.draw(rng)
        messages = [self._prompts.message(which), {"role": "user", "content": suffix}]
        body = self._shape.encode(messages, max_tokens)
        return RequestSpec(body, estimated_tokens(messages), max_tokens, which)
