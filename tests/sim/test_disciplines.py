"""Each prefill discipline's defining property, on model time: exact, no sockets."""

from __future__ import annotations

import itertools

import pytest

from narwhal.sim.discipline import DISCIPLINES
from narwhal.sim.model import Scheduler, Sequence
from narwhal.sim.options import SimOptions

from .test_model import _options, _run, _ttft

# _options: 5 ms a step, 0.5 ms per decoding sequence, 10k prompt tokens/s, 1 ms a
# prefill started, a 1,024-token step budget.
STEP_S, PER_SEQ_S, RATE, START_S = 0.005, 0.0005, 10_000.0, 0.001


def _step(scheduler: Scheduler, now: float) -> float:
    step = scheduler.schedule(now)
    assert step is not None
    now += step.duration
    for seq in scheduler.finish_step(step, now).progressed:
        seq.last_token_at = now
    return now


def test_chunked_prompts_that_fit_one_budget_come_together() -> None:
    scheduler = Scheduler(_options())
    seqs = [Sequence(200, 4) for _ in range(6)]  # five fit 1,024 tokens, the sixth is cut
    _run(scheduler, [(0.0, s) for s in seqs])
    together = STEP_S + 5 * 200 / RATE + 5 * START_S + 24 / RATE + START_S
    assert [s.first_token_at for s in seqs[:5]] == [pytest.approx(together)] * 5
    assert _ttft(seqs[5]) > together


def test_serial_prompts_come_one_after_another_whole() -> None:
    # No per-sequence decode cost, so that k prompts take exactly k times one.
    options = _options(prefill_discipline="serial", decode_per_seq_ms=0.0)
    alone = Sequence(3000, 2)  # three budgets' worth, yet one step: no chunking
    _run(Scheduler(options), [(0.0, alone)])
    solo = STEP_S + 3000 / RATE + START_S
    assert _ttft(alone) == pytest.approx(solo)

    scheduler = Scheduler(options)
    seqs = [Sequence(3000, 50) for _ in range(4)]
    for seq in seqs:
        scheduler.add(seq, 0.0)
    now = 0.0
    for k in range(1, 5):
        now = _step(scheduler, now)
        assert scheduler.num_running == k and scheduler.num_waiting == 4 - k
    assert [_ttft(s) for s in seqs] == [pytest.approx(k * solo) for k in (1, 2, 3, 4)]
    # Decoding went on beside each prefill: the first got a token in each of the 4 steps.
    assert [s.produced for s in seqs] == [4, 3, 2, 1]


# vLLM's decoder takes one token of each step's budget, so 3,072 prompt tokens need four
# steps beside it; SGLang's prefill batch has the budget to itself and the decoder waits.
@pytest.mark.parametrize(("discipline", "steps", "decoded"), [("chunked", 4, 4), ("sglang", 3, 0)])
def test_sglang_stalls_decoding_for_the_whole_prefill(
    discipline: str, steps: int, decoded: int
) -> None:
    scheduler = Scheduler(_options(prefill_discipline=discipline))
    decoder = Sequence(10, 100)
    scheduler.add(decoder, 0.0)
    now = _step(scheduler, _step(scheduler, 0.0))
    assert decoder.produced == 2
    prompt = Sequence(3072, 2)  # three times the 1,024-token budget
    scheduler.add(prompt, now)
    for _ in range(steps - 1):
        now = _step(scheduler, now)
    assert prompt.produced == 0
    now = _step(scheduler, now)
    assert prompt.produced == 1
    assert decoder.produced == 2 + decoded
    now = _step(scheduler, now)  # the prefill done, decoding goes on for both
    assert decoder.produced == 3 + decoded and prompt.produced == 2


