"""The decision core under every interleaving hypothesis finds (a RuleBasedStateMachine),
driven through its messages alone (`narwhal.decision.messages`), as the gate drives it.

Requests are offered, placed or queued, get their first token, report their output,
finish, are cancelled by their clients, expire in the queue, fail on an engine before
headers and are retried elsewhere; engines are drained, undrained, go down and come back;
the router loses its lease (every queued request is refused at once, as the gate does,
and offers are refused while it is lost) and wins it back. The machine knows each request
only by its id and by what the core answered; after every step the core's counts must
equal what those answers say each request holds: the router's slots, every engine's
load, the queue and retention, all within their limits, and no request placed where it
may not go.
"""

from __future__ import annotations

import itertools
import random

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from narwhal.admission.controller import Admission
from narwhal.config import EngineConfig, EnginePhaseConcurrency
from narwhal.decision.brain import Brain, BrainSettings
from narwhal.decision.messages import (
    Answer,
    Failed,
    Finished,
    FirstToken,
    Offer,
    Placed,
    PrefillDone,
    Progress,
    Queued,
    Reconsider,
    Refused,
    Unplaceable,
    Wakeups,
)
from narwhal.errors import BackendUnavailable, CapacityRejected, RouterUnavailable
from narwhal.ops.state import RouterState
from narwhal.scheduler.registry import EngineRegistry
from narwhal.scheduler.scheduler import Scheduler

PREFILL_LIMIT = 3
DECODE_LIMIT = 5
QUEUE_LIMIT = 3
RETAINED = 9


def _engine(name: str, role: str, **limits: int) -> EngineConfig:
    return EngineConfig(
        name=name,
        url=f"http://127.0.0.1/{name}",
        role=role,  # type: ignore[arg-type]
        phase_concurrency=EnginePhaseConcurrency(**limits),
    )


FLEETS = {
    "aggregated": (_engine("a", "both", prefill=1, decode=2), _engine("b", "both")),
    "disaggregated": (
        _engine("p0", "prefill", prefill=1),
        _engine("p1", "prefill"),
        _engine("d0", "decode", decode=3),
    ),
}


class DecisionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.ids = itertools.count()
        # What the core's answers say each request holding a retention place holds:
        # "new" (nothing but that place), "queued", "prefill" or "decode".
        self.held: dict[str, str] = {}
        self.placed: dict[str, Placed] = {}  # where each request in prefill or decode runs
        self.answered: set[str] = set()  # P/D: its prefill engine is done with it
        self.retrying: set[str] = set()  # admitted already (a full queue does not refuse it)
        self.failed: dict[str, set[str]] = {}  # request id -> engines that failed it
        self.fenced = False

    @initialize(fleet=st.sampled_from(sorted(FLEETS)))
    def build(self, fleet: str) -> None:
        self.engines = FLEETS[fleet]
        self.healthy = {e.name for e in self.engines}
        self.registry = EngineRegistry(self.engines, lambda name: name in self.healthy)
        self.admission = Admission(
            Scheduler(self.registry, rng=random.Random(0)),
            max_retained=RETAINED,
            queue_limit=QUEUE_LIMIT,
            prefill_limit=PREFILL_LIMIT,
            decode_limit=DECODE_LIMIT,
        )
        self.state = RouterState()
        self.brain = Brain(BrainSettings(ttft_target_s=1.0), self.state, self.admission)

    # --- what callers do with the answers, as the gate and the dispatcher do ------------------

    def _tick(self) -> float:
        self.now += 0.01
        return self.now

    def _gone(self, request_id: str) -> None:
        """The request's handler unwinds: it sends its one Finished."""
        self._forget(request_id)
        self._apply(self.brain.finished(Finished(request_id), self._tick()))

    def _forget(self, request_id: str) -> None:
        self.held.pop(request_id, None)
        self.placed.pop(request_id, None)
        self.answered.discard(request_id)
        self.retrying.discard(request_id)

    def _apply(self, wakeups: Wakeups) -> None:
        for placed in wakeups.placed:
            assert self.held.get(placed.request_id) == "queued", "woke a request not queued"
            self._take(placed)
        for request_id in wakeups.unplaceable:
            assert self.held.get(request_id) == "queued", "an unplaceable request held more"
            self.held[request_id] = "new"
            self._gone(request_id)

    def _take(self, placed: Placed) -> None:
        request_id = placed.request_id
        for name in set(placed.engines):
            assert name not in self.failed.get(request_id, set()), "placed where it failed"
            assert not self.registry.entries[name].drained, "placed on a drained engine"
            assert name in self.healthy, "placed on an engine that is down"
        self.held[request_id] = "prefill"
        self.placed[request_id] = placed
        self.answered.discard(request_id)

    def _own(self, request_id: str, answer: Answer) -> None:
        """The request's own answer to an offer or a retry."""
        assert answer.request_id == request_id
        if isinstance(answer, Placed):
            self._take(answer)
        elif isinstance(answer, Queued):
            self.held[request_id] = "queued"
        else:
            assert isinstance(answer, Unplaceable | Refused), answer
            self.held[request_id] = "new"
            self._gone(request_id)

    def _in(self, *states: str) -> list[str]:
        return [rid for rid, state in self.held.items() if state in states]

    # --- the rules ---------------------------------------------------------------------------

    @rule(prompt=st.integers(1, 4000))
    def offer(self, prompt: int) -> None:
        self.arrive(prompt)

    def arrive(self, prompt: int) -> str | None:
        """A request is offered; its id, if its handler is still running."""
        request_id = f"r{next(self.ids)}"
        answer, wakeups = self.brain.offer(Offer.exact(request_id, "chat", prompt), self._tick())
        if isinstance(answer, Refused) and not isinstance(answer.error, CapacityRejected):
            # Before any place was taken: the router is not admitting, or has no path.
            if isinstance(answer.error, RouterUnavailable):
                assert self.fenced
            else:
                assert isinstance(answer.error, BackendUnavailable)
                assert not self.admission.scheduler.has_path()
            assert not wakeups
            self._apply(self.brain.finished(Finished(request_id), self._tick()))  # nothing
            return None
        if isinstance(answer, Refused):
            assert isinstance(answer.error, CapacityRejected)
            if answer.error.reason == "retention":
                assert len(self.held) == RETAINED
                return None
            assert answer.error.reason == "queue"
            # Full: as many waiting as the limit, retries among them (they count, though
            # a full queue never turns one away).
            assert len(self._in("queued")) >= QUEUE_LIMIT
        assert not self.fenced, "admitted while fenced"
        self.held[request_id] = "new"
        self._apply(wakeups)
        self._own(request_id, answer)
        return request_id if request_id in self.held else None

    @precondition(lambda self: bool(self._in("prefill")))
    @rule(data=st.data())
    def first_token(self, data: st.DataObject) -> None:
        self.take_first_token(data.draw(st.sampled_from(self._in("prefill"))))

    def take_first_token(self, request_id: str) -> None:
        wakeups = self.brain.first_token(FirstToken(request_id), self._tick())
        self.held[request_id] = "decode"
        self.answered.add(request_id)
        self._apply(wakeups)

    @precondition(lambda self: bool(self._in("decode")))
    @rule(data=st.data(), tokens=st.integers(0, 10_000))
    def output_is_reported(self, data: st.DataObject, tokens: int) -> None:
        """A batch of output counts, one of them for a request the core no longer holds."""
        request_id = data.draw(st.sampled_from(self._in("decode")))
        produced = ((request_id, tokens), ("gone-long-ago", tokens))
        self.brain.progress(Progress(produced), self._tick())

    def _pd_prefilling(self) -> list[str]:
        return [
            rid
            for rid in self._in("prefill")
            if self.placed[rid].prefill is not None and rid not in self.answered
        ]

    @precondition(lambda self: bool(self._pd_prefilling()))
    @rule(data=st.data())
    def prefill_engine_answers(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(self._pd_prefilling()))
        wakeups = self.brain.prefill_done(PrefillDone(request_id), self._tick())
        self.answered.add(request_id)
        self._apply(wakeups)

    @precondition(lambda self: bool(self._in("prefill")))
    @rule(data=st.data(), on_prefill=st.booleans())
    def attempt_fails_before_headers(self, data: st.DataObject, on_prefill: bool) -> None:
        self.fail_attempt(data.draw(st.sampled_from(self._in("prefill"))), on_prefill)

    def fail_attempt(self, request_id: str, on_prefill: bool) -> None:
        placed = self.placed.pop(request_id)
        first = on_prefill and request_id not in self.answered
        failed = placed.first if first else placed.decode
        self.failed.setdefault(request_id, set()).add(failed)
        self.held[request_id] = "new"
        self.retrying.add(request_id)
        answer, wakeups = self.brain.failed(Failed(request_id, failed), self._tick())
        self._apply(wakeups)
        self._own(request_id, answer)

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def request_ends(self, data: st.DataObject) -> None:
        """Completed, cancelled by its client, expired (in the queue or streaming), or
        failed after headers: whichever, it sends one Finished, and all it held goes."""
        self._gone(data.draw(st.sampled_from(sorted(self.held))))

    @rule(data=st.data(), drained=st.booleans())
    def drain_or_undrain(self, data: st.DataObject, drained: bool) -> None:
        name = data.draw(st.sampled_from([e.name for e in self.engines]))
        self.registry.set_drained(name, drained)
        self._apply(self.brain.reconsider(Reconsider(monitoring_degraded=False), self._tick()))

    @rule(data=st.data(), up=st.booleans())
    def engine_goes_down_or_comes_back(self, data: st.DataObject, up: bool) -> None:
        self.set_engine_health(data.draw(st.sampled_from([e.name for e in self.engines])), up)

    def set_engine_health(self, name: str, up: bool) -> None:
        if up:
            self.healthy.add(name)
        else:
            self.healthy.discard(name)
        self._apply(self.brain.reconsider(Reconsider(monitoring_degraded=False), self._tick()))

    @rule()
    def lease_lost(self) -> None:
        """The router stops admitting: every queued request is refused (a 503) at once,
        as the gate refuses its waiters, and each handler unwinds."""
        self.fenced = True
        self.state.set("ha", "fenced")
        for request_id in self._in("queued"):
            self._gone(request_id)
        assert self.brain.counts().queued == 0

    @precondition(lambda self: self.fenced)
    @rule()
    def lease_won_back(self) -> None:
        self.fenced = False
        self.state.set("ha", None)

    # --- what must hold after every step --------------------------------------------------------

    @invariant()
    def router_slots_match_the_answers(self) -> None:
        if not hasattr(self, "brain"):
            return
        counts = self.brain.counts()
        prefill, decode = self._in("prefill"), self._in("decode")
        assert counts.prefill_in_use == len(prefill) <= PREFILL_LIMIT
        assert counts.decode_in_use == len(decode)
        assert len(prefill) + len(decode) <= DECODE_LIMIT
        assert counts.retained == len(self.held) <= RETAINED

    @invariant()
    def the_queue_is_the_queued_requests(self) -> None:
        if not hasattr(self, "brain"):
            return
        queued = self._in("queued")
        assert self.brain.counts().queued == len(queued)
        retries = len(self.retrying & set(queued))
        assert len(queued) <= QUEUE_LIMIT + retries  # a retry was admitted already

    @invariant()
    def a_queued_request_waits_only_for_what_it_can_get(self) -> None:
        """A request waits in the queue only while some eligible placement avoids the
        engines that failed it: one no engine can serve is refused at once, not left to
        wait out its admission wait."""
        if not hasattr(self, "brain"):
            return
        scheduler = self.admission.scheduler
        for request_id in self._in("queued"):
            assert scheduler.could_place(self.failed.get(request_id, set())), "waits in vain"

    @invariant()
    def every_engines_load_matches_the_answers(self) -> None:
        if not hasattr(self, "brain"):
            return
        for config in self.engines:
            name = config.name
            prefilling = [
                p
                for rid, p in self.placed.items()
                if self.held[rid] == "prefill" and rid not in self.answered and p.first == name
            ]
            bound = [rid for rid, p in self.placed.items() if p.decode == name]
            decoding = [rid for rid in bound if self.held[rid] == "decode"]
            load = self.registry.entries[name].load
            assert load.prefilling == len(prefilling)
            assert load.prefill_tokens == sum(p.prompt_tokens for p in prefilling)
            assert load.decode_bound == len(bound)
            assert load.decoding == len(decoding)
            limits = config.phase_concurrency
            if limits.prefill is not None:
                assert load.prefilling <= limits.prefill
            if limits.decode is not None:
                assert load.decode_bound <= limits.decode

    def teardown(self) -> None:
        if not hasattr(self, "brain"):
            return
        # One at a time: a release may wake others (placed, or unplaceable, whose handlers
        # unwind then), so a list taken beforehand would name some of them twice.
        while self.held:
            self._gone(next(iter(self.held)))
        counts = self.brain.counts()
        assert (counts.prefill_in_use, counts.decode_in_use, counts.retained) == (0, 0, 0)
        assert counts.queued == 0
        for entry in self.registry.entries.values():
            load = entry.load
            assert (load.prefilling, load.prefill_tokens, load.decode_bound, load.decoding) == (
                0,
                0,
                0,
                0,
            )


