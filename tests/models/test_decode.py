"""Decode correction: a request's remaining decode work follows what it has produced, as
reported to the book in batches (`DecodeBook.produced`)."""

from __future__ import annotations

import random

import pytest

from narwhal.models.decode import DecodeBook
from narwhal.models.lengths import OutputLengths


def learned(mean: float) -> OutputLengths:
    rng = random.Random(3)
    lengths = OutputLengths()
    for _ in range(4000):
        lengths.observe("chat", 100, int(rng.expovariate(1 / mean)) + 1)
    return lengths


def test_a_request_past_its_expected_length_still_counts() -> None:
    book = DecodeBook(learned(100), refresh_s=0.0)
    book.start("a", "chat", 100, None)
    assert book.work(0.0) == pytest.approx(100, rel=0.15)
    book.produced("a", 400)  # far past its expected 100
    assert book.work(1.0) == pytest.approx(100, rel=0.3)  # memoryless: ~100 more, not 0


def test_the_cap_bounds_what_is_left_and_stopped_requests_leave() -> None:
    book = DecodeBook(learned(1000), refresh_s=0.0)
    book.start("a", "chat", 100, 64, produced=60)
    assert book.work(0.0) == pytest.approx(4)
    book.stop("a")
    assert book.work(0.0) == 0.0 and len(book) == 0


def test_expected_batch_counts_each_for_its_share_of_the_horizon() -> None:
    book = DecodeBook(learned(100), refresh_s=0.0)
    book.start("ending", "chat", 100, 64, produced=63)  # one token left
    book.start("fresh", "chat", 100, 10_000)  # ~100 left
    batch = book.expected_batch(horizon=100, now=0.0)
    assert batch == pytest.approx(0.01 + 1.0, abs=0.2)


def test_reported_output_counts_at_once_and_learned_lengths_at_each_refresh() -> None:
    lengths = learned(100)
    book = DecodeBook(lengths, refresh_s=1.0)
    book.start("a", "chat", 100, None)
    first = book.work(10.0)
    assert first == pytest.approx(100, rel=0.15)
    book.produced("a", 30)  # a batch of output counts: its remainder follows at once
    assert book.work(10.1) == pytest.approx(100, rel=0.3)  # memoryless: ~100 more
    assert book.kv_tokens(10.1) == 130
    for _ in range(20_000):  # the lengths learn much longer outputs meanwhile
        lengths.observe("chat", 100, 2000)
    assert book.work(10.5) == pytest.approx(100, rel=0.3)  # not until the next refresh
    assert book.work(11.0) > 500  # refreshed by what was learned


def test_progress_for_a_request_not_decoding_here_is_ignored() -> None:
    book = DecodeBook(learned(100), refresh_s=0.0)
    book.produced("gone", 10)  # finished before its last batch arrived
    assert len(book) == 0 and book.work(0.0) == 0.0


def test_the_kv_held_follows_every_start_report_and_stop() -> None:
    """The running total equals the KV of the requests decoding, whatever the order of
    starts (a key started twice included), reports (for keys not here too) and stops."""
    rng = random.Random(11)
    book = DecodeBook(learned(50))
    held: dict[int, tuple[int, int]] = {}  # key: (prompt tokens, produced)
    for _ in range(3000):
        key = rng.randrange(40)
        action = rng.random()
        if action < 0.4:
            prompt, produced = rng.randrange(1, 4000), rng.randrange(0, 50)
            book.start(key, "chat", prompt, None, produced)
            held[key] = (prompt, produced)
        elif action < 0.8:
            produced = rng.randrange(0, 500)
            book.produced(key, produced)
            if key in held:
                held[key] = (held[key][0], produced)
        else:
            book.stop(key)
            held.pop(key, None)
        assert book.kv_tokens(0.0) == sum(p + o for p, o in held.values())
    assert len(book) == len(held)
