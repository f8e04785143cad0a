"""The predictive check, sans-IO: the two 429 rows with their codes, envelopes,
Retry-After rounding and counters, and the projection it admits with."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from narwhal.admission.classes import PriorityClasses
from narwhal.admission.predictive import ACTIVE_CLASS_S, CLASS_HOLD_S, PredictiveCheck
from narwhal.config import AdmissionConfig, EngineConfig
from narwhal.errors import PromptExceedsTtftBudget, TtftBudgetExceeded
from narwhal.fleet.state import EngineHealth
from narwhal.models.book import ModelBook
from narwhal.models.calibration import QUEUE_PRIOR_MARGIN
from narwhal.models.profile import ProbeSample, fit_profile
from narwhal.scheduler.placement import PlacementRequest
from narwhal.scheduler.registry import EngineRegistry

# Every engine: 10 ms + 50 ms per 1,000 prompt tokens, alone.
A, B = 0.010, 0.050


def fleet(*roles: str, budget: float = 1.0) -> tuple[PredictiveCheck, EngineRegistry, Counter[str]]:
    engines = [
        EngineConfig(name=f"e{i}", url=f"http://127.0.0.1/{i}", role=role)  # type: ignore[arg-type]
        for i, role in enumerate(roles)
    ]
    registry = EngineRegistry(engines)
    book = ModelBook(registry.entries, ttft_budget_s=budget)
    probes = [ProbeSample(p, A + B * p / 1000, 0.006) for p in (64, 512, 2048)]
    for name, entry in registry.entries.items():
        entry.model = book.model(name)
        entry.model.install(fit_profile(probes, source="token_ids", wall=0, now=0))
    refused: Counter[str] = Counter()
    check = PredictiveCheck(
        registry, book, ttft_budget_s=budget, refused=lambda reason: refused.update([reason])
    )
    return check, registry, refused


def bound(raw: float, budget: float = 1.0) -> float:
    """A new engine's bound on a projection (its calibration has seen nothing yet)."""
    s = 0.1 * budget
    return (raw + s) * QUEUE_PRIOR_MARGIN - s


def raw_for(upper: float, budget: float = 1.0) -> float:
    """The projection whose bound is `upper`."""
    s = 0.1 * budget
    return (upper + s) / QUEUE_PRIOR_MARGIN - s


def request(prompt_tokens: int) -> PlacementRequest:
    return PlacementRequest.sized("chat", prompt_tokens)


def backlog(registry: EngineRegistry, name: str, seconds: float) -> None:
    """Make the engine's lane project `seconds` of work ahead of any new prompt (the lane
    itself is tested in tests/models/test_lane.py)."""
    model = registry.entries[name].model
    assert model is not None
    alone = model.solo
    model.ttft = lambda tokens, *_: seconds + alone(tokens)  # type: ignore[method-assign]


def test_a_prompt_that_fits_an_idle_fleet_is_admitted_with_its_projection() -> None:
    check, _, refused = fleet("both", "both")
    projection = check.check(request(1000), arrived=0.0, now=0.0, queued=0)
    assert projection is not None
    assert projection.raw == pytest.approx(A + B)
    assert projection.upper == pytest.approx(bound(A + B))
    assert not refused


def test_prompt_alone_over_the_budget_is_429_prompt_exceeds_ttft_budget() -> None:
    check, _, refused = fleet("both", budget=1.0)
    # 16,000 tokens: 0.81 s alone, 1.02 s as a new engine's bound says: over 1 s.
    with pytest.raises(PromptExceedsTtftBudget) as info:
        check.check(request(16_000), arrived=0.0, now=0.0, queued=0)
    error = info.value
    assert error.status == 429 and error.code == "prompt_exceeds_ttft_budget"
    envelope = error.envelope()["error"]
    assert envelope["type"] == "invalid_request_error" and envelope["param"] == "messages"
    assert "shorten the prompt" in envelope["message"]
    assert "ttft_target_s" in envelope["message"]
    assert error.retry_after is None  # waiting would not help
    assert refused == {"prompt": 1}


@pytest.mark.parametrize(
    ("overrun", "retry_after"), [(0.2, 1), (0.49, 1), (1.2, 1), (2.4, 2), (2.6, 3), (3.5, 4)]
)
def test_projection_over_the_budget_is_429_with_the_rounded_overrun(
    overrun: float, retry_after: int
) -> None:
    check, registry, refused = fleet("both", "both", budget=1.0)
    raw = A + B  # the prompt's own prefill
    # Backlog on both engines such that the bound on backlog + raw is budget + overrun.
    ahead = raw_for(1.0 + overrun) - raw
    backlog(registry, "e0", ahead)
    backlog(registry, "e1", ahead + 5.0)
    with pytest.raises(TtftBudgetExceeded) as info:
        check.check(request(1000), arrived=0.0, now=0.0, queued=0)
    error = info.value
    assert error.status == 429 and error.code == "ttft_budget_exceeded"
    assert error.envelope()["error"]["type"] == "rate_limit_error"
    assert error.retry_after == retry_after
    assert error.headers() == {"Retry-After": str(retry_after)}
    assert refused == {"projected": 1}