def test_the_machines_counterexample_a_retry_left_waiting_for_an_engine_it_cannot_use() -> None:
    """The interleaving the machine found (kept here so that it never depends on the
    Hypothesis database): b's decode engine fails it while p0, the one prefill engine
    left up, is at its limit; b must be unplaceable at once, not wait in the queue."""
    machine = DecisionMachine()
    machine.build("disaggregated")
    machine.set_engine_health("p1", up=False)
    a = machine.arrive(prompt=1)  # p0, which is then at its limit
    machine.set_engine_health("p1", up=True)
    b = machine.arrive(prompt=1)  # p1
    assert a is not None and b is not None
    assert machine.placed[b].first == "p1"
    machine.set_engine_health("p1", up=False)
    machine.fail_attempt(b, on_prefill=False)  # b's decode engine, d0, fails it
    machine.router_slots_match_the_answers()
    machine.the_queue_is_the_queued_requests()
    machine.every_engines_load_matches_the_answers()
    machine.a_queued_request_waits_only_for_what_it_can_get()
    assert b not in machine.held  # unplaceable: its handler has unwound
    machine.teardown()


def test_an_offer_while_the_lease_is_lost_holds_nothing() -> None:
    machine = DecisionMachine()
    machine.build("aggregated")
    machine.lease_lost()
    assert machine.arrive(prompt=10) is None
    assert machine.brain.counts().retained == 0
    machine.lease_won_back()
    assert machine.arrive(prompt=10) is not None
    machine.teardown()


DecisionMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None
)
test_admission_under_any_interleaving = DecisionMachine.TestCase
