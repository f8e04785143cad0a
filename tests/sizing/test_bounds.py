"""Which decisions an estimate's error could flip (sans-IO)."""

from __future__ import annotations

from collections.abc import Callable

from narwhal.sizing import PromptSize
from narwhal.sizing.bounds import context_fit, context_verdict, needs_engine_count


def estimate(tokens: int, low: int, high: int) -> PromptSize:
    return PromptSize(tokens, low, high, "calibrated", tokens)


def refuse_over(limit: int) -> tuple[list[int], Callable[[int], str]]:
    asked: list[int] = []

    def verdict(tokens: int) -> str:
        asked.append(tokens)
        return "refuse" if tokens > limit else "admit"

    return asked, verdict


def test_a_verdict_the_same_at_both_bounds_is_decided_at_once() -> None:
    asked, verdict = refuse_over(1000)
    assert not needs_engine_count(estimate(500, 300, 700), verdict)
    assert not needs_engine_count(estimate(5000, 3000, 7000), verdict)
    assert asked == [300, 700, 3000, 7000]


def test_only_bounds_across_the_boundary_need_the_engines_count() -> None:
    _, verdict = refuse_over(1000)
    assert needs_engine_count(estimate(900, 600, 1300), verdict)
    assert needs_engine_count(estimate(1100, 990, 1001), verdict)
    assert not needs_engine_count(estimate(1000, 400, 1000), verdict)


def test_an_exact_size_never_waits_and_asks_nothing() -> None:
    asked, verdict = refuse_over(1000)
    assert not needs_engine_count(PromptSize.exact(1000, "local"), verdict)
    assert not needs_engine_count(PromptSize.exact(1001, "engine"), verdict)
    assert asked == []


def test_verdicts_with_several_parts_differ_when_any_part_does() -> None:
    """The dispatcher's verdict is (the predictive check's, whether the context fits)."""

    def verdict(tokens: int) -> tuple[str, bool]:
        return ("admit" if tokens < 5000 else "prompt", context_fit(tokens, 100, 2048))

    assert needs_engine_count(estimate(1900, 1800, 2000), verdict)  # the context's edge
    assert not needs_engine_count(estimate(1000, 900, 1100), verdict)


def test_the_context_check_on_a_sized_prompt() -> None:
    assert context_fit(1948, 100, 2048) and not context_fit(1949, 100, 2048)
    assert context_fit(2048, None, 2048) and context_fit(10**9, 100, None)
    assert context_verdict(estimate(1000, 800, 1900), 100, 2048) == "fits"
    assert context_verdict(estimate(3000, 2000, 4000), 100, 2048) == "exceeds"
    assert context_verdict(estimate(1900, 1500, 2500), 100, 2048) is None
    assert context_verdict(PromptSize.exact(1949, "local"), 100, 2048) == "exceeds"
    assert context_verdict(estimate(10**6, 1, 10**7), 100, None) == "fits"
