"""Probe texts sized in the engine's tokens: counted and adjusted in a bounded number of
round trips, never over the wanted length; estimated and corrected by the engine's usage
where nothing can count them."""

from __future__ import annotations

import random

import pytest

from narwhal.models.profile import ProfileError
from narwhal.profiling.probe_text import MAX_ROUNDS, ProbeText
from narwhal.protocol.tokenizer import SimTokenizer


def three_per_word(text: str) -> int:
    """A tokenizer unlike the simulator's: three tokens a word, and a BOS."""
    return 1 + 3 * len(text.split())


class Counted:
    """An engine's /tokenize: a real count of the text, and how often it was asked."""

    def __init__(self, count: object) -> None:
        self._count = count
        self.calls = 0

    async def __call__(self, text: str) -> int | None:
        self.calls += 1
        return self._count(text)  # type: ignore[operator,no-any-return]


@pytest.mark.parametrize("target", [8, 63, 506, 2024])
async def test_a_text_is_counted_to_the_target_in_another_tokenizer(target: int) -> None:
    counter = Counted(three_per_word)
    texts = ProbeText(counter, random.Random(1))
    text, counted = await texts.build(target)
    assert counted == three_per_word(text) <= target
    # As near as words of three tokens allow, in at most MAX_ROUNDS round trips.
    assert target - counted < 3
    assert counter.calls <= MAX_ROUNDS


async def test_the_simulators_tokenizer_is_met_exactly() -> None:
    sim = SimTokenizer()
    counter = Counted(lambda text: 1 + sim.count(text))
    texts = ProbeText(counter, random.Random(2))
    for target in (64, 512, 2048):
        text, counted = await texts.build(target)
        assert counted == target == 1 + sim.count(text)
    assert counter.calls <= 3 * MAX_ROUNDS


async def test_a_counter_that_stops_answering_falls_back_to_the_estimate() -> None:
    answers = iter([40])
    texts = ProbeText(Counted(lambda _: next(answers, None)), random.Random(3))
    text, estimated = await texts.build(100)
    assert not texts.counted and text.startswith("Narwhal profile")
    # Before the engine has counted a probe, an estimate aims below the target.
    assert estimated < 100


async def test_without_a_counter_the_engines_usage_corrects_the_estimate() -> None:
    texts = ProbeText(None, random.Random(4))
    first, _ = await texts.build(64)
    # The engine (three tokens a word) counted the first probe in its usage.
    texts.learn(first, three_per_word(first))
    text, estimated = await texts.build(2000)
    # Aimed a little below the target: no count, but the engine's limit is exact.
    assert 0.9 * 2000 <= three_per_word(text) <= 2000
    assert estimated == pytest.approx(three_per_word(text), rel=0.05)


async def test_two_usage_counts_teach_the_fixed_part_too() -> None:
    """A chat template's 20 tokens around every probe: the line through two counts."""

    def engine(text: str) -> int:
        return 20 + three_per_word(text)

    texts = ProbeText(None, random.Random(6))
    for target in (64, 2000):
        text, _ = await texts.build(target)
        texts.learn(text, engine(text))
    short, estimated = await texts.build(64)
    assert 0.9 * 64 <= engine(short) <= 64 and estimated == pytest.approx(engine(short), abs=2)


async def test_no_text_short_enough_is_a_profile_error() -> None:
    texts = ProbeText(Counted(lambda text: 50 + len(text.split())), random.Random(5))
    with pytest.raises(ProfileError, match="at most 20 tokens"):
        await texts.build(20)


def uneven(text: str) -> int:
    """A tokenizer whose words take 1 to 6 tokens each (a BPE vocabulary that did not see
    them), and a BOS: a word less may take one token off, or six."""
    return 1 + sum(1 + (sum(map(ord, word)) % 6) for word in text.split())


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("target", [64, 500])
async def test_uneven_words_still_find_a_text_within_the_target(seed: int, target: int) -> None:
    """Near the target, a word less may take a single token off: the search steps down
    by what the excess needs (at the tokens a word has been seen to take), and goes on
    past its usual rounds while nothing fits yet, instead of failing the profile."""
    counter = Counted(uneven)
    texts = ProbeText(counter, random.Random(seed))
    text, counted = await texts.build(target)
    assert counted == uneven(text) <= target
    assert counted > 0.75 * target
    assert counter.calls <= 2 * MAX_ROUNDS