def test_time_already_spent_counts_against_the_budget() -> None:
    check, registry, _ = fleet("both", budget=1.0)
    backlog(registry, "e0", 0.32)  # upper = (0.32 + 0.06 + 0.1) x 1.65 - 0.1 = 0.692
    assert check.check(request(1000), arrived=-0.25, now=0.0, queued=0) is not None
    with pytest.raises(TtftBudgetExceeded):  # sizing took 0.35 s: 0.65 s are left
        check.check(request(1000), arrived=-0.35, now=0.0, queued=0)


def test_the_least_loaded_engine_decides_and_the_queue_adds_its_wait() -> None:
    check, registry, _ = fleet("both", "both", budget=10.0)
    backlog(registry, "e0", 2.0)
    projection = check.check(request(1000), arrived=0.0, now=0.0, queued=0)
    assert projection is not None and projection.raw == pytest.approx(A + B)  # e1 is idle
    queued = check.check(request(1000), arrived=0.0, now=0.0, queued=4)
    assert queued is not None
    # four queued requests of this size, shared by two engines
    assert queued.raw == pytest.approx((A + B) + 4 * (A + B) / 2)


def test_a_disaggregated_pair_adds_the_decode_engines_first_step() -> None:
    check, registry, _ = fleet("prefill", "decode", budget=10.0)
    decode = registry.entries["e1"].model
    assert decode is not None
    projection = check.check(request(1000), arrived=0.0, now=0.0, queued=0)
    assert projection is not None
    assert projection.raw == pytest.approx(A + B + decode.first_step(1000))


def test_no_modelled_engine_means_no_projection() -> None:
    check, registry, refused = fleet("both")
    registry.set_ready_predicate(lambda entry: False)  # (unprofiled: not eligible)
    assert check.check(request(10), arrived=0.0, now=0.0, queued=0) is None
    assert not refused


def test_the_prompt_alone_refusal_tells_clients_not_to_retry() -> None:
    check, _, _ = fleet("both", budget=1.0)
    with pytest.raises(PromptExceedsTtftBudget) as info:
        check.check(request(16_000), arrived=0.0, now=0.0, queued=0)
    # The official OpenAI clients retry a 429 unless told not to; the same prompt never fits.
    assert info.value.headers() == {"x-should-retry": "false"}


def test_a_prompt_that_fills_the_context_is_told_the_context_is_the_limit() -> None:
    """A prompt (as sized, an estimate the context check let through) that leaves no room
    in the engines' context: raising the budget would not serve it, so the advice is not
    to raise it."""
    check, registry, refused = fleet("both", "both", budget=1.0)
    for entry, context in zip(registry.entries.values(), (16_384, 32_768), strict=True):
        entry.health = EngineHealth(stale_after_s=1.0, status="up", max_model_len=context)
    with pytest.raises(PromptExceedsTtftBudget) as info:
        check.check(request(16_384), arrived=0.0, now=0.0, queued=0)
    message = info.value.message
    assert "context of 16384 tokens" in message  # the smallest engine's, where it may go
    assert "ttft_target_s" not in message and "shorten the prompt" in message
    assert refused == {"prompt": 1}
    # Below the context the budget is the limit, and the advice says so.
    with pytest.raises(PromptExceedsTtftBudget) as info:
        check.check(request(16_000), arrived=0.0, now=0.0, queued=0)
    assert "ttft_target_s" in info.value.message and "context" not in info.value.message


def test_overload_is_a_share_of_recent_decisions_refused_as_projected() -> None:
    check, registry, _ = fleet("both", budget=1.0)
    # Admissions alone, however many: not overloaded.
    for i in range(40):
        check.check(request(100), arrived=i * 0.01, now=i * 0.01, queued=0)
    assert not check.overloaded(0.4)
    # A few refusals among them (under 5% of the last seconds' decisions): not yet.
    backlog(registry, "e0", 5.0)
    with pytest.raises(TtftBudgetExceeded):
        check.check(request(100), arrived=0.4, now=0.4, queued=0)
    assert not check.overloaded(0.4)
    # One in five refused: overloaded, and no longer once the refusals are seconds old.
    for i in range(10):
        with pytest.raises(TtftBudgetExceeded):
            check.check(request(100), arrived=0.4 + i * 0.01, now=0.4 + i * 0.01, queued=0)
    assert check.overloaded(0.5)
    registry.entries["e0"].model.ttft = lambda tokens, *_: A  # type: ignore[union-attr,method-assign]
    for i in range(200):
        now = 1.0 + i * 0.05
        check.check(request(100), arrived=now, now=now, queued=0)
    assert not check.overloaded(11.0)


