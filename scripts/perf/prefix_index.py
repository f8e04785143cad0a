"""Cost of the prefix index per block: canonical text and hashing, match, insert, memory.

What placement pays per request for prefix-cache affinity, in microseconds per block of
64 characters (about 16 tokens):

    text + hash     `prompt_text` and `PromptBlocks.of` of a long chat (an 8k-token
                    history by default), once per request
    match hit       `PrefixIndex.match` of a prompt whose every block is held, on an
                    index of `--blocks` blocks (asked once per candidate engine)
    match miss      the same when its first block is not held (one lookup: per call)
    insert evict    `insert` of a prompt of new blocks into the full index: every block
                    added and one evicted
    insert touch    `insert` of a prompt already held: every block moved to the front
    memory          bytes per block of the full index (tracemalloc), the hash's int
                    object included, as it outlives the request that brought it

and the same for a plain dict used as the LRU (insertion order; the oldest is evicted
with next(iter(d))), the alternative the index's OrderedDict was chosen over.

    python scripts/perf/prefix_index.py [--blocks 1000000] [--history-tokens 8000]

No processes, no sockets; about 30 s on the 2-core dev box at 1M blocks.
"""

from __future__ import annotations

import argparse
import gc
import random
import subprocess
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from narwhal.protocol.requests import CompletionRequest
from narwhal.scheduler.prefix_index import PrefixIndex, PromptBlocks
from narwhal.scheduler.prefix_text import prompt_text

WORDS = ("the", "of", "and", "to", "in", "is", "a", "model", "engine", "token", "cache", "prefix")


def chat_request(history_tokens: int, rng: random.Random) -> CompletionRequest:
    """A system prompt and alternating turns of about 200 tokens up to the history size
    (prose of ~4.5 characters a token), then one new user message."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": prose(800, rng)}]
    tokens = 800
    while tokens < history_tokens:
        role = "user" if len(messages) % 2 else "assistant"
        messages.append({"role": role, "content": prose(200, rng)})
        tokens += 200
    messages.append({"role": "user", "content": prose(50, rng)})
    body = {"model": "m", "messages": messages}
    return CompletionRequest("chat", body, "m", False, False, False, False, None)


def prose(tokens: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(tokens))


def best_of(repeats: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(repeats))


@contextmanager
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def per_call_us(func: Callable[[], object], budget_s: float = 0.5) -> float:
    """Best of several timed runs of `func`, per call, in µs."""
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            func()
        elapsed = time.perf_counter() - start
        if elapsed > budget_s / 5:
            break
        calls *= 2

    def run() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            func()
        return (time.perf_counter() - start) / calls

    return best_of(5, run) * 1e6


class DictLRU:
    """The index on a plain dict, for the comparison only."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: dict[int, None] = {}

    def insert(self, hashes: list[int]) -> None:
        blocks = self.blocks
        for h in reversed(hashes):
            blocks.pop(h, None)  # to the end: out, then in again
            blocks[h] = None
        for _ in range(len(blocks) - self.capacity):
            del blocks[next(iter(blocks))]


def random_chains(count: int, length: int, rng: random.Random) -> list[list[int]]:
    bits = rng.getrandbits
    return [[bits(64) - (1 << 63) for _ in range(length)] for _ in range(count)]


