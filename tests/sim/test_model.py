"""The scheduler alone, on model time: exact, no sockets, no sleeping."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.sim.model import Scheduler, SeqState, Sequence
from narwhal.sim.options import SimOptions


def _options(**fields: Any) -> SimOptions:
    base: dict[str, Any] = {
        "decode_base_ms": 5.0,
        "decode_per_seq_ms": 0.5,
        "prefill_tokens_per_s": 10_000.0,
        "prefill_overhead_ms": 1.0,
        "max_num_batched_tokens": 1024,
    }
    return SimOptions(**(base | fields))


def _run(scheduler: Scheduler, arrivals: list[tuple[float, Sequence]]) -> float:
    """Advance model time step by step until every sequence finished; returns the end time."""
    now = 0.0
    pending = sorted(arrivals, key=lambda item: item[0])
    while pending or scheduler.running or scheduler.waiting:
        while pending and pending[0][0] <= now:
            scheduler.add(pending.pop(0)[1], now)
        step = scheduler.schedule(now)
        if step is None:
            now = pending[0][0] if pending else now
            continue
        now += step.duration
        for seq in scheduler.finish_step(step, now).progressed:
            seq.last_token_at = now
    return now


def _ttft(seq: Sequence) -> float:
    assert seq.first_token_at is not None
    return seq.first_token_at - seq.arrival


def _tpot(seq: Sequence) -> float:
    assert seq.first_token_at is not None
    return (seq.last_token_at - seq.first_token_at) / (seq.produced - 1)


def test_ttft_grows_with_prompt_length() -> None:
    short, long = Sequence(100, 2), Sequence(5000, 2)
    _run(Scheduler(_options()), [(0.0, short)])
    _run(Scheduler(_options()), [(0.0, long)])
    assert _ttft(long) > 5 * _ttft(short)
    # 5000 tokens at 10k/s, in chunks of 1024 (one step each), plus step and request overheads
    assert _ttft(long) == pytest.approx(0.5 + 5 * 0.005 + 0.001, rel=1e-6)


def test_ttft_grows_with_queue_depth() -> None:
    scheduler = Scheduler(_options())
    seqs = [Sequence(2000, 2) for _ in range(4)]
    _run(scheduler, [(0.0, s) for s in seqs])
    ttfts = [_ttft(s) for s in seqs]
    assert ttfts == sorted(ttfts)
    assert ttfts[-1] > 3 * ttfts[0]


def test_tpot_grows_with_running_sequences() -> None:
    alone = Sequence(10, 50)
    _run(Scheduler(_options()), [(0.0, alone)])
    crowd = [Sequence(10, 50) for _ in range(64)]
    _run(Scheduler(_options()), [(0.0, s) for s in crowd])
    assert _tpot(alone) == pytest.approx(0.0055)
    assert _tpot(crowd[0]) == pytest.approx(0.005 + 64 * 0.0005)


def test_max_num_seqs_makes_requests_wait() -> None:
    scheduler = Scheduler(_options(max_num_seqs=2))
    seqs = [Sequence(10, 5) for _ in range(5)]
    for seq in seqs:
        scheduler.add(seq, 0.0)
    step = scheduler.schedule(0.0)
    assert step is not None
    assert scheduler.num_running == 2 and scheduler.num_waiting == 3
    _run(scheduler, [])
    assert all(s.finished and s.produced == 5 for s in seqs)


def test_kv_exhaustion_queues_then_preempts() -> None:
    # 300 tokens of 16-token blocks: 18 blocks. A 120-token prompt takes 8 of them.
    scheduler = Scheduler(_options(kv_capacity_tokens=300, max_model_len=300))
    seqs = [Sequence(120, 60) for _ in range(3)]
    for seq in seqs:
        scheduler.add(seq, 0.0)
    scheduler.schedule(0.0)
    assert scheduler.num_running == 2 and scheduler.num_waiting == 1  # the third does not fit
    assert scheduler.used_blocks == 16
    assert scheduler.kv_usage == pytest.approx(16 / 18)
    _run(scheduler, [])
    assert scheduler.preemptions > 0  # the two running ones outgrew the cache
    assert all(s.produced == 60 for s in seqs)
    assert scheduler.used_blocks == 0


def test_remote_prefilled_sequence_skips_prefill() -> None:
    local, remote = Sequence(8000, 2), Sequence(8000, 2, prefilled=True)
    _run(Scheduler(_options()), [(0.0, local)])
    _run(Scheduler(_options()), [(0.0, remote)])
    assert _ttft(remote) < _ttft(local) / 50


def test_ready_at_holds_a_sequence_back_without_blocking_others() -> None:
    scheduler = Scheduler(_options())
    late, early = Sequence(10, 2, ready_at=1.0), Sequence(10, 2)
    scheduler.add(late, 0.0)
    scheduler.add(early, 0.0)
    step = scheduler.schedule(0.0)
    assert step is not None and [s for s, _ in step.prefills] == [early]
    assert scheduler.next_ready_time() == 1.0
    assert late.state is SeqState.WAITING


def test_drift_multiplies_decode_steps() -> None:
    plain = Scheduler(_options())
    drifted = Scheduler(_options(drift_factor=3.0), drift_at=0.0)
    for scheduler in (plain, drifted):
        seq = Sequence(10, 10)
        scheduler.add(seq, 0.0)
        step = scheduler.schedule(0.0)
        assert step is not None
        scheduler.finish_step(step, 0.0)
    decode_plain, decode_drifted = plain.schedule(1.0), drifted.schedule(1.0)
    assert decode_plain is not None and decode_drifted is not None
    assert decode_drifted.duration == pytest.approx(3 * decode_plain.duration)


def test_held_kv_counts_until_released() -> None:
    scheduler = Scheduler(_options())
    seq = Sequence(500, 1, keep_kv=True)
    _run(scheduler, [(0.0, seq)])
    assert scheduler.held_blocks == 32 and scheduler.used_blocks == 32  # ceil(500 / 16)
    scheduler.release_held(seq)
    assert scheduler.used_blocks == 0 and scheduler.held_blocks == 0
    scheduler.release_held(seq)  # a second release (lease expiry after a pull) is harmless
    assert scheduler.used_blocks == 0 and scheduler.held_blocks == 0


def test_abort_frees_everything() -> None:
    scheduler = Scheduler(_options())
    running, waiting = Sequence(100, 50), Sequence(100, 50, ready_at=5.0)
    scheduler.add(running, 0.0)
    scheduler.add(waiting, 0.0)
    scheduler.schedule(0.0)
    scheduler.abort(running)
    scheduler.abort(waiting)
    assert scheduler.used_blocks == 0 and not scheduler.running and not scheduler.waiting
    assert running.aborted and waiting.finished


def test_options_validate() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        SimOptions(max_num_seqs=0)
    with pytest.raises(ValueError, match="time_scale"):
        SimOptions(time_scale=-1)
    with pytest.raises(ValueError, match="block_size"):
        SimOptions(block_size=0)
    with pytest.raises(ValueError, match="at least one block"):
        SimOptions(kv_capacity_tokens=8, block_size=16)
    # The context is what whole blocks hold: a lone sequence always fits.
    assert SimOptions(kv_capacity_tokens=1000, max_model_len=4096).context_len == 992
    assert SimOptions(kv_capacity_tokens=1000, block_size=8).num_gpu_blocks == 125
