"""An engine whose bound refuses requests while it is idle is probed, and learns again
(sans-IO: the model and the pace of its probes; the probes themselves, against a real
sim, are in tests/e2e/test_profiling.py)."""

from __future__ import annotations

import itertools

from narwhal.models.book import ModelBook
from narwhal.models.engine import EngineModel
from narwhal.models.idle_refusals import IDLE_REFUSALS_AFTER_S, IdleRefusals
from narwhal.models.profile import ProbeSample, fit_profile

BUDGET = 0.5
TOKENS = 3242


def _stuck_engine() -> tuple[EngineModel, float]:
    """The busy-core failure of the real-vLLM onset test, replayed: a profile of 7.3 ms
    + 38.9 ms per 1k tokens, then one 3,242-token prompt served in 0.329 s on the idle
    engine (the profile says 0.133): from then on its bound refuses that prompt."""
    book = ModelBook(["e"], ttft_budget_s=BUDGET)
    model = book.model("e")
    a, b = 0.0073, 0.0389
    samples = [ProbeSample(p, a + b * p / 1000, 0.0066) for p in (64, 512, 2048, 64)]
    model.install(fit_profile(samples, source="token_ids", wall=0.0, now=0.0))
    now = 100.0
    raw = model.ttft(TOKENS, 0.0, now)
    assert model.upper(raw, now) <= BUDGET  # admitted
    model.prefill_placed("client", TOKENS, 0.0, now, raw)
    now += 0.329
    model.prefill_finished("client", now)
    now += 1.0
    raw = model.ttft(TOKENS, 0.0, now)
    assert model.idle and model.upper(raw, now) > BUDGET  # refused from now on
    return model, now


def test_an_engine_refused_while_idle_is_admitted_again_once_probes_measure_it() -> None:
    model, now = _stuck_engine()
    refusals = model.idle_refusals
    probes = 0
    for _ in range(20):  # 20 s of one request a second
        raw = model.ttft(TOKENS, 0.0, now)
        if model.upper(raw, now) <= BUDGET:
            break
        refusals.refused(TOKENS, now)
        due = refusals.due(now, idle=model.idle)
        if due is not None:
            # What the profiler does: a probe of that length, placed as a client request
            # is; the engine serves it as its profile said.
            assert due == TOKENS
            refusals.probing(now)
            probes += 1
            projected = model.ttft(due, 0.0, now)
            model.prefill_placed(("probe", probes), due, 0.0, now, projected, 16, probe=True)
            model.prefill_finished(("probe", probes), now + 0.135)
        now += 1.0
    else:
        raise AssertionError(f"still refused after {probes} probes")
    assert 1 <= probes <= 3


def test_without_probes_the_same_engine_stays_refused() -> None:
    """What the probes are for: nothing else moves the bound of an idle engine."""
    model, now = _stuck_engine()
    for _ in range(60):
        now += 1.0
        raw = model.ttft(TOKENS, 0.0, now)
        assert model.upper(raw, now) > BUDGET


def test_probes_wait_for_refusals_and_back_off_while_they_go_on() -> None:
    refusals = IdleRefusals()
    assert refusals.due(10.0, idle=True) is None  # nothing refused
    refusals.refused(900, 10.0)
    assert refusals.due(10.0 + IDLE_REFUSALS_AFTER_S / 2, idle=True) is None  # not yet
    assert refusals.due(10.0 + IDLE_REFUSALS_AFTER_S, idle=False) is None  # work in flight
    sent = []
    now = 10.0
    while now < 80.0:
        refusals.refused(1000, now)
        if refusals.due(now, idle=True) == 1000:
            refusals.probing(now)
            sent.append(now)
        now += 0.25
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert gaps == sorted(gaps) and gaps[-1] <= 30.0 + IDLE_REFUSALS_AFTER_S
    assert len(sent) <= 8  # 1, 2, 4, 8, 16, 30 ... seconds apart, not one per refusal
    # A client request placed there ends the episode: the next needs refusals again,
    # and keeps the pace (long prompts refused while short ones are admitted must not
    # bring a probe a second); a minute without a probe, and it starts over.
    refusals.placed()
    assert refusals.due(now, idle=True) is None
    refusals.refused(1000, now)
    assert refusals.due(now + IDLE_REFUSALS_AFTER_S, idle=True) is None
    assert refusals.due(sent[-1] + 30.0, idle=True) == 1000
    refusals.probing(sent[-1] + 30.0)
    refusals.refused(1000, sent[-1] + 31.0)
    assert refusals.due(sent[-1] + 32.0, idle=True) is None
    assert refusals.due(sent[-1] + 30.0 + 60.0, idle=True) == 1000
    assert refusals.episode == 0  # the pace started over


def test_a_client_placement_ends_the_episode_and_a_probe_does_not() -> None:
    model, now = _stuck_engine()
    refusals = model.idle_refusals
    refusals.refused(TOKENS, now)
    model.prefill_placed("probe", TOKENS, 0.0, now, 0.2, 16, probe=True)
    model.prefill_dropped("probe", now)
    assert refusals.due(now + 2.0, idle=True) == TOKENS
    model.prefill_placed("client", TOKENS, 0.0, now, 0.2)
    assert refusals.due(now + 2.0, idle=True) is None
