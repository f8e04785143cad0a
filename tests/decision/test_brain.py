"""The decision core through its messages: values in, values out, time passed in.

Against a profiled simulated engine in virtual time (`tests/closed_loop.py`, whose loop
drives the same core): what an estimate's bounds make the core ask for, what the count
then decides, what the output reported in batches does to the decode book, and that
what crosses the seam is plain values (each message survives pickling: nothing live
rides along, so a core in another process could be sent the same).
"""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from narwhal.decision import messages
from narwhal.decision.messages import (
    Counted,
    Failed,
    Finished,
    FirstToken,
    NeedsCount,
    Offer,
    OutputSummary,
    Placed,
    PrefillDone,
    Progress,
    Queued,
    Reconsider,
    Refused,
    Unplaceable,
    Wakeups,
)
from narwhal.errors import (
    CapacityRejected,
    NarwhalError,
    PromptExceedsTtftBudget,
    RouterUnavailable,
    TenantQuotaExceeded,
    TtftBudgetExceeded,
)
from tests.closed_loop import DISCIPLINES, ClosedLoop

BUDGET = 0.5


@pytest.fixture
def loop() -> ClosedLoop:
    closed = ClosedLoop([DISCIPLINES["chunked-8192"]], budget=BUDGET)
    closed.profile()
    return closed


def test_every_message_is_a_frozen_value_that_crosses_a_process_boundary() -> None:
    samples = [
        Offer.exact("r1", "chat", 100, 16, arrived=1.0, deadline=2.0, priority=1, tenant="t"),
        Counted("r1", 120),
        Placed("r1", "d0", "p0", 64, 120, 0.25),
        Queued("r1", 120),
        NeedsCount("r1"),
        Unplaceable("r1"),
        PrefillDone("r1"),
        FirstToken("r1"),
        Progress((("r1", 3), ("r2", 9))),
        Failed("r1", "d0", OutputSummary(3, True, False, 0.01)),
        Finished("r1", OutputSummary(9, True, True, None)),
        Reconsider(monitoring_degraded=True),
        Wakeups((Placed("r2", "d0"),), ("r3",)),
    ]
    kinds = {type(sample) for sample in samples} | {Refused}
    declared = {
        value
        for value in vars(messages).values()
        if isinstance(value, type)
        and dataclasses.is_dataclass(value)
        and value.__module__ == messages.__name__
    }
    assert declared <= kinds, f"messages without a sample here: {declared - kinds}"
    for sample in samples:
        assert dataclasses.fields(sample)  # a dataclass
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(sample, dataclasses.fields(sample)[0].name, None)
        assert pickle.loads(pickle.dumps(sample)) == sample
    refused = Refused("r1", TtftBudgetExceeded("over the budget", retry_after=2), 120)
    back = pickle.loads(pickle.dumps(refused))
    assert type(back.error) is TtftBudgetExceeded and back.error.retry_after == 2
    assert back.error.__traceback__ is None


