"""Automatic prefix caching, sans-IO: the block pool alone, then inside the scheduler.

Block size 4 throughout, so block boundaries are easy to count: a 10-token prompt is
blocks [0-3] [4-7] and a partial [8-9].
"""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.sim.model import Scheduler, Sequence
from narwhal.sim.options import SimOptions
from narwhal.sim.prefix_cache import BlockPool, extend_hashes

SIZE = 4


def _hashes(tokens: list[int]) -> list[int]:
    hashes: list[int] = []
    extend_hashes(hashes, tokens, SIZE, len(tokens) // SIZE)
    return hashes


def _cache(pool: BlockPool, tokens: list[int]) -> list[Any]:
    """Allocate blocks for `tokens`, register the full ones, free them (a finished request)."""
    blocks = pool.allocate(-(-len(tokens) // SIZE))
    for block, block_hash in zip(blocks, _hashes(tokens), strict=False):
        pool.register(block, block_hash)
    pool.free(blocks)
    return blocks


# -- the pool ----------------------------------------------------------------------------
def test_chain_hash_stands_for_the_whole_prefix() -> None:
    a = _hashes([1, 2, 3, 4, 5, 6, 7, 8])
    b = _hashes([9, 2, 3, 4, 5, 6, 7, 8])  # same second block, different first
    assert a[1] != b[1]
    assert _hashes([1, 2, 3, 4, 5, 6, 7, 8, 9]) == a  # a partial block has no hash


def test_lookup_walks_from_the_start_and_stops_at_the_first_miss() -> None:
    pool = BlockPool(16, SIZE, caching=True)
    cached = _cache(pool, list(range(12)))  # three full blocks
    same = [*range(12), 99]
    assert pool.lookup(_hashes(same), len(same)) == cached
    # Block 1 differs: block 2's tokens are the same, but its chain is not, so one hit.
    second_differs = [0, 1, 2, 3, 40, 5, 6, 7, 8, 9, 10, 11, 99]
    assert pool.lookup(_hashes(second_differs), 13) == cached[:1]
    first_differs = [40, *range(1, 12), 99]
    assert pool.lookup(_hashes(first_differs), 13) == []


def test_no_hit_after_a_miss_even_if_later_blocks_are_still_cached() -> None:
    pool = BlockPool(3, SIZE, caching=True)
    blocks = pool.allocate(3)
    for block, block_hash in zip(blocks, _hashes(list(range(12))), strict=True):
        pool.register(block, block_hash)
    pool.free(blocks[:1])  # the head freed first (so evicted first), then the rest
    pool.free(blocks[1:])
    pool.allocate(1)
    assert blocks[0].block_hash is None and blocks[1].block_hash is not None
    assert pool.lookup(_hashes([*range(12), 99]), 13) == []


def test_the_last_token_is_never_a_hit() -> None:
    pool = BlockPool(16, SIZE, caching=True)
    cached = _cache(pool, list(range(8)))
    # The whole 8-token prompt is cached, but its last token must be computed: only
    # whole blocks hit, so the last block is recomputed.
    assert pool.lookup(_hashes(list(range(8))), 8) == cached[:1]
    # One token more and both blocks are hits.
    assert pool.lookup(_hashes([*range(8), 8]), 9) == cached


def test_freed_blocks_are_evicted_least_recently_freed_first_and_tail_first() -> None:
    pool = BlockPool(6, SIZE, caching=True)
    a = _cache(pool, list(range(12)))  # blocks a0 a1 a2, freed a2, a1, a0
    b = _cache(pool, list(range(100, 112)))  # then b2, b1, b0
    assert pool.num_free == 6 and pool.num_used == 0  # cached but free: not in use
    ids = [block.block_id for block in (*reversed(a), *reversed(b))]
    assert pool.free_order() == ids
    pool.allocate(1)  # evicts a's tail: a prompt sharing a's first two blocks still hits them
    assert pool.lookup(_hashes([*range(12), 99]), 13) == a[:2]
    pool.allocate(2)  # then the rest of a, before anything of b
    assert pool.lookup(_hashes([*range(12), 99]), 13) == []
    assert pool.lookup(_hashes([*range(100, 112), 99]), 13) == b


def test_a_hit_takes_its_block_off_the_free_queue() -> None:
    pool = BlockPool(3, SIZE, caching=True)
    cached = _cache(pool, list(range(8)))  # 2 blocks, one block never used
    hits = pool.lookup(_hashes([*range(8), 9]), 9)
    assert pool.can_allocate(1, hits)  # the unused block for the partial tail
    assert not pool.can_allocate(2, hits)  # reusing them means they are no longer free
    pool.touch(hits)
    assert pool.num_used == 2 and all(block.ref_cnt == 1 for block in cached)
    assert pool.allocate(1)[0] not in cached


def test_blocks_in_use_are_never_evicted() -> None:
    pool = BlockPool(4, SIZE, caching=True)
    running = pool.allocate(3)
    for block, block_hash in zip(running, _hashes(list(range(12))), strict=True):
        pool.register(block, block_hash)
    assert not pool.can_allocate(2)
    with pytest.raises(ValueError):
        pool.allocate(2)
    pool.allocate(1)
    assert pool.lookup(_hashes([*range(12), 99]), 13) == running


def test_caching_off_finds_nothing() -> None:
    pool = BlockPool(8, SIZE, caching=False)
    _cache(pool, list(range(12)))
    assert pool.lookup(_hashes([*range(12), 99]), 13) == []


# -- in the scheduler ----------------------------------------------------------------------
def _options(**fields: Any) -> SimOptions:
    base: dict[str, Any] = {
        "block_size": SIZE,
        "kv_capacity_tokens": 4096,
        "max_model_len": 4096,
        "decode_base_ms": 5.0,
        "decode_per_seq_ms": 0.0,
        "prefill_tokens_per_s": 1000.0,
        "prefill_overhead_ms": 1.0,
        "max_num_batched_tokens": 4096,
    }
    return SimOptions(**(base | fields))


def _seq(prompt: list[int], output: int = 2, **kw: Any) -> Sequence:
    outputs = [7000 + i for i in range(output)]
    return Sequence(len(prompt), output, token_ids=prompt + outputs, **kw)


def _step(scheduler: Scheduler, now: float = 0.0) -> float:
    """Plan and apply one engine step; returns the model time after it."""
    step = scheduler.schedule(now)
    assert step is not None
    scheduler.finish_step(step, now + step.duration)
    return now + step.duration


def _serve(scheduler: Scheduler, seq: Sequence) -> float:
    """Run one sequence to its end alone; returns its modelled time to first token."""
    scheduler.add(seq, 0.0)
    clock = 0.0
    while not seq.finished:
        clock = _step(scheduler, clock)
    assert seq.first_token_at is not None
    return seq.first_token_at


def test_second_prompt_with_the_same_prefix_prefills_only_the_rest() -> None:
    scheduler = Scheduler(_options())
    shared = list(range(1000, 1400))  # 100 blocks
    first = _serve(scheduler, _seq([*shared, 1, 2, 3]))
    computed = scheduler.prefill_tokens
    second_seq = _seq([*shared, 4, 5, 6])
    second = _serve(scheduler, second_seq)
    assert second_seq.cached_tokens == 400
    assert scheduler.prefill_tokens - computed == 3
    # The model's formula, unchanged, over the uncached tokens only.
    assert first == pytest.approx(0.005 + 403 / 1000 + 0.001)
    assert second == pytest.approx(0.005 + 3 / 1000 + 0.001)
    assert (scheduler.counters.queries, scheduler.counters.hits) == (806, 400)


def test_partial_last_block_is_never_cached() -> None:
    scheduler = Scheduler(_options())
    _serve(scheduler, _seq(list(range(10)), output=1))  # [0-3] [4-7] [8-9] then nothing
    longer = _seq([*range(10), 10, 11, 12])
    _serve(scheduler, longer)
    assert longer.cached_tokens == 8


def test_a_fully_cached_prompt_recomputes_its_last_block() -> None:
    scheduler = Scheduler(_options())
    _serve(scheduler, _seq(list(range(8))))
    again = _seq(list(range(8)))
    _serve(scheduler, again)
    assert again.cached_tokens == 4 and scheduler.counters.hits == 4


def test_generated_tokens_are_cached_too() -> None:
    # A follow-up turn quotes the first answer: the answer's full blocks are hits as well.
    scheduler = Scheduler(_options())
    prompt = list(range(6))
    first = _seq(prompt, output=6)  # tokens 0-5 then 7000-7005: blocks of 12 tokens
    _serve(scheduler, first)
    assert first.token_ids is not None
    follow_up = _seq([*first.token_ids, 1, 2, 3])
    _serve(scheduler, follow_up)
    # Computed: the prompt and the first five outputs (the sixth was sampled, never fed).
    assert follow_up.cached_tokens == 8


def test_identical_requests_admitted_together_share_the_blocks_being_computed() -> None:
    scheduler = Scheduler(_options())
    a, b = _seq(list(range(40))), _seq(list(range(40)))
    scheduler.add(a, 0.0)
    scheduler.add(b, 0.0)
    step = scheduler.schedule(0.0)
    assert step is not None
    assert [(s, chunk) for s, chunk in step.prefills] == [(a, 40), (b, 4)]
    assert scheduler.used_blocks == 11  # ten shared blocks and b's own last one


def test_shared_blocks_count_once_and_stay_while_one_user_runs() -> None:
    scheduler = Scheduler(_options())
    a = _seq(list(range(40)), output=50)
    scheduler.add(a, 0.0)
    _step(scheduler)  # a: 10 full blocks, cached as they are computed
    b = _seq([*range(40), 1], output=1)
    scheduler.add(b, 0.0)
    _step(scheduler)  # a takes an 11th block for its next token; b reuses a's 10
    assert b.finished and b.cached_tokens == 40
    # b's own last block went back to the pool; the shared ones are still a's.
    assert scheduler.used_blocks == len(a.blocks) == 11
    assert all(block.ref_cnt == 1 for block in a.blocks)


def test_finished_requests_leave_their_prefix_cached_but_free() -> None:
    scheduler = Scheduler(_options())
    _serve(scheduler, _seq(list(range(40))))
    assert scheduler.used_blocks == 0 and scheduler.kv_usage == 0.0
    assert scheduler.pool.num_cached_free() == 10


def test_cached_free_blocks_are_evicted_but_running_ones_never() -> None:
    scheduler = Scheduler(_options(kv_capacity_tokens=48, max_model_len=48))  # 12 blocks
    old = list(range(500, 508))
    _serve(scheduler, _seq(old, output=1))  # leaves 2 cached, free blocks
    runner = _seq(list(range(36)), output=100)
    scheduler.add(runner, 0.0)
    _step(scheduler)  # 9 blocks of the 10 never used
    newcomer = _seq(list(range(900, 906)))
    scheduler.add(newcomer, 0.0)
    _step(scheduler)  # the runner takes the last unused block; the newcomer evicts old's
    assert len(runner.blocks) == 10 and len(newcomer.blocks) == 2
    assert scheduler.pool.lookup(_hashes(old), len(old) + 1) == []
    late = _seq([1, 2])
    scheduler.add(late, 0.0)
    scheduler.schedule(0.0)
    assert scheduler.num_waiting == 1  # nothing free, and running blocks are not for taking
    assert scheduler.pool.lookup(_hashes(list(range(36))), 37) == runner.blocks[:9]


def test_a_preempted_requests_second_lookup_is_not_counted() -> None:
    scheduler = Scheduler(_options(kv_capacity_tokens=24, max_model_len=24))  # 6 blocks
    a, b = _seq(list(range(8)), output=8), _seq(list(range(100, 108)), output=8)
    for seq in (a, b):
        scheduler.add(seq, 0.0)
    clock = 0.0
    while not (a.finished and b.finished):
        clock = _step(scheduler, clock)
    assert scheduler.preemptions > 0
    assert scheduler.counters.queries == 16  # each prompt once, at its first admission


def test_caching_off_never_hits_and_counts_nothing() -> None:
    scheduler = Scheduler(_options(enable_prefix_caching=False))
    shared = list(range(100))
    _serve(scheduler, _seq(shared))
    again = _seq(shared)
    _serve(scheduler, again)
    assert again.cached_tokens == 0
    assert scheduler.prefill_tokens == 200
    assert (scheduler.counters.queries, scheduler.counters.hits) == (0, 0)
