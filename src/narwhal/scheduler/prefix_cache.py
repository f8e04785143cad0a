"""Prefix-cache-aware placement: what each engine holds, as prompt tokens it need not
prefill (sans-IO; `fleet.policy: cache_aware`).

Per engine, a `PrefixIndex` of the prompt blocks Narwhal has sent there and a
`PrefixAccuracy` that sets its predictions beside the engine's own counters. For each
request:

    blocks_of(request)        its canonical text's chain of block hashes, once
    cached_tokens(entry, r)   the prompt tokens the engine would find cached: the index's
                              leading match, as whole engine blocks (`prefix_index`)
    placed(entry, r, cached)  the request went there: its blocks are the most recent

The scorers price only the uncached tokens (`scheduler.predictive`), so a long cached
prefix on a busy engine is weighed against a cold idle one in seconds of projected TTFT,
not by a hit-rate threshold; admission counts the uncached tokens as the engine's
prefill work. For a prefill/decode pair the prefill engine's cache is the one that
counts: it is the one that computes the prompt.

The index follows the engine as its metrics show it, read whenever the engine is next
used: its capacity from vLLM's `cache_config_info` (num_gpu_blocks x block_size tokens,
in characters at the ratio the fleet's prompts have shown; the configured cap until the
engine says), and it is forgotten when the engine restarts (its counters go back, or
the monitor saw it down) or when its predictions exceed the engine's own hit ratio for
long (`prefix_accuracy`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from narwhal.config import Config
from narwhal.fleet.scrape import EngineScrape
from narwhal.protocol.requests import CompletionRequest
from narwhal.scheduler.placement import PlacementRequest
from narwhal.scheduler.prefix_accuracy import AccuracyPolicy, PrefixAccuracy, Verdict
from narwhal.scheduler.prefix_index import (
    DEFAULT_ENGINE_BLOCK_TOKENS,
    PrefixIndex,
    PromptBlocks,
    cached_tokens,
    index_capacity,
)
from narwhal.scheduler.prefix_text import prompt_text
from narwhal.scheduler.registry import EngineEntry

# Canonical characters a prompt token, until the fleet's prompts have shown theirs (and
# for converting an engine's KV capacity, in tokens, to index blocks).
_FIRST_CHARS_PER_TOKEN: Final = 4.0
_RATIO_WEIGHT: Final = 0.02  # each prompt's share of the running mean


@dataclass(slots=True)
class EnginePrefix:
    """One engine's index, its accuracy, and what Narwhal predicted there in all."""

    index: PrefixIndex
    accuracy: PrefixAccuracy
    block_tokens: int = DEFAULT_ENGINE_BLOCK_TOKENS
    predicted_hit_tokens: int = 0
    placed_tokens: int = 0
    resets: int = 0
    last_scrape: EngineScrape | None = None
    seen_down: bool = False
    caching_off: bool = False  # the engine says it does not cache prefixes