@pytest.mark.parametrize(
    "error",
    [
        CapacityRejected("The queue is full.", reason="queue_full"),
        TenantQuotaExceeded("Over the quota.", retry_after=7),
        PromptExceedsTtftBudget("Too long.", param="messages"),
        RouterUnavailable.not_admitting("fenced"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_every_refusal_crosses_a_process_as_the_client_would_get_it(error: NarwhalError) -> None:
    """Refusals go from the decision process to a relay worker pickled: each comes back
    with the same status, headers and body, whatever arguments its class takes."""
    back = pickle.loads(pickle.dumps(Refused("r1", error, 10))).error
    assert type(back) is type(error)
    assert (back.status, back.headers(), back.body()) == (
        error.status,
        error.headers(),
        error.body(),
    )
    assert back.outcome == error.outcome and back.args == error.args


def test_an_estimate_that_could_flip_the_check_waits_for_the_count_holding_its_place(
    loop: ClosedLoop,
) -> None:
    brain = loop.brain
    # Between a prompt the budget takes easily and one it never could alone.
    offer = Offer("r1", "completion", 300, None, 0.0, 10.0, 100, 400_000, countable=True)
    answer, _ = brain.offer(offer, 0.0)
    assert answer == NeedsCount("r1")
    assert brain.counts().retained == 1  # its place is held while the count comes
    answer, _ = brain.counted(Counted("r1", 150), 0.01)
    assert isinstance(answer, Placed) and answer.prompt_tokens == 150
    assert answer.projected_upper is not None and answer.projected_upper < BUDGET
    brain.finished(Finished("r1"), 0.02)
    assert brain.counts() == type(brain.counts())(0, 0, 0, 0)


def test_a_count_that_is_too_long_is_refused_by_the_prompt_row(loop: ClosedLoop) -> None:
    brain = loop.brain
    offer = Offer("r1", "completion", 300, None, 0.0, 10.0, 100, 400_000, countable=True)
    assert brain.offer(offer, 0.0)[0] == NeedsCount("r1")
    answer, _ = brain.counted(Counted("r1", 400_000), 0.01)
    assert isinstance(answer, Refused) and isinstance(answer.error, PromptExceedsTtftBudget)
    assert answer.prompt_tokens == 400_000
    assert brain.counts().retained == 1  # until its handler's one Finished
    brain.finished(Finished("r1"), 0.02)
    brain.finished(Finished("r1"), 0.03)  # a second one is nothing
    assert brain.counts().retained == 0


def test_without_a_count_to_ask_an_estimate_is_decided_as_offered(loop: ClosedLoop) -> None:
    offer = Offer("r1", "completion", 300, None, 0.0, 10.0, 100, 400_000, countable=False)
    answer, _ = loop.brain.offer(offer, 0.0)
    assert isinstance(answer, Placed) and answer.prompt_tokens == 300


def test_an_offer_while_the_router_does_not_admit_holds_nothing(loop: ClosedLoop) -> None:
    brain = loop.brain
    brain.state.set("ha", "standby")
    answer, wakeups = brain.offer(Offer.exact("r1", "completion", 100), 0.0)
    assert isinstance(answer, Refused) and isinstance(answer.error, RouterUnavailable)
    assert "standby" in answer.error.message and not wakeups
    assert brain.counts().retained == 0
    assert brain.readiness() == "standby"


def test_output_reported_in_batches_moves_the_decode_books_work(loop: ClosedLoop) -> None:
    brain = loop.brain
    assert loop.book is not None
    decoding = loop.book.model("e0").decoding
    answer, _ = brain.offer(Offer.exact("r1", "completion", 200, 64), 0.0)
    assert isinstance(answer, Placed)
    brain.first_token(FirstToken("r1"), 0.1)
    before = decoding.work(0.1)
    brain.progress(Progress((("r1", 60), ("unknown", 5))), 0.2)
    after = decoding.work(10.0)  # past the book's refresh interval
    assert after < before and after == pytest.approx(4.0, abs=1.0)  # at most 64: 4 left
    brain.finished(Finished("r1", OutputSummary(64, True, True, 0.01)), 10.1)
    assert len(decoding) == 0


def test_an_answer_in_one_piece_teaches_its_exact_length(loop: ClosedLoop) -> None:
    """What vLLM answers only unstreamed has no first token: its length still counts."""
    brain = loop.brain
    assert loop.book is not None
    lengths = loop.book.lengths
    before = lengths.predict("completion", 200, None)
    for i in range(200):
        rid = f"r{i}"
        answer, _ = brain.offer(Offer.exact(rid, "completion", 200, arrived=float(i)), float(i))
        assert isinstance(answer, Placed)
        brain.finished(Finished(rid, OutputSummary(700, True, True, None)), float(i) + 0.5)
    assert lengths.predict("completion", 200, None) > before
    assert lengths.predict("completion", 200, None) == pytest.approx(700, rel=0.2)


def test_a_retry_is_placed_again_never_where_it_failed() -> None:
    closed = ClosedLoop([DISCIPLINES["chunked-8192"]] * 2, budget=BUDGET)
    closed.profile()
    brain = closed.brain
    answer, _ = brain.offer(Offer.exact("r1", "completion", 200), 0.0)
    assert isinstance(answer, Placed)
    first = answer.decode
    assert brain.could_retry("r1", first)
    answer, _ = brain.failed(Failed("r1", first), 0.1)
    assert isinstance(answer, Placed) and answer.decode != first
    assert answer.projected_upper is None  # the bound was the first placement's
    assert not brain.could_retry("r1", answer.decode)  # both have failed it then
    answer, _ = brain.failed(Failed("r1", answer.decode), 0.2)
    assert answer == Unplaceable("r1")
    brain.finished(Finished("r1"), 0.3)
    assert brain.counts().retained == 0
