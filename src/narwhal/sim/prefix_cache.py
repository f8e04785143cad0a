"""vLLM's KV-cache blocks and automatic prefix caching (APC), sans-IO.

The facts modelled, from vLLM's V1 engine (vllm/v1/core/kv_cache_manager.py,
block_pool.py, kv_cache_utils.py):

- KV lives in `num_gpu_blocks` blocks of `block_size` tokens. A sequence holds the
  blocks that cover its tokens; KV usage is the share of blocks not free.
- Only FULL blocks are cached. Block i's hash chains block i-1's hash with block i's
  token IDs, so one hash stands for the whole prefix up to the end of its block: a
  block can only be a hit when every block before it is.
- A lookup walks the chain from the first block and stops at the first miss. It never
  covers the prompt's last token: the engine has to compute at least one token to get
  the logits of the next, and since hits are whole blocks, a prompt that is entirely
  cached recomputes its whole last block.
- Blocks in use carry a reference count and are never evicted. A block whose count
  drops to 0 joins the end of the free queue and keeps its hash: it is free (KV usage
  does not count it) yet still a hit, until an allocation needs it.
- Allocation takes blocks never used so far first, then the head of the free queue,
  the least recently freed, dropping its hash (eviction). A sequence frees its blocks
  tail first, so a chain loses its tail before its head, and the shared head of many
  prompts (a system prompt) outlives their private tails.

Where the sim is simpler than vLLM: there are no extra keys in the hash (LoRA,
multimodal inputs, `cache_salt`), no reserved null block, and a block whose hash is
already cached by another block is not registered twice (vLLM keeps both; the
difference shows only after the first one is evicted).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

# The chain's seed. vLLM's is random per process (unless PYTHONHASHSEED is set); a
# constant keeps the sim's runs reproducible, and hashes never leave the process.
_ROOT: Final = 0x6E61727768616C  # "narwhal"


class Block:
    """One KV block. `block_hash` is set while the block is registered in the cache."""

    __slots__ = ("block_hash", "block_id", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None


def extend_hashes(hashes: list[int], token_ids: Sequence[int], block_size: int, upto: int) -> None:
    """Append to `hashes` (the chain so far) until it covers `upto` full blocks."""
    parent = hashes[-1] if hashes else _ROOT
    for i in range(len(hashes), upto):
        # A tuple of ints hashes the same in every process (only str/bytes are salted).
        parent = hash((parent, *token_ids[i * block_size : (i + 1) * block_size]))
        hashes.append(parent)


@dataclass(slots=True)
class CacheCounters:
    """What the engine reports about its cache, in tokens (vLLM's PrefixCacheStats)."""

    queries: int = 0  # tokens of the requests looked up (vllm:prefix_cache_queries)
    hits: int = 0  # of those, tokens found cached (vllm:prefix_cache_hits)
    # The last step that admitted requests: SGLang's sglang:cache_hit_rate is that
    # batch's hit share, not a running total.
    batch_queries: int = 0
    batch_hits: int = 0


class BlockPool:
    """The engine's KV blocks: allocation, reference counts, the cache and its LRU."""

    def __init__(self, num_blocks: int, block_size: int, *, caching: bool) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("a block pool needs at least one block of at least one token")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        # Blocks never handed out are made on first use. In vLLM they are the head of
        # the free queue at start-up, so they are always taken before any freed block.
        self._fresh = num_blocks
        # Free blocks that have been used, least recently freed first (evicted first).
        self._free: OrderedDict[int, Block] = OrderedDict()
        self._cached: dict[int, Block] = {}  # block hash -> the block holding that prefix

    # -- what the outside sees ----------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks an allocation may take, cached-but-unreferenced ones included."""
        return self._fresh + len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks

    def num_cached_free(self) -> int:
        """Free blocks that still hold a cached prefix (evictable hits)."""
        return sum(1 for block in self._free.values() if block.block_hash is not None)

    def free_order(self) -> list[int]:
        """Ids of the used-then-freed blocks in eviction order (for tests and /sim/state)."""
        return list(self._free)

    # -- the cache ----------------------------------------------------------------------
    def lookup(self, hashes: Sequence[int], num_tokens: int) -> list[Block]:
        """The longest cached chain for a request of `num_tokens` tokens (not referenced yet).

        `hashes` are the request's full-block hashes, in order. At most `num_tokens - 1`
        tokens can hit: the last one is always computed.
        """
        if not self.caching:
            return []
        limit = min(len(hashes), (num_tokens - 1) // self.block_size)
        hits: list[Block] = []
        cached = self._cached
        for i in range(limit):
            block = cached.get(hashes[i])
            if block is None:
                break
            hits.append(block)
        return hits

    def register(self, block: Block, block_hash: int) -> None:
        """`block` is full and computed: later requests with the same prefix may reuse it."""
        if not self.caching or block.block_hash is not None:
            return
        if block_hash in self._cached:
            return  # the same prefix is already cached in another block
        block.block_hash = block_hash
        self._cached[block_hash] = block

    # -- allocation -----------------------------------------------------------------------
    def can_allocate(self, num_new: int, hits: Sequence[Block] = ()) -> bool:
        # A hit sitting in the free queue stops being free once referenced.
        reclaimed = sum(1 for block in hits if block.ref_cnt == 0)
        return num_new + reclaimed <= self.num_free

    def touch(self, hits: Sequence[Block]) -> None:
        """Reference cached blocks a request reuses (taking free ones off the queue)."""
        for block in hits:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def allocate(self, count: int) -> list[Block]:
        """`count` new blocks, evicting the least recently freed cached blocks if need be."""
        if count > self.num_free:
            raise ValueError(f"{count} blocks asked, {self.num_free} free")
        blocks: list[Block] = []
        for _ in range(count):
            if self._fresh:
                block = Block(self.num_blocks - self._fresh)
                self._fresh -= 1
            else:
                _, block = self._free.popitem(last=False)
                self._evict(block)
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def free(self, blocks: Sequence[Block]) -> None:
        """A request lets go of its blocks; tail first, so its tail is evicted first."""
        free = self._free
        for block in reversed(blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                free[block.block_id] = block

    def _evict(self, block: Block) -> None:
        block_hash = block.block_hash
        if block_hash is not None:
            del self._cached[block_hash]
            block.block_hash = None
