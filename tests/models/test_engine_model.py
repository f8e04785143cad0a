"""One engine's model against a synthetic engine: it learns service times under load,
projects the backlog, scores drift and survives absurd samples."""

from __future__ import annotations

import math
import random

import pytest

from narwhal.models.drift import DRIFT_THRESHOLD
from narwhal.models.engine import EngineModel
from narwhal.models.profile import ConcurrentSample, ProbeSample, fit_concurrency, fit_profile


def profiled(a: float = 0.008, b: float = 0.05, tpot: float = 0.006) -> EngineModel:
    model = EngineModel("e")
    samples = [ProbeSample(p, a + b * p / 1000, tpot) for p in (64, 512, 2048, 64)]
    model.install(fit_profile(samples, source="token_ids", wall=0.0, now=0.0))
    return model


def serve_alone(model: EngineModel, prompts: list[int], speed: float, start: float) -> float:
    """An engine prefilling at `speed` x the profile, one prompt at a time."""
    now = start
    for i, p in enumerate(prompts):
        model.prefill_placed(i, p, 0.0, now)
        now += speed * (0.008 + 0.05 * p / 1000)
        model.prefill_finished(i, now)
        now += 0.5
    return now


def test_projects_the_steps_of_placed_work() -> None:
    model = profiled()
    costs = model.step_costs(0.0)
    assert costs.per_token == pytest.approx(50e-6) and costs.base == pytest.approx(0.006)
    assert model.ttft(1000, 0.0, 0.0) == pytest.approx(model.solo(1000))
    for i in range(4):
        model.prefill_placed(i, 1000, 0.0, 0.0)  # one step holds all four
    in_step = costs.base + 4000 * costs.per_token + 4 * costs.per_prompt
    # (plus the prompts expected to join the next step at the rate these came: ~10%)
    assert in_step < model.backlog(0.0) < 1.15 * in_step
    # Placed 0.03 s later, a prompt waits for that step and gets the next.
    own = costs.base + 1000 * costs.per_token + costs.per_prompt
    assert model.ttft(1000, 0.0, 0.03) == pytest.approx(in_step - 0.03 + own, rel=0.15)


def test_learns_an_engine_slower_than_its_profile() -> None:
    model = profiled()
    rng = random.Random(1)
    serve_alone(model, [rng.randint(100, 4000) for _ in range(300)], speed=1.5, start=0.0)
    for p in (200, 1000, 3000):
        assert model.service(p, 0.0) == pytest.approx(1.5 * (0.008 + 0.05 * p / 1000), rel=0.1)
    assert model.prefill_drift.score == pytest.approx(math.log(1.5), abs=0.1)


def test_tpot_drift_rises_past_the_threshold_and_reprofiling_resets_it() -> None:
    model = profiled()
    for _ in range(30):
        model.observe_tpot(0.006, 0.0, 1.0)
    assert not model.drifted and model.penalty == 1.0
    for _ in range(30):
        model.observe_tpot(0.012, 0.0, 2.0)
    assert model.drifted and model.tpot_drift.score > DRIFT_THRESHOLD
    assert model.penalty == pytest.approx(1 + model.drift) and model.penalty > 1.5
    for _ in range(300):
        model.observe_tpot(0.012, 0.0, 2.0)
    assert model.tpot(0.0, 2.0) == pytest.approx(0.012, rel=0.1)  # the fit follows
    profile = model.profile
    assert profile is not None
    model.install(profile)  # (a re-profile installs a new baseline)
    assert not model.drifted and model.penalty == 1.0


