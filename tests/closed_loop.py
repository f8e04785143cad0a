"""Narwhal's decision core against a simulated engine, in virtual time (sans-IO, no sockets).

The predictive stack the router builds (`narwhal.router`: registry, model book, placement
learning, projecting scorer, predictive check, admission controller, behind the decision
core `Brain`) is driven here by an engine's step model (`narwhal.sim.model`, any of its
prefill disciplines) on one clock, through the core's messages alone: arrivals are
offered as the dispatcher offers them, each engine runs its steps back to back while it
has work, first tokens, the output produced (in batches) and the end go back as the gate
reports them (counted by a real `OutputTracker` fed events of the engine's shape), and
the engines' metrics are scraped once a second as the fleet monitor would.

What it is for: measuring the projection and its bound against engines of disciplines it
was not designed on, at loads and load steps that would take minutes in real time, with
results that do not depend on the host's noise (tests and `scripts/perf/projection.py`).
It is not the router: HTTP, sizing and retries are not here, and sizing is exact.

Profiling runs the same probes as `narwhal.profiling.runs` (solo, one after another,
then together), on the engine's model in virtual time.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from narwhal.admission.controller import Admission
from narwhal.admission.predictive import PredictiveCheck
from narwhal.config import EngineConfig
from narwhal.decision.brain import Brain, BrainSettings
from narwhal.decision.messages import (
    Finished,
    FirstToken,
    Offer,
    OutputSummary,
    Placed,
    Progress,
    Queued,
    Refused,
    Wakeups,
)
from narwhal.dispatch.gate import PROGRESS_EVERY_S
from narwhal.errors import CapacityRejected, PromptExceedsTtftBudget, TtftBudgetExceeded
from narwhal.fleet.scrape import EngineScrape
from narwhal.fleet.state import EngineHealth
from narwhal.models.book import ModelBook
from narwhal.models.profile import (
    CONCURRENT_OUTPUT,
    CONCURRENT_PROBES,
    CONCURRENT_PROMPT,
    PROBE_OUTPUT,
    PROBE_PROMPTS,
    ConcurrentSample,
    ProbeSample,
    dot,
    fit_concurrency,
    fit_profile,
    prefill_features,
)
from narwhal.ops.state import RouterState
from narwhal.protocol.tracker import OutputTracker
from narwhal.scheduler.learning import PlacementLearning
from narwhal.scheduler.predictive import PrefillParts, ProjectingScorer
from narwhal.scheduler.registry import EngineRegistry
from narwhal.scheduler.scheduler import Scheduler
from narwhal.sim import model as sim_model
from narwhal.sim.options import SimOptions

Policy = Literal["predictive", "open", "queue"]
SCRAPE_EVERY_S = 1.0
# The engines the projection is measured against (tests and scripts/perf/projection.py):
# the sim's prefill disciplines, and a chunked engine shaped like vLLM's CPU build on a
# tiny model (2,048-token steps, fast prefill, cheap decode).
PROMPTS = (256, 4096)
OUTPUTS = (32, 256)
_BASE = SimOptions()
DISCIPLINES: dict[str, SimOptions] = {
    "chunked-8192": _BASE,
    "chunked-2048": replace(_BASE, max_num_batched_tokens=2048),
    "chunked-cpu": replace(
        _BASE,
        max_num_batched_tokens=2048,
        prefill_tokens_per_s=60_000,
        decode_base_ms=1.5,
        decode_per_seq_ms=0.3,
    ),
    "serial": replace(_BASE, prefill_discipline="serial"),
    "sglang": replace(_BASE, prefill_discipline="sglang"),
    "sequential": replace(_BASE, prefill_discipline="sequential"),
}


def make_engine(options: SimOptions) -> sim_model.Scheduler:
    """The engine's step model for its options (its prefill discipline among them)."""
    factory: Callable[[SimOptions], sim_model.Scheduler] | None = getattr(
        sim_model, "make_scheduler", None
    )
    return factory(options) if factory is not None else sim_model.Scheduler(options)


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float
    prompt_tokens: int
    output_tokens: int


@dataclass(slots=True)
class Record:
    arrival: Arrival
    outcome: str = "pending"  # admitted | refused_prompt | refused_projected | rejected
    engine: str | None = None
    checked_upper: float | None = None  # the projection's bound on TTFT from arrival
    first_token_at: float | None = None
    done_at: float | None = None

    @property
    def ttft(self) -> float | None:
        if self.first_token_at is None:
            return None
        return self.first_token_at - self.arrival.at