def test_a_few_decisions_are_no_overload_whatever_they_were() -> None:
    # A quiet router's first refusals (a single client sending long prompts) are not an
    # overload: fewer than 20 decisions in the window.
    check, registry, _ = fleet("both", budget=1.0)
    backlog(registry, "e0", 5.0)
    for i in range(10):
        with pytest.raises(TtftBudgetExceeded):
            check.check(request(100), arrived=i * 0.1, now=i * 0.1, queued=0)
    assert not check.overloaded(1.0)
    # Prompt-alone refusals are the prompt's fault, not the fleet's load.
    check2, _, _ = fleet("both", budget=1.0)
    for i in range(40):
        with pytest.raises(PromptExceedsTtftBudget):
            check2.check(request(16_000), arrived=i * 0.01, now=i * 0.01, queued=0)
    assert not check2.overloaded(0.4)


def test_a_lower_class_is_refused_first_and_never_while_a_higher_one_is_refused() -> None:
    """With 0.7 s of work ahead on a 1 s budget: critical (the whole budget) is admitted,
    standard (0.75 of it) too, sheddable (0.56) refused; once a critical request is
    refused as projected, no lower class is admitted for CLASS_HOLD_S, whatever its
    prompt, and the classes above it still are."""
    check, registry, refused = fleet("both")
    check.classes = PriorityClasses.from_config(AdmissionConfig())
    ahead = raw_for(0.7) - (A + B * 0.1)
    backlog(registry, "e0", ahead)

    def ask(rank: int, tokens: int = 100, now: float = 0.0) -> bool:
        try:
            check.check(replace(request(tokens), priority=rank), arrived=now, now=now, queued=0)
        except TtftBudgetExceeded:
            return False
        return True

    assert [ask(0), ask(1), ask(2)] == [True, True, False]
    assert "share of the TTFT budget" in _message(check, 2)
    assert not ask(0, tokens=8000, now=1.0)  # critical refused as projected...
    assert not ask(1, tokens=1, now=1.02)  # ...so a short standard one is held back
    assert ask(0, now=1.02)
    assert ask(1, now=1.0 + CLASS_HOLD_S)  # and admitted again after the hold
    assert refused["projected"] == 4


def _message(check: PredictiveCheck, rank: int) -> str:
    with pytest.raises(TtftBudgetExceeded) as info:
        check.check(replace(request(100), priority=rank), arrived=0.0, now=0.0, queued=0)
    return info.value.message


def test_a_tenant_over_its_fair_share_is_refused_before_a_fair_one_of_the_same_class() -> None:
    check, registry, _ = fleet("both")
    check.classes = PriorityClasses.from_config(AdmissionConfig())
    check._standing = lambda tenant, now: "over" if tenant == "flood" else "owed"
    # 0.6 s of work ahead on a 1 s budget: a standard request fits its class's share
    # (0.75), and more as the fair tenant's (half a class apart: 0.87), not as the flood's.
    backlog(registry, "e0", raw_for(0.6) - (A + B * 0.1))
    fair = replace(request(100), priority=1, tenant="polite")
    assert check.check(fair, arrived=0.0, now=0.0, queued=0) is not None
    with pytest.raises(TtftBudgetExceeded) as info:
        check.check(replace(fair, tenant="flood"), arrived=0.0, now=0.0, queued=0)
    assert "priority class and tenant" in info.value.message
    # A critical request is critical whoever sends it.
    critical = replace(fair, priority=0, tenant="flood")
    assert check.check(critical, arrived=0.0, now=0.0, queued=0) is not None


def test_traffic_of_one_class_has_the_whole_budget_whichever_class_it_is() -> None:
    """Shares count from the highest class sending: without critical traffic (the
    default class is standard) nothing is refused for a headroom no one uses."""
    check, registry, _ = fleet("both")
    check.classes = PriorityClasses.from_config(AdmissionConfig())
    backlog(registry, "e0", raw_for(0.9) - (A + B * 0.1))
    standard = replace(request(100), priority=1)
    assert check.check(standard, arrived=0.0, now=0.0, queued=0) is not None
    # Critical traffic comes: standard now leaves it its headroom (0.75 of the budget)...
    assert check.check(replace(request(100), priority=0), arrived=1.0, now=1.0, queued=0)
    with pytest.raises(TtftBudgetExceeded):
        check.check(standard, arrived=1.0, now=1.0, queued=0)
    # ...until no critical request has come for ACTIVE_CLASS_S.
    later = 1.0 + ACTIVE_CLASS_S
    assert check.check(standard, arrived=later, now=later, queued=0) is not None
