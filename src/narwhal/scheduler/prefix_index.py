"""What the router remembers of each engine's prefix cache (sans-IO).

vLLM caches the KV of each prompt's full blocks (16 tokens by default), each block keyed
by a hash of its tokens and of every block before it, so a block is a hit only when its
whole chain of preceding blocks is. The router mirrors that on the prompt's canonical
text (`prefix_text`), in blocks of `block_chars` characters (64, about 16 tokens at the
usual 4 characters a token):

    PromptBlocks      a request's chain of block hashes, computed once per request
    PrefixIndex       per engine, a bounded LRU set of the blocks sent there; `match`
                      says how many leading blocks of a request it holds
    index_capacity    the engine's KV cache (blocks x tokens a block) as index blocks
    cached_tokens     matched characters as the prompt tokens vLLM would not recompute

The index is an approximation and only ever moves placement cost: a wrong answer (an
eviction we did not see, a hash collision, text that tokenizes unevenly) prices a
prompt wrongly, nothing else. `prefix_accuracy` watches how wrong it is.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

DEFAULT_BLOCK_CHARS: Final = 64
DEFAULT_ENGINE_BLOCK_TOKENS: Final = 16  # vLLM's --block-size
_CHAIN_SEED: Final = 0


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """A prompt's whole blocks as a chain of hashes: hashes[i] stands for the text's
    first (i + 1) * block_chars characters. The trailing partial block is not hashed,
    as vLLM caches full blocks only."""

    hashes: tuple[int, ...]
    chars: int  # the canonical text's length
    block_chars: int

    @classmethod
    def of(cls, text: str | None, block_chars: int = DEFAULT_BLOCK_CHARS) -> PromptBlocks:
        """The blocks of a canonical text; a prompt not indexed (None) has none."""
        if block_chars < 1:
            raise ValueError("block_chars must be at least 1")
        if text is None:
            return cls((), 0, block_chars)
        return cls(_chain(text, block_chars), len(text), block_chars)

    def matched_chars(self, blocks: int) -> int:
        """Characters covered by the first `blocks` blocks."""
        return blocks * self.block_chars


def _chain(text: str, size: int) -> tuple[int, ...]:
    # h_i = hash((h_{i-1}, block_i)): each hash covers the whole prefix, so a block
    # matches only behind an identical prefix, as in vLLM. Python's built-in hash (SipHash
    # for str, seeded per process) is enough and fast: the index lives in this process
    # only and never leaves it, and a collision only mis-prices one placement.
    hashes: list[int] = []
    add = hashes.append
    h = _CHAIN_SEED
    for start in range(0, len(text) - size + 1, size):
        h = hash((h, text[start : start + size]))
        add(h)
    return tuple(hashes)


class PrefixIndex:
    """One engine's cached prompt blocks as the router believes them: a bounded LRU set.

    `capacity_blocks` follows the engine's KV cache (`resize`); `limit_blocks` is the
    configured hard cap that bounds memory whatever the engine reports: about 126 bytes
    a block, the hash's int included (121 MiB at 1M blocks; scripts/perf/prefix_index.py).

    An OrderedDict, not a plain dict: evicting the oldest key of a dict means finding
    its first live entry, which after many deletions from the front walks every deleted
    slot until the next resize. At 1M blocks an insert that evicts costs 15 us a block
    with a dict (more as deletions pile up) against 0.43 us; the dict would take 78
    bytes a block instead of 126.
    """

    __slots__ = ("_blocks", "_capacity", "_limit")

    def __init__(self, capacity_blocks: int, *, limit_blocks: int) -> None:
        if limit_blocks < 0:
            raise ValueError("limit_blocks must not be negative")
        self._limit = limit_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._capacity = 0
        self.resize(capacity_blocks)

    @property
    def capacity(self) -> int:
        """Blocks held at most: the engine's capacity, within the hard cap."""
        return self._capacity

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks are held, up to the first that is not. Touches
        nothing: every candidate engine is asked, the request goes to one."""
        blocks = self._blocks
        for i, h in enumerate(hashes):
            if h not in blocks:
                return i
        return len(hashes)

    def insert(self, hashes: Sequence[int]) -> None:
        """A request with these blocks was sent here: each is now the most recent.

        Touched tail first and head last, so that the head is the most recent and the
        tail goes first on eviction: vLLM frees a finished request's blocks in reverse
        order for the same reason, and a surviving head still matches, where a
        surviving tail behind an evicted head never could.
        """
        blocks = self._blocks
        touch = blocks.move_to_end
        for h in reversed(hashes):
            if h in blocks:
                touch(h)
            else:
                blocks[h] = None
        self._evict()

    def resize(self, capacity_blocks: int) -> None:
        """Follow the engine's capacity (within the hard cap); shrinking evicts the
        least recently used blocks."""
        if capacity_blocks < 0:
            raise ValueError("capacity_blocks must not be negative")
        self._capacity = min(capacity_blocks, self._limit)
        self._evict()

    def clear(self) -> None:
        """Forget everything: the engine restarted, or the index proved wrong."""
        self._blocks.clear()

    def _evict(self) -> None:
        blocks = self._blocks
        pop = blocks.popitem
        for _ in range(len(blocks) - self._capacity):
            pop(last=False)


def index_capacity(
    engine_blocks: int,
    block_tokens: int,
    *,
    chars_per_token: float,
    block_chars: int = DEFAULT_BLOCK_CHARS,
) -> int:
    """An engine's KV cache (vLLM's num_gpu_blocks x block_size tokens) in index blocks,
    at `chars_per_token` characters of canonical text a token."""
    if engine_blocks <= 0 or block_tokens <= 0 or chars_per_token <= 0:
        return 0
    return int(engine_blocks * block_tokens * chars_per_token // block_chars)


def cached_tokens(
    matched_chars: int,
    prompt_tokens: int,
    *,
    chars_per_token: float,
    block_tokens: int = DEFAULT_ENGINE_BLOCK_TOKENS,
) -> int:
    """The prompt tokens an engine would find cached, given the matched characters.

    Rounded down to whole engine blocks (vLLM hits whole blocks only), and at most the
    prompt less its last token, which vLLM always computes (so a prompt matched whole
    still hits only the blocks before its last token).

    `chars_per_token`: the request's own ratio (canonical characters / prompt tokens)
    follows the prompt's language and form (code, CJK text at about one character a
    token, token IDs in decimal at about six); a fleet-wide ratio is the better guess for
    prompts with images, whose tokens have no characters in the text.
    """
    if matched_chars <= 0 or prompt_tokens <= 1 or chars_per_token <= 0:
        return 0
    tokens = min(int(matched_chars / chars_per_token), prompt_tokens - 1)
    return tokens - tokens % block_tokens