def poisson(
    rate: float,
    seconds: float,
    prompts: tuple[int, int],
    outputs: tuple[int, int],
    *,
    seed: int,
    start: float = 0.0,
) -> list[Arrival]:
    """Open-loop Poisson arrivals, prompt and output lengths log-uniform in their ranges."""
    rng = random.Random(seed)
    arrivals = []
    now = start
    while True:
        now += rng.expovariate(rate)
        if now >= start + seconds:
            return arrivals
        arrivals.append(Arrival(now, _log_uniform(rng, prompts), _log_uniform(rng, outputs)))


def _log_uniform(rng: random.Random, bounds: tuple[int, int]) -> int:
    low, high = bounds
    return round(math.exp(rng.uniform(math.log(low), math.log(high))))


@dataclass(slots=True)
class _EngineRun:
    name: str
    engine: sim_model.Scheduler
    busy: bool = False


@dataclass(order=True, slots=True)
class _Event:
    at: float
    order: int
    kind: str = field(compare=False)
    payload: object = field(compare=False)


class ClosedLoop:
    """One fleet of simulated engines behind Narwhal's decision core, on one clock."""

    def __init__(
        self,
        engines: Sequence[SimOptions],
        *,
        budget: float,
        policy: Policy = "predictive",
        prefill_limit: int = 4096,
        queue_limit: int = 4096,
    ) -> None:
        configs = [
            EngineConfig(name=f"e{i}", url=f"http://127.0.0.1:{9000 + i}", dialect="vllm")
            for i in range(len(engines))
        ]
        self.budget = budget
        self.policy = policy
        self.registry = EngineRegistry(configs)
        self.runs = {
            c.name: _EngineRun(c.name, make_engine(opts))
            for c, opts in zip(configs, engines, strict=True)
        }
        self.options = {c.name: opts for c, opts in zip(configs, engines, strict=True)}
        self.book: ModelBook | None = None
        self.check: PredictiveCheck | None = None
        listener = None
        self.scheduler = Scheduler(self.registry)
        if policy == "predictive":
            self.book = ModelBook(self.registry.entries, ttft_budget_s=budget)
            for name, entry in self.registry.entries.items():
                entry.model = self.book.model(name)
            self.registry.set_ready_predicate(lambda entry: entry.model is not None)
            listener = PlacementLearning(self.book)
            parts = PrefillParts()  # shared as the router shares them
            self.scheduler.scorer = ProjectingScorer(self.book, parts=parts, clock=lambda: self.now)
            self.check = PredictiveCheck(
                self.registry, self.book, ttft_budget_s=budget, parts=parts
            )
        admission = Admission(
            self.scheduler,
            max_retained=1 << 20,
            queue_limit=queue_limit,
            prefill_limit=prefill_limit,
            decode_limit=1 << 20,
            listener=listener,
        )
        self.brain = Brain(
            BrainSettings(ttft_target_s=budget),
            RouterState(),
            admission,
            check=self.check,
            lengths=None if self.book is None else self.book.lengths,
        )
        self.now = 0.0
        self._events: list[_Event] = []
        self._order = itertools.count()
        self._ids = itertools.count()
        self._records: dict[str, Record] = {}  # by request id, while admitted
        self._outputs: dict[str, OutputTracker] = {}  # by request id, once placed
        self._progress_at = -math.inf
        self._scrape()

    # --- profiling ---------------------------------------------------------------------------

    def profile(self) -> None:
        """Profile every engine as the profiler does: the probes one after another, then
        prompts sent together."""
        if self.book is None:
            return
        for name, run in self.runs.items():
            samples = []
            for tokens in PROBE_PROMPTS:
                times = self._probe(run, [tokens], PROBE_OUTPUT)[0]
                tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
                samples.append(ProbeSample(tokens, times[0], tpot))
            profile = fit_profile(samples, source="token_ids", wall=0.0, now=self.now)
            together = self._probe(run, [CONCURRENT_PROMPT] * CONCURRENT_PROBES, CONCURRENT_OUTPUT)
            sample = ConcurrentSample(
                CONCURRENT_PROMPT, tuple(t[0] for t in together), tuple(t[-1] for t in together)
            )
            solo = dot(profile.prefill, prefill_features(CONCURRENT_PROMPT, 0.0))
            profile = profile.with_concurrency(fit_concurrency(sample, solo))
            self.book.model(name).install(profile)
        self.registry.invalidate()

    def _probe(self, run: _EngineRun, prompts: list[int], output: int) -> list[list[float]]:
        """Probes sent at once; each one's output times, from their sending."""
        start = self.now
        seqs = [sim_model.Sequence(tokens, output, finish_reason="length") for tokens in prompts]
        for seq in seqs:
            run.engine.add(seq, start)
        times: dict[sim_model.Sequence, list[float]] = {seq: [] for seq in seqs}
        while not all(seq.finished for seq in seqs):
            step = run.engine.schedule(self.now)
            assert step is not None, "a probe is waiting on an engine that does nothing"
            self.now += step.duration
            result = run.engine.finish_step(step, self.now)
            for seq in result.progressed:
                if seq in times:
                    times[seq].append(self.now - start)
        return [times[seq] for seq in seqs]

    # --- running -----------------------------------------------------------------------------

    def run(self, arrivals: Iterable[Arrival], *, drain_s: float = 120.0) -> list[Record]:
        """Offer the arrivals; run until every admitted request is done (or `drain_s`
        after the last arrival). Records in arrival order."""
        records = []
        last = self.now
        for arrival in arrivals:
            self._push(arrival.at, "arrival", arrival)
            last = max(last, arrival.at)
        self._push(self.now + SCRAPE_EVERY_S, "scrape", None)
        end = last + drain_s
        while self._events:
            event = heapq.heappop(self._events)
            if event.at > end:
                break
            self.now = max(self.now, event.at)
            if event.kind == "arrival":
                assert isinstance(event.payload, Arrival)
                records.append(self._arrive(event.payload))
            elif event.kind == "step":
                assert isinstance(event.payload, tuple)
                self._step_done(*event.payload)
            elif event.kind == "change":
                assert callable(event.payload)
                event.payload(self)
            elif event.kind == "scrape":
                self._scrape()
                if any(r.outcome == "pending" for r in self._records.values()) or (self.now < last):
                    self._push(self.now + SCRAPE_EVERY_S, "scrape", None)
        return records

    def at(self, when: float, change: Callable[[ClosedLoop], None]) -> None:
        """Run `change` at virtual time `when` (an engine that slows down, say)."""
        self._push(when, "change", change)

    def _push(self, at: float, kind: str, payload: object) -> None:
        heapq.heappush(self._events, _Event(at, next(self._order), kind, payload))

    def _time(self) -> float:
        """The time for the core, the output produced sent first as the gate sends it:
        in a batch, at most every PROGRESS_EVERY_S."""
        now = self.now
        if self._outputs and now - self._progress_at >= PROGRESS_EVERY_S:
            self._progress_at = now
            produced = tuple((rid, out.tokens) for rid, out in self._outputs.items())
            self.brain.progress(Progress(produced), now)
        return now

    def _arrive(self, arrival: Arrival) -> Record:
        record = Record(arrival)
        request_id = f"r{next(self._ids)}"
        offer = Offer.exact(request_id, "completion", arrival.prompt_tokens, None, arrived=self.now)
        answer, wakeups = self.brain.offer(offer, self._time())
        if isinstance(answer, Refused):
            error = answer.error
            if isinstance(error, PromptExceedsTtftBudget):
                record.outcome = "refused_prompt"
            elif isinstance(error, TtftBudgetExceeded):
                record.outcome = "refused_projected"
            else:
                assert isinstance(error, CapacityRejected), error
                record.outcome = "rejected"
            self._wake(self.brain.finished(Finished(request_id), self.now))
            return record
        assert isinstance(answer, Placed | Queued), answer
        record.outcome = "admitted"
        self._records[request_id] = record
        if isinstance(answer, Placed):
            self._submit(answer)
        self._wake(wakeups)
        return record

    def _wake(self, wakeups: Wakeups) -> None:
        for placed in wakeups.placed:
            self._submit(placed)
        for request_id in wakeups.unplaceable:
            self._records.pop(request_id, None)

    def _submit(self, placed: Placed) -> None:
        record = self._records[placed.request_id]
        record.engine = placed.first
        record.checked_upper = placed.projected_upper
        run = self.runs[placed.first]
        seq = sim_model.Sequence(
            placed.prompt_tokens, record.arrival.output_tokens, finish_reason="length"
        )
        seq.waiter = placed.request_id
        self._outputs[placed.request_id] = OutputTracker("completion", token_ids=True, choices=1)
        run.engine.add(seq, self.now)
        self._kick(run)

    def _kick(self, run: _EngineRun) -> None:
        if run.busy:
            return
        step = run.engine.schedule(self.now)
        if step is None:
            return
        run.busy = True
        self._push(self.now + step.duration, "step", (run, step))

    def _step_done(self, run: _EngineRun, step: sim_model.Step) -> None:
        run.busy = False
        result = run.engine.finish_step(step, self.now)
        wakeups = Wakeups()
        for seq in result.progressed:
            request_id = seq.waiter
            if not isinstance(request_id, str):
                continue
            output = self._outputs[request_id]
            reason = "length" if seq.finished else None
            output.observe(
                {"choices": [{"index": 0, "text": "x", "token_ids": [7], "finish_reason": reason}]},
                self.now,
            )
            record = self._records[request_id]
            if record.first_token_at is None:
                record.first_token_at = self.now
                wakeups += self.brain.first_token(FirstToken(request_id), self._time())
            if seq.finished:
                record.done_at = self.now
                del self._outputs[request_id]
                summary = OutputSummary.of(output)
                wakeups += self.brain.finished(Finished(request_id, summary), self._time())
                self._records.pop(request_id, None)
        self._wake(wakeups)
        self._kick(run)

    def _scrape(self) -> None:
        for name, run in self.runs.items():
            entry = self.registry.entries[name]
            engine = run.engine
            health = entry.health or EngineHealth(stale_after_s=5.0, status="up")
            health.last_scrape = EngineScrape(
                running=float(engine.num_running),
                waiting=float(engine.num_waiting),
                kv_usage=engine.kv_usage,
            )
            health.last_scrape_at = self.now
            health.own_at_scrape = entry.own_requests  # as the fleet monitor reads it
            entry.health = health

    def pending(self) -> Iterator[str]:
        """The requests admitted and not yet done, by id."""
        return iter(list(self._records))