class PrefixCache:
    def __init__(
        self,
        engines: list[str],
        *,
        block_chars: int,
        max_blocks: int,
        accuracy: AccuracyPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self._policy = accuracy or AccuracyPolicy()
        self.engines = {name: self._fresh() for name in engines}
        self.chars_per_token = _FIRST_CHARS_PER_TOKEN

    def _fresh(self) -> EnginePrefix:
        return EnginePrefix(
            PrefixIndex(self.max_blocks, limit_blocks=self.max_blocks),
            PrefixAccuracy(self._policy),
        )

    def add(self, name: str) -> None:
        """An engine added while running (a reload): an empty index."""
        self.engines[name] = self._fresh()

    def remove(self, name: str) -> None:
        self.engines.pop(name, None)

    def blocks_of(self, request: CompletionRequest) -> PromptBlocks:
        return PromptBlocks.of(prompt_text(request), self.block_chars)

    def cached_tokens(self, entry: EngineEntry, request: PlacementRequest) -> int:
        blocks = request.prefix
        state = self.engines.get(entry.name)
        if blocks is None or not blocks.hashes or state is None:
            return 0
        self.follow(entry)
        if state.caching_off:
            return 0
        matched = state.index.match(blocks.hashes)
        if not matched:
            return 0
        return cached_tokens(
            blocks.matched_chars(matched),
            request.prompt_tokens,
            chars_per_token=_ratio(blocks, request.prompt_tokens),
            block_tokens=state.block_tokens,
        )

    def placed(self, entry: EngineEntry, request: PlacementRequest, cached: int) -> None:
        """The request's prefill goes to `entry`, `cached` of its tokens predicted hits."""
        state = self.engines.get(entry.name)
        blocks = request.prefix
        if state is None or blocks is None:
            return
        self.follow(entry)
        state.index.insert(blocks.hashes)
        state.accuracy.placed(cached, request.prompt_tokens)
        state.predicted_hit_tokens += cached
        state.placed_tokens += request.prompt_tokens
        if blocks.chars and request.prompt_tokens > 0:
            ratio = blocks.chars / request.prompt_tokens
            self.chars_per_token += _RATIO_WEIGHT * (ratio - self.chars_per_token)

    def follow(self, entry: EngineEntry) -> None:
        """Bring the engine's index up to what its health and metrics say now."""
        state = self.engines.get(entry.name)
        if state is None:
            return
        health = entry.health
        if health is not None and health.status == "down":
            state.seen_down = True
        elif state.seen_down:  # back up: whatever it cached went with its process
            state.seen_down = False
            self._forget(state)
        scrape = entry.scrape
        if scrape is None or scrape is state.last_scrape:
            return
        state.last_scrape = scrape
        # vLLM's --no-enable-prefix-caching: nothing it is sent is ever a hit there, so
        # placement by load alone (the index is still kept, should it be turned on).
        state.caching_off = scrape.prefix_caching is False
        if scrape.block_size:
            state.block_tokens = int(scrape.block_size)
        if scrape.num_gpu_blocks:
            state.index.resize(
                index_capacity(
                    int(scrape.num_gpu_blocks),
                    state.block_tokens,
                    chars_per_token=self.chars_per_token,
                    block_chars=self.block_chars,
                )
            )
        verdict = state.accuracy.scraped(
            scrape.prefix_cache_hits, scrape.prefix_cache_queries, self._clock()
        )
        if verdict is not Verdict.KEEP:
            self._forget(state)

    def _forget(self, state: EnginePrefix) -> None:
        state.index.clear()
        state.resets += 1

    def report(self, name: str) -> dict[str, object] | None:
        """The engine's index for /admin/engines (None: not a cache-aware fleet's)."""
        state = self.engines.get(name)
        if state is None:
            return None
        return {
            "blocks": len(state.index),
            "capacity_blocks": state.index.capacity,
            "block_chars": self.block_chars,
            "predicted_hit_ratio": state.accuracy.predicted_ratio(),
            "engine_hit_ratio": state.accuracy.engine_ratio(),
            "predicted_hit_tokens": state.predicted_hit_tokens,
            "placed_prompt_tokens": state.placed_tokens,
            "resets": state.resets,
        }


def _ratio(blocks: PromptBlocks, prompt_tokens: int) -> float:
    """The request's own characters a token: follows its language and form."""
    return blocks.chars / prompt_tokens if prompt_tokens > 0 else _FIRST_CHARS_PER_TOKEN


def prefix_cache_for(config: Config) -> PrefixCache | None:
    """The engines' prefix indexes, for `fleet.policy: cache_aware` only."""
    if config.fleet.policy != "cache_aware":
        return None
    settings = config.fleet.prefix_index
    return PrefixCache(
        [e.name for e in config.engines],
        block_chars=settings.block_chars,
        max_blocks=settings.max_blocks,
        accuracy=AccuracyPolicy(
            threshold=settings.drift_threshold, forget_after_s=settings.forget_after_s
        ),
    )
