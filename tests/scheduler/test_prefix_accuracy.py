"""Predicted against observed prefix-cache hits: baselines, restarts, drift verdicts."""

from __future__ import annotations

import pytest

from narwhal.scheduler.prefix_accuracy import AccuracyPolicy, PrefixAccuracy, Verdict

POLICY = AccuracyPolicy(
    threshold=0.25, forget_after_s=60.0, window_s=30.0, min_tokens=1000, min_share=0.5
)


class Engine:
    """An engine's cumulative counters, and the tracker fed one scrape a second."""

    def __init__(self, policy: AccuracyPolicy = POLICY) -> None:
        self.accuracy = PrefixAccuracy(policy)
        self.hits = 0.0
        self.queries = 0.0
        self.now = 0.0
        assert self.accuracy.scraped(self.hits, self.queries, self.now) is Verdict.KEEP

    def second(
        self, predicted: float, observed: float, tokens: int = 1000, others: int = 0
    ) -> Verdict:
        """One second: the router places `tokens` predicting `predicted` of them cached;
        the engine counts them (and `others` from elsewhere) with `observed` hit."""
        self.accuracy.placed(int(predicted * tokens), tokens)
        self.hits += observed * (tokens + others)
        self.queries += tokens + others
        self.now += 1.0
        return self.accuracy.scraped(self.hits, self.queries, self.now)

    def run(self, seconds: int, predicted: float, observed: float, **kw: int) -> list[Verdict]:
        return [self.second(predicted, observed, **kw) for _ in range(seconds)]


def test_the_first_sample_is_a_baseline() -> None:
    accuracy = PrefixAccuracy(POLICY)
    accuracy.placed(900, 1000)  # before any counters: nothing to compare it with
    assert accuracy.scraped(5000.0, 10_000.0, 0.0) is Verdict.KEEP
    assert accuracy.predicted_ratio() is None and accuracy.engine_ratio() is None
    accuracy.placed(300, 1000)
    assert accuracy.scraped(5100.0, 11_000.0, 1.0) is Verdict.KEEP
    assert accuracy.predicted_ratio() == 0.3
    assert accuracy.engine_ratio() == 0.1


def test_a_counter_going_back_is_a_restart() -> None:
    accuracy = PrefixAccuracy(POLICY)
    accuracy.scraped(5000.0, 10_000.0, 0.0)
    accuracy.placed(500, 1000)
    assert accuracy.scraped(5500.0, 11_000.0, 1.0) is Verdict.KEEP
    accuracy.placed(500, 1000)
    assert accuracy.scraped(0.0, 200.0, 2.0) is Verdict.RESTARTED
    assert accuracy.predicted_ratio() is None and accuracy.engine_ratio() is None
    # Counted from the restart on.
    accuracy.placed(100, 1000)
    assert accuracy.scraped(100.0, 1200.0, 3.0) is Verdict.KEEP
    assert accuracy.engine_ratio() == 0.1
    # Hits alone going back is a restart too.
    assert accuracy.scraped(50.0, 1300.0, 4.0) is Verdict.RESTARTED


def test_lasting_over_prediction_forgets_the_index() -> None:
    engine = Engine()
    verdicts = engine.run(62, predicted=0.9, observed=0.1)
    # Judged from the first scrape (t=1) on; longer than 60 s at t=62.
    assert verdicts[-1] is Verdict.DRIFTED
    assert set(verdicts[:-1]) == {Verdict.KEEP}
    # Judging starts afresh: another whole stretch of disagreement before the next one.
    assert engine.accuracy.predicted_ratio() is None
    assert set(engine.run(61, predicted=0.9, observed=0.1)) == {Verdict.KEEP}
    assert engine.second(predicted=0.9, observed=0.1) is Verdict.DRIFTED


def test_a_stretch_without_evidence_restarts_the_clock_too() -> None:
    engine = Engine(AccuracyPolicy(window_s=1.0, forget_after_s=60.0, min_tokens=1000))
    assert set(engine.run(50, predicted=0.9, observed=0.1)) == {Verdict.KEEP}
    assert engine.second(predicted=0.9, observed=0.1, tokens=10) is Verdict.KEEP  # too little
    assert set(engine.run(61, predicted=0.9, observed=0.1)) == {Verdict.KEEP}
    assert engine.second(predicted=0.9, observed=0.1) is Verdict.DRIFTED


def test_ratios_are_over_the_recent_window() -> None:
    engine = Engine()
    engine.run(40, predicted=0.0, observed=0.0)
    engine.run(30, predicted=0.5, observed=0.6)
    assert engine.accuracy.predicted_ratio() == 0.5
    assert engine.accuracy.engine_ratio() == pytest.approx(0.6)


def test_agreement_or_under_prediction_keeps_the_index() -> None:
    assert set(Engine().run(200, predicted=0.6, observed=0.4)) == {Verdict.KEEP}
    # The engine hits more than predicted: forgetting could only widen the gap.
    assert set(Engine().run(200, predicted=0.1, observed=0.9)) == {Verdict.KEEP}


def test_too_little_traffic_gives_no_verdict() -> None:
    # 30 tokens a second: 900 in the 30 s window, under min_tokens.
    assert set(Engine().run(200, predicted=0.9, observed=0.0, tokens=30)) == {Verdict.KEEP}
    # The router's share of the engine's queries too small to judge the engine's ratio.
    assert set(Engine().run(200, predicted=0.9, observed=0.0, others=3000)) == {Verdict.KEEP}


def test_the_disagreement_must_last_without_a_break() -> None:
    # A window of one scrape, so that one scrape's agreement is the whole break.
    engine = Engine(AccuracyPolicy(window_s=1.0, forget_after_s=60.0, min_tokens=1000))
    assert set(engine.run(50, predicted=0.9, observed=0.1)) == {Verdict.KEEP}
    assert engine.second(predicted=0.2, observed=0.1) is Verdict.KEEP
    # The clock restarts at the next disagreement (t=52): longer than 60 s at t=113.
    assert set(engine.run(61, predicted=0.9, observed=0.1)) == {Verdict.KEEP}
    assert engine.second(predicted=0.9, observed=0.1) is Verdict.DRIFTED


def test_engines_without_counters_get_no_verdict() -> None:
    accuracy = PrefixAccuracy(POLICY)
    for t in range(200):
        accuracy.placed(900, 1000)
        assert accuracy.scraped(None, None, float(t)) is Verdict.KEEP
    assert accuracy.engine_ratio() is None
    # A page that loses its counters for a while keeps the baseline.
    accuracy.scraped(100.0, 1000.0, 200.0)
    accuracy.scraped(None, 2000.0, 201.0)
    assert accuracy.scraped(150.0, 2000.0, 202.0) is Verdict.KEEP
    assert accuracy.engine_ratio() == 0.05


def test_policy_is_validated() -> None:
    with pytest.raises(ValueError):
        AccuracyPolicy(window_s=0.0)
    with pytest.raises(ValueError):
        AccuracyPolicy(threshold=-0.1)