def fill(insert: Callable[[list[int]], None], blocks: int, rng: random.Random) -> float:
    """Fill an index with `blocks` blocks in chains of 512; µs per block."""
    chains = random_chains(blocks // 512 + 1, 512, rng)
    start = time.perf_counter()
    for chain in chains:
        insert(chain)
    return (time.perf_counter() - start) / (len(chains) * 512) * 1e6


def timed_inserts(insert: Callable[[list[int]], None], chains: list[list[int]]) -> float:
    start = time.perf_counter()
    for chain in chains:
        insert(chain)
    return (time.perf_counter() - start) / sum(map(len, chains)) * 1e6


def memory_per_block(make: Callable[[int], Any], blocks: int, rng: random.Random) -> float:
    """Bytes per block of a full index, the hashes' int objects included."""
    with no_gc():
        tracemalloc.start()
        before, _ = tracemalloc.get_traced_memory()
        index = make(blocks)
        for chain in random_chains(blocks // 512 + 1, 512, rng):
            index.insert(chain)
        after, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    held = len(index) if isinstance(index, PrefixIndex) else len(index.blocks)
    return (after - before) / held


def commit() -> str:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--", "../../src/narwhal"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


Row = tuple[str, float, str]


def measure_text(request: CompletionRequest, text: str, per_request: int) -> list[Row]:
    with no_gc():
        text_us = per_call_us(lambda: prompt_text(request))
        hash_us = per_call_us(lambda: PromptBlocks.of(text))
    both = text_us + hash_us
    return [
        ("canonical text", text_us / per_request, f"{text_us:.1f} µs a request"),
        ("hash chain", hash_us / per_request, f"{hash_us:.1f} µs a request"),
        ("text + hash", both / per_request, f"{both:.1f} µs a request"),
    ]


def measure_index(n: int, hashes: list[int], rng: random.Random) -> list[Row]:
    blocks = len(hashes)
    index = PrefixIndex(n, limit_blocks=n)
    with no_gc():
        fill_us = fill(index.insert, n, rng)
        index.insert(hashes)
        hit_us = per_call_us(lambda: index.match(hashes))
        missing = [rng.getrandbits(63), *hashes[1:]]
        miss_us = per_call_us(lambda: index.match(missing))
        half = [*hashes[: blocks // 2], rng.getrandbits(63), *hashes[blocks // 2 :]]
        half_us = per_call_us(lambda: index.match(half))
        evict_us = best_of(3, lambda: timed_inserts(index.insert, random_chains(200, 512, rng)))
        index.insert(hashes)
        touch_us = per_call_us(lambda: index.insert(hashes)) / blocks
    assert len(index) == n and index.match(hashes) == blocks
    return [
        ("match, every block held", hit_us / blocks, f"{hit_us:.1f} µs a call"),
        ("match, half held", half_us / (blocks // 2), f"{half_us:.1f} µs a call"),
        ("match, first block missed", miss_us, "µs a call (one lookup)"),
        ("insert, new blocks, full index", evict_us, "each block added and one evicted"),
        ("insert, blocks held (touch)", touch_us, "each block moved to the front"),
        ("fill from empty", fill_us, f"{n:,} blocks in chains of 512"),
    ]


def measure_dict(n: int, hashes: list[int], evictions: int, rng: random.Random) -> list[Row]:
    lru = DictLRU(n)
    with no_gc():
        fill_us = fill(lru.insert, n, rng)
        # Few: each eviction walks the deleted slots at the front of the dict.
        count = max(1, evictions // 512)
        evict_us = timed_inserts(lru.insert, random_chains(count, 512, rng))
        lru.insert(hashes)
        touch_us = per_call_us(lambda: lru.insert(hashes), budget_s=0.2) / len(hashes)
    return [
        ("dict: insert, new, full index", evict_us, f"{count * 512:,} evictions"),
        ("dict: insert, blocks held", touch_us, "pop and re-insert"),
        ("dict: fill from empty", fill_us, ""),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=1_000_000, help="index size")
    parser.add_argument("--history-tokens", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dict-evictions", type=int, default=20_000)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    n = args.blocks

    request = chat_request(args.history_tokens, rng)
    text = prompt_text(request)
    assert text is not None
    blocks = PromptBlocks.of(text)
    hashes = list(blocks.hashes)
    print(f"narwhal {commit()}; index of {n:,} blocks; chat history {args.history_tokens:,} tokens")
    print(f"prompt: {len(text):,} characters, {len(hashes)} blocks of {blocks.block_chars}")
    print()
    rows = measure_text(request, text, len(hashes))
    rows += measure_index(n, hashes, rng)
    rows += measure_dict(n, hashes, args.dict_evictions, rng)
    print(f"| {'operation':<32} | {'µs/block':>9} | note")
    print(f"|{'-' * 34}|{'-' * 11}|------")
    for name, value, note in rows:
        print(f"| {name:<32} | {value:>9.3f} | {note}")
    print()
    print(f"memory, full index of {n:,} blocks (tracemalloc, hash ints included):")
    for label, make in (
        ("PrefixIndex (OrderedDict)", lambda c: PrefixIndex(c, limit_blocks=c)),
        ("plain dict", DictLRU),
    ):
        per_block = memory_per_block(make, n, rng)
        print(f"  {label:<26} {per_block:.0f} bytes a block, {per_block * n / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