# --- what a run says ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Summary:
    offered: int
    admitted: int
    refused: int
    rejected: int
    within: int  # admitted whose TTFT met the budget
    over_bound: int  # admitted whose TTFT exceeded the projection's upper bound
    bounded: int  # admitted with a projection
    ttft_p50: float
    ttft_p99: float
    seconds: float

    @property
    def within_share(self) -> float:
        return self.within / self.admitted if self.admitted else 1.0

    @property
    def refused_share(self) -> float:
        return self.refused / self.offered if self.offered else 0.0

    @property
    def over_bound_share(self) -> float:
        return self.over_bound / self.bounded if self.bounded else 0.0

    @property
    def goodput(self) -> float:
        return self.within / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        return (
            f"offered {self.offered} admitted {self.admitted} refused {self.refused} "
            f"({self.refused_share:.1%}) within {self.within_share:.2%} "
            f"goodput {self.goodput:.2f}/s p50 {self.ttft_p50 * 1e3:.0f} ms "
            f"p99 {self.ttft_p99 * 1e3:.0f} ms over-bound {self.over_bound_share:.2%}"
        )


def summarize(records: Sequence[Record], budget: float, seconds: float) -> Summary:
    admitted = [r for r in records if r.outcome == "admitted"]
    ttfts = sorted(r.ttft if r.ttft is not None else math.inf for r in admitted)
    bounded = [r for r in admitted if r.checked_upper is not None]
    return Summary(
        offered=len(records),
        admitted=len(admitted),
        refused=sum(r.outcome.startswith("refused") for r in records),
        rejected=sum(r.outcome == "rejected" for r in records),
        within=sum(t <= budget for t in ttfts),
        over_bound=sum(
            (r.ttft if r.ttft is not None else math.inf) > (r.checked_upper or 0.0) for r in bounded
        ),
        bounded=len(bounded),
        ttft_p50=_quantile(ttfts, 0.5),
        ttft_p99=_quantile(ttfts, 0.99),
        seconds=seconds,
    )


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(q * len(values)))]


def capacity(options: SimOptions, prompts: tuple[int, int], outputs: tuple[int, int]) -> float:
    """Requests per second the engine completes when always full (measured, not computed):
    a closed run that keeps enough requests in it to saturate, in virtual time."""
    engine = make_engine(options)
    rng = random.Random(7)
    now = 0.0
    in_flight: set[sim_model.Sequence] = set()
    done = 0
    started_at = None
    concurrency = 64
    total = 400
    submitted = 0
    while done < total:
        while len(in_flight) < concurrency and submitted < total:
            seq = sim_model.Sequence(
                _log_uniform(rng, prompts), _log_uniform(rng, outputs), finish_reason="length"
            )
            engine.add(seq, now)
            in_flight.add(seq)
            submitted += 1
        step = engine.schedule(now)
        assert step is not None
        now += step.duration
        result = engine.finish_step(step, now)
        for seq in result.finished:
            in_flight.discard(seq)
            done += 1
            if done == total // 4:
                started_at = now
    assert started_at is not None
    return (total - total // 4) / (now - started_at)


__all__ = [
    "Arrival",
    "ClosedLoop",
    "Record",
    "Summary",
    "capacity",
    "poisson",
    "replace",
    "summarize",
]