def test_absurd_samples_stay_finite_and_the_model_recovers() -> None:
    model = profiled()
    model.prefill_placed("stall", 1000, 0.0, 0.0)
    model.prefill_finished("stall", 600.0)  # a 10-minute stall
    model.prefill_placed("jump", 1000, 0.0, 700.0)
    model.prefill_finished("jump", 650.0)  # the clock went back
    for bad in (0.0, -1.0, math.nan, math.inf, 1e9):
        model.observe_tpot(bad, 0.0, 700.0)
        model.observe_first_step(1000, bad)
    for key in ("x", "y"):
        model.prefill_placed(key, 1000, 0.0, 700.0)
        model.prefill_dropped(key, 700.0)
    assert math.isfinite(model.service(1000, 0.0)) and model.service(1000, 0.0) > 0
    assert math.isfinite(model.tpot(10.0, 700.0)) and model.backlog(700.0) == 0.0
    now = serve_alone(model, [1000] * 300, speed=1.0, start=800.0)
    for _ in range(300):
        model.observe_tpot(0.006, 0.0, now)
    assert model.service(1000, 0.0) == pytest.approx(0.058, rel=0.1)
    assert model.tpot(0.0, now + 100) == pytest.approx(0.006, rel=0.1)


def test_state_is_bounded_by_the_requests_in_flight() -> None:
    model = profiled()
    for i in range(10_000):
        model.prefill_placed(i, 500, 0.0, float(i))
        model.prefill_finished(i, float(i) + 0.03)
    assert len(model.lane) == 0 and not model._pending


def test_full_sequence_slots_make_a_prompt_wait_for_the_first_decode_to_end() -> None:
    model = profiled()
    model.max_sequences = 2
    model.decoding.start("short", "chat", 100, 20, produced=10)  # 10 tokens left
    model.decoding.start("long", "chat", 100, 1000, produced=10)
    free = model.ttft(1000, 2.0, 0.0, sequences=1)
    full = model.ttft(1000, 2.0, 0.0, sequences=2)
    tpot = model.tpot(2.0, 0.0)
    assert free == pytest.approx(model.solo(1000), rel=0.2)
    assert full == pytest.approx(10 * tpot + model.service(1000, 2.0), rel=0.01)


def test_a_full_kv_cache_makes_a_prompt_wait_for_decodes_to_free_room() -> None:
    model = profiled()
    model.decoding.start("a", "chat", 40_000, 100, produced=50)  # 50 left, holds 40,050
    model.decoding.start("b", "chat", 40_000, 1000, produced=50)
    # Half full: the cache holds about 160,200 tokens, learned from what these hold.
    assert model.ttft(2000, 2.0, 0.0, kv_usage=0.5) == pytest.approx(model.solo(2000), rel=0.2)
    assert model.kv_capacity == pytest.approx(160_200, rel=0.01)
    # Full: room for the prompt comes when the request with the least left finishes.
    waited = model.ttft(2000, 2.0, 0.0, kv_usage=1.0)
    assert waited == pytest.approx(50 * model.tpot(2.0, 0.0) + model.service(2000, 2.0), rel=0.01)


def test_a_drift_the_probes_do_not_see_moves_the_baseline_and_keeps_what_was_learned() -> None:
    """Solo requests take 1.8x what the profile says while probes, alone, measure it as
    profiled (a chat template rendered on a busy host: the probes send none). Accepting
    the drift measures it from the learned fit from then on: the same slowness is no drift
    any more, a further change is; the calibration keeps its samples, unlike a new
    profile's install."""
    model = profiled()
    rng = random.Random(2)
    prompts = [rng.randint(500, 3500) for _ in range(300)]
    now = serve_alone(model, prompts, speed=1.8, start=0.0)
    assert model.drifted
    for _ in range(50):  # (first tokens measured against their projections)
        model.calibration.add(0.1, 0.12)
    samples = model.calibration.samples
    assert samples == 50
    assert model.probe_size_hint() == sorted(prompts[-64:])[int(0.9 * 63)]
    model.accept_drift()
    assert not model.drifted and model.prefill_drift.score == 0.0
    assert model.calibration.samples == samples
    now = serve_alone(model, prompts, speed=1.8, start=now)
    assert not model.drifted, model.prefill_drift.value
    serve_alone(model, prompts, speed=1.8 * 1.8, start=now)
    assert model.drifted and model.prefill_drift.score > DRIFT_THRESHOLD


