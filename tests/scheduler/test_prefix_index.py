"""Prompt blocks, the per-engine prefix index and the conversions around it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from narwhal.scheduler.prefix_index import (
    PrefixIndex,
    PromptBlocks,
    cached_tokens,
    index_capacity,
)

TEXT = "".join(chr(ord("a") + i % 26) for i in range(64 * 5))


def index(capacity: int, limit: int = 1 << 20) -> PrefixIndex:
    return PrefixIndex(capacity, limit_blocks=limit)


# --- PromptBlocks ---------------------------------------------------------------------------


def test_only_whole_blocks_are_hashed() -> None:
    assert len(PromptBlocks.of(TEXT[:63]).hashes) == 0
    assert len(PromptBlocks.of(TEXT[:64]).hashes) == 1
    blocks = PromptBlocks.of(TEXT[:130])
    assert len(blocks.hashes) == 2 and blocks.chars == 130
    assert blocks.matched_chars(2) == 128
    assert len(PromptBlocks.of(TEXT[:130], block_chars=10).hashes) == 13
    assert PromptBlocks.of(None) == PromptBlocks((), 0, 64)


def test_each_hash_covers_its_whole_prefix() -> None:
    blocks = PromptBlocks.of(TEXT).hashes
    assert blocks == PromptBlocks.of(TEXT).hashes
    head_changed = PromptBlocks.of("A" + TEXT[1:]).hashes
    assert all(a != b for a, b in zip(blocks, head_changed, strict=True))
    third_changed = PromptBlocks.of(TEXT[:130] + "A" + TEXT[131:]).hashes
    assert third_changed[:2] == blocks[:2]
    assert all(a != b for a, b in zip(blocks[2:], third_changed[2:], strict=True))
    # The same block content at another position is another block.
    repeated = PromptBlocks.of("x" * 128).hashes
    assert repeated[0] != repeated[1]


# --- PrefixIndex ----------------------------------------------------------------------------


def test_match_counts_leading_blocks_up_to_the_first_miss() -> None:
    idx = index(10)
    idx.insert([1, 2, 3])
    assert idx.match([1, 2, 3]) == 3
    assert idx.match([1, 2, 3, 4]) == 3
    assert idx.match([1, 2, 9, 3]) == 2
    assert idx.match([9, 1, 2]) == 0
    assert idx.match([]) == 0


def test_eviction_takes_a_chain_tail_before_its_head() -> None:
    idx = index(3)
    idx.insert([1, 2, 3])
    idx.insert([4])
    assert idx.match([1, 2, 3]) == 2  # 3, the tail, went first
    idx.insert([5])
    assert idx.match([1, 2, 3]) == 1
    assert len(idx) == 3


def test_insert_touches_blocks_already_held() -> None:
    idx = index(4)
    idx.insert([1, 2])
    idx.insert([3, 4])
    idx.insert([1, 2])  # sent again: now the most recent
    idx.insert([5, 6])
    assert idx.match([1, 2]) == 2
    assert idx.match([3, 4]) == 0


def test_match_does_not_touch() -> None:
    idx = index(2)
    idx.insert([1])
    idx.insert([2])
    assert idx.match([1]) == 1
    idx.insert([3])
    assert idx.match([1]) == 0 and idx.match([2]) == 1


def test_a_request_longer_than_the_index_keeps_its_head() -> None:
    idx = index(3)
    idx.insert([1, 2, 3, 4, 5])
    assert len(idx) == 3 and idx.match([1, 2, 3, 4, 5]) == 3


chains = st.lists(st.integers(0, 40), unique=True, max_size=12)


@given(st.integers(0, 20), st.lists(chains, max_size=30))
def test_capacity_bounds_the_index_under_any_inserts(
    capacity: int, requests: list[list[int]]
) -> None:
    idx = index(capacity)
    for hashes in requests:
        idx.insert(hashes)
        assert len(idx) <= capacity
        # The request just sent matches as far as the index can hold it.
        assert idx.match(hashes) == min(len(hashes), capacity)
        for other in requests:
            assert 0 <= idx.match(other) <= len(other)


def test_resize_down_evicts_the_least_recently_used() -> None:
    idx = index(6)
    idx.insert([1, 2, 3])
    idx.insert([4, 5, 6])
    idx.resize(4)
    assert idx.capacity == 4 and len(idx) == 4
    assert idx.match([4, 5, 6]) == 3 and idx.match([1, 2, 3]) == 1
    idx.resize(100)
    assert idx.match([1, 2, 3]) == 1  # growing brings nothing back


def test_the_hard_cap_bounds_any_capacity() -> None:
    idx = index(10, limit=4)
    assert idx.capacity == 4
    idx.resize(1_000_000)
    assert idx.capacity == 4
    idx.insert(list(range(10)))
    assert len(idx) == 4


def test_clear_and_zero_capacity() -> None:
    idx = index(10)
    idx.insert([1, 2, 3])
    idx.clear()
    assert len(idx) == 0 and idx.match([1, 2, 3]) == 0
    empty = index(0)
    empty.insert([1, 2])
    assert len(empty) == 0 and empty.match([1]) == 0
    with pytest.raises(ValueError):
        index(-1)
    with pytest.raises(ValueError):
        idx.resize(-1)


# --- conversions ----------------------------------------------------------------------------


def test_engine_capacity_in_index_blocks() -> None:
    # 1,000 vLLM blocks of 16 tokens at 4 characters a token: 64,000 characters.
    assert index_capacity(1000, 16, chars_per_token=4.0) == 1000
    assert index_capacity(1000, 16, chars_per_token=4.0, block_chars=128) == 500
    assert index_capacity(1000, 16, chars_per_token=3.5) == 875
    assert index_capacity(0, 16, chars_per_token=4.0) == 0
    assert index_capacity(1000, 16, chars_per_token=0.0) == 0


def test_cached_tokens_are_whole_engine_blocks() -> None:
    assert cached_tokens(640, 1000, chars_per_token=4.0) == 160
    assert cached_tokens(700, 1000, chars_per_token=4.0) == 160  # 175 tokens: 10 blocks
    assert cached_tokens(700, 1000, chars_per_token=4.0, block_tokens=1) == 175
    assert cached_tokens(60, 1000, chars_per_token=4.0) == 0


def test_cached_tokens_never_cover_the_whole_prompt() -> None:
    # Matched whole: the last token is computed, so its block is not a hit.
    assert cached_tokens(640, 160, chars_per_token=4.0) == 144
    assert cached_tokens(640, 161, chars_per_token=4.0) == 160
    # Never more than the prompt, whatever the ratio says.
    assert cached_tokens(64_000, 100, chars_per_token=1.0) == 96
    assert cached_tokens(64_000, 100, chars_per_token=1.0, block_tokens=1) == 99
    assert cached_tokens(640, 1, chars_per_token=4.0) == 0
    assert cached_tokens(0, 1000, chars_per_token=4.0) == 0