def test_sglang_batch_first_tokens_together_and_prefill_steps_skip_decode_cost() -> None:
    scheduler = Scheduler(_options(prefill_discipline="sglang"))
    decoder = Sequence(10, 100)
    scheduler.add(decoder, 0.0)
    now = _step(scheduler, 0.0)
    seqs = [Sequence(300, 4) for _ in range(3)]  # 900 tokens: one prefill batch
    for seq in seqs:
        scheduler.add(seq, now)
    step = scheduler.schedule(now)
    assert step is not None and step.decodes == [] and len(step.prefills) == 3
    # The decoder stalled, so the batch pays no per-sequence decode cost.
    assert step.duration == pytest.approx(STEP_S + 900 / RATE + 3 * START_S)
    end = now + step.duration
    scheduler.finish_step(step, end)
    assert [s.first_token_at for s in seqs] == [end] * 3
    step = scheduler.schedule(end)  # nothing waits: a decode step for all four
    assert step is not None and not step.prefills and len(step.decodes) == 4
    assert step.duration == pytest.approx(STEP_S + 4 * PER_SEQ_S)


def test_sequential_serves_one_request_at_a_time() -> None:
    scheduler = Scheduler(_options(prefill_discipline="sequential", max_num_seqs=8))
    seqs = [Sequence(100, 10) for _ in range(3)]
    for seq in seqs:
        scheduler.add(seq, 0.0)
    now = 0.0
    while scheduler.running or scheduler.waiting:
        now = _step(scheduler, now)
        assert scheduler.num_running <= 1
        assert scheduler.num_running + scheduler.num_waiting == sum(not s.finished for s in seqs)
    for first, second in itertools.pairwise(seqs):
        assert first.produced == 10
        assert second.first_token_at is not None and second.first_token_at > first.last_token_at


@pytest.mark.parametrize("discipline", sorted(DISCIPLINES))
def test_kv_books_balance_under_pressure(discipline: str) -> None:
    # 18 blocks of 16 tokens; a 120-token prompt takes 8 of them, and grows.
    scheduler = Scheduler(
        _options(prefill_discipline=discipline, kv_capacity_tokens=300, max_model_len=300)
    )
    seqs = [Sequence(120, 60) for _ in range(3)]
    _run(scheduler, [(0.0, s) for s in seqs])
    assert all(s.produced == 60 and s.finished for s in seqs)
    assert scheduler.used_blocks == 0
    # Two running at once outgrow the cache and one is preempted; one at a time never is.
    assert (scheduler.preemptions > 0) is (discipline != "sequential")


@pytest.mark.parametrize("discipline", sorted(DISCIPLINES))
def test_prefix_cache_hits_and_remote_kv_under_every_discipline(discipline: str) -> None:
    options = _options(prefill_discipline=discipline)
    shared = list(range(512))
    first = Sequence(600, 4, token_ids=[*shared, *range(1000, 1092)])
    second = Sequence(600, 4, token_ids=[*shared, *range(2000, 2092)])
    scheduler = Scheduler(options)
    _run(scheduler, [(0.0, first), (1.0, second)])
    assert first.cached_tokens == 0 and second.cached_tokens == 512
    assert scheduler.prefill_tokens == 600 + 88

    local, remote = Sequence(8000, 2), Sequence(8000, 2, prefilled=True)
    _run(Scheduler(options), [(0.0, local)])
    _run(Scheduler(options), [(0.0, remote)])
    assert _ttft(remote) < _ttft(local) / 50


@pytest.mark.parametrize("discipline", sorted(DISCIPLINES))
def test_held_kv_for_a_remote_decoder(discipline: str) -> None:
    scheduler = Scheduler(_options(prefill_discipline=discipline))
    held, after = Sequence(500, 1, keep_kv=True), Sequence(100, 3)
    _run(scheduler, [(0.0, held), (0.0, after)])
    assert after.produced == 3  # a held prefill does not occupy the engine
    assert scheduler.held_blocks == 32 and scheduler.used_blocks == 32
    scheduler.release_held(held)
    assert scheduler.used_blocks == 0


def test_unknown_discipline_is_refused() -> None:
    with pytest.raises(ValueError, match="prefill_discipline"):
        SimOptions(prefill_discipline="fifo")  # type: ignore[arg-type]