def test_a_drifts_re_profile_keeps_the_bounds_calibration_and_a_new_process_resets_it() -> None:
    """A re-profile for drift is of the engine that was serving: the fits restart from
    its new baseline, but the bound's calibration keeps what the engine's first tokens
    taught it (reset, the bound is back to a handful of samples, exceeded far more often:
    on a real vLLM under load, probes among its requests re-profiled it every 35 s). A
    restarted engine's re-profile starts the calibration afresh."""
    model = profiled()
    for _ in range(300):
        model.calibration.add(0.3, 0.45)  # 1.5x later than projected, every time
    learned = model.calibration.upper(0.3)
    again = fit_profile(
        [ProbeSample(p, 0.009 + 0.06 * p / 1000, 0.007) for p in (64, 512, 2048, 64)],
        source="token_ids",
        wall=1.0,
        now=1.0,
    )
    model.install(again, same_process=True)
    assert model.profile is again and model.calibration.samples == 300
    assert model.calibration.upper(0.3) == pytest.approx(learned)
    model.install(again)  # a new process behind the name
    assert model.calibration.samples == 0


def test_no_probe_size_hint_before_enough_solo_prefills() -> None:
    model = profiled()
    serve_alone(model, [3000] * 7, speed=1.0, start=0.0)
    assert model.probe_size_hint() is None
    serve_alone(model, [3000], speed=1.0, start=100.0)
    assert model.probe_size_hint() == 3000


def test_a_burst_onto_an_idle_engine_does_not_teach_its_time_as_one_prompts_prefill() -> None:
    """The first prompt of a burst is placed on an idle engine, the rest a moment later,
    and the engine serves them in the same steps: its first token comes when the burst's
    does. That is not what the prompt costs alone (what the fit and the class of prompts
    alone, which the prompt-alone 429 reads, learn from), however many bursts come."""
    model = profiled()
    p = 2700
    alone = model.solo(p)
    bound = model.calibration.upper(alone, alone=True)
    now = 0.0
    for burst in range(30):
        keys = [(burst, i) for i in range(24)]
        for i, key in enumerate(keys):
            model.prefill_placed(key, p, 0.0, now + 0.001 * i, projected=alone)
        now += 24 * alone  # served together: every first token at the burst's end
        for key in keys:
            model.prefill_finished(key, now)
        now += 2.0
    assert model.solo(p) == pytest.approx(alone, rel=0.05)
    assert model.calibration.upper(alone, alone=True) <= 1.05 * bound


def test_a_step_budget_the_concurrent_probes_showed_smaller_stands() -> None:
    """vLLM on CPU prefills 2,048 tokens a step, and says so nowhere on the wire: the
    concurrent probes' steps of two 1,024-token prompts bound the budget the model's steps
    and its censored rate assume (the configured one, vLLM's GPU default, stands above)."""
    samples = [ProbeSample(p, 0.008 + 0.05 * p / 1000, 0.006) for p in (64, 512, 2048, 64)]
    profile = fit_profile(samples, source="token_ids", wall=0.0, now=0.0)
    seen = fit_concurrency(ConcurrentSample(1024, (0.11, 0.11, 0.22, 0.22)), 0.059)
    model = EngineModel("e")
    model.install(profile.with_concurrency(seen))
    assert model.step_costs(0.0).budget == 3 * 1024
    small = EngineModel("e", step_budget=1024)
    small.install(profile.with_concurrency(seen))
    assert small.step_costs(0.0).budget == 1024
    together = fit_concurrency(ConcurrentSample(1024, (0.2, 0.2, 0.2, 0.2)), 0.059)
    wide = EngineModel("e")
    wide.install(profile.with_concurrency(together))
    assert wide.step_costs(0.0).budget == 8192
