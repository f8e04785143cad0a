"""The predictive check (sans-IO): can this request's first token arrive within the budget?

It runs once per request, after the retention limit and before the admission queue, and
looks at every placement-eligible path: a `both` engine, or (when the fleet has
eligible prefill and decode engines, as the scheduler would place it) the best prefill
engine with the best decode engine. For each it projects (`scheduler.predictive`)

    TTFT = wait in Narwhal's queue + prefill backlog on the engine + this prompt's prefill
           (+ KV transfer and the decode engine's first step, for a P/D pair)

(with cache-aware placement, each engine's prefill counts only the prompt tokens it
would not find in its prefix cache) and compares the projection, as projections have
been turning out (`ModelBook.upper`: the 99th-percentile ratio of measured to
projected), with what is left of the budget:

1. If even the fastest path's prefill of the prompt alone, with nothing ahead, does not
   fit `admission.ttft_target_s` → 429 `prompt_exceeds_ttft_budget` (shorten the prompt
   or raise the target), counted `refused{reason="prompt"}`. Nothing reaches an engine.
2. Else if the best projection does not fit what is left of the budget → 429
   `ttft_budget_exceeded` with `Retry-After` = the overrun in whole seconds, rounded
   half up, at least 1; counted `refused{reason="projected"}`.
3. Else the request is admitted; the projection is kept on its ticket, to be compared at
   its first token with what it turned into. An admitted request is never refused
   later: retries and queue waits are bounded by its deadlines (504), not by this check.

The queue wait is the work of the requests queued ahead (of its own class or a higher
one: those are what will run before it), shared over the paths: each queued request
counted at the mean prefill the paths' models give this prompt.

Priority classes (`classes.py`): a request is admitted only while its bound fits its
class's share of the budget, counted from the highest class active in the last
ACTIVE_CLASS_S (so one class alone has it all) and moved by its tenant's standing against
its fair share of the work lately (`PriorityClasses.standing_rank`); and not at all for
CLASS_HOLD_S after a request ranked above it was refused as projected. So under overload
the lowest class is refused first, then the tenant that floods, and a lower class is
never admitted while a higher one is being refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from narwhal.admission.classes import PriorityClasses
from narwhal.errors import PromptExceedsTtftBudget, TtftBudgetExceeded
from narwhal.models.book import ModelBook
from narwhal.models.rate import DecayingRate
from narwhal.scheduler.placement import CachedTokens, Phase, PlacementRequest
from narwhal.scheduler.predictive import PrefillParts, prefill_part, uncached_tokens
from narwhal.scheduler.registry import EngineEntry, EngineRegistry

# What the check would do: admit, or refuse by one of its two rows; "unmodelled" when no
# path has a model (placement will say 503).
Verdict = Literal["admit", "prompt", "projected", "unmodelled"]

# Overload, as the check's own verdicts show it: more than this share of the decisions of
# about the last OVERLOAD_TAU_S seconds (at least OVERLOAD_DECISIONS of them) refused as
# projected over the budget. Sizing then stops waiting on engines' counts to refuse
# (`narwhal.decision.brain`).
OVERLOAD_SHARE: Final = 0.05
OVERLOAD_TAU_S: Final = 2.0
OVERLOAD_DECISIONS: Final = 20
# After a request of a class is refused as projected, for this long no request of a lower
# class is admitted: what the fleet cannot take from a higher class it does not give a
# lower one, whatever their prompts.
CLASS_HOLD_S: Final = 0.05
# A class is active while a request of it was checked within this long: shares are
# counted from the highest active class, so traffic of one class (any class) has the
# whole budget, and a lower class leaves headroom only for classes that are sending.
ACTIVE_CLASS_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class Projection:
    raw: float  # seconds from the check to the first token, as the models say
    solo: float  # the fastest path's prefill of the prompt alone
    expected: float  # raw, corrected by how projections have turned out (median)
    upper: float  # raw, as it turns out 99 times in 100 (as seen so far)


class PredictiveCheck:
    def __init__(
        self,
        registry: EngineRegistry,
        book: ModelBook,
        *,
        ttft_budget_s: float,
        refused: Callable[[str], None] | None = None,
        prefix: CachedTokens | None = None,
        classes: PriorityClasses | None = None,
        standing: Callable[[str, float], str] | None = None,
        parts: PrefillParts | None = None,
    ) -> None:
        """`classes`: each class's share of the budget (None: every request has it all);
        `standing(tenant, now)`: the tenant's standing against its fair share of the
        work lately (`Tenants.standing`), which moves its classes' shares; `parts`: where
        each path's prefill part is kept for the scorer placing the same request (the
        decision core forgets them after each decision)."""
        self._registry = registry
        self.parts = PrefillParts() if parts is None else parts
        self.classes = classes
        self._standing = standing
        # The last refusal as projected at each rank (`_rank`).
        self._refused_at: dict[float, float] = {}
        self._checked_at: dict[int, float] = {}  # each class's last request checked
        self._book = book
        self._prefix = prefix
        self.budget = ttft_budget_s
        self._refused = refused
        # Decisions and `projected` refusals over about the last OVERLOAD_TAU_S seconds.
        self._decided = DecayingRate(tau_s=OVERLOAD_TAU_S)
        self._refusing = DecayingRate(tau_s=OVERLOAD_TAU_S)

    def overloaded(self, now: float) -> bool:
        """Whether more than OVERLOAD_SHARE of the recent decisions (at least
        OVERLOAD_DECISIONS of them) were `projected` refusals: the fleet is full, and
        whichever request is refused, the next arrival takes its place."""
        decided = self._decided.value(now)
        if decided * OVERLOAD_TAU_S < OVERLOAD_DECISIONS:
            return False
        return self._refusing.value(now) > OVERLOAD_SHARE * decided

    def project(self, request: PlacementRequest, now: float, queued: int) -> Projection | None:
        """The best projection over the eligible paths (the one with the lowest bound);
        None when there is none."""
        registry = self._registry
        prefills = registry.candidates("prefill")
        decodes = registry.candidates("decode")
        if prefills and decodes:
            # The decode half adds its KV transfer and first step; the fastest one counts.
            step = min(
                (e.model.first_step(request.prompt_tokens) for e in decodes if e.model),
                default=math.inf,
            )
            if math.isinf(step):
                return None
            return self._best(prefills, request, now, queued, step)
        return self._best(registry.candidates("both"), request, now, queued, 0.0)

    def verdict(
        self, request: PlacementRequest, *, arrived: float, now: float, queued: int
    ) -> Verdict:
        """What `check` would do with the request, without doing it (nothing counted or
        raised): for sizing, which asks it at both ends of an estimate's bounds."""
        projection = self.project(request, now, queued)
        return self._verdict(projection, self._rank(request, now), arrived, now)

    def _verdict(
        self, projection: Projection | None, rank: float, arrived: float, now: float
    ) -> Verdict:
        """`rank`: where the request ranks for the budget (`_rank`)."""
        if projection is None:
            return "unmodelled"
        if projection.solo > self.budget:  # already the prompt alone's bound
            return "prompt"
        if projection.upper > self._left(rank, arrived, now):
            return "projected"
        if self._held(rank, now):
            return "projected"
        return "admit"

    def _left(self, rank: float, arrived: float, now: float) -> float:
        """What is left of the request's budget: its rank's share, less its time here."""
        return self.budget * self._share(rank) - (now - arrived)

    def _rank(self, request: PlacementRequest, now: float) -> float:
        """Where the request ranks for the budget: its class, moved by its tenant's
        standing against its fair share, counted from the highest active class."""
        classes = self.classes
        if classes is None:
            return 0.0
        rank: float = request.priority
        if self._standing is not None:
            rank = classes.standing_rank(request.priority, self._standing(request.tenant, now))
        top = min(
            (r for r, at in self._checked_at.items() if now - at < ACTIVE_CLASS_S),
            default=request.priority,
        )
        return max(0.0, rank - min(top, request.priority))

    def _share(self, rank: float) -> float:
        classes = self.classes
        return 1.0 if classes is None else classes.share(rank)

    def _held(self, rank: float, now: float) -> bool:
        """Whether a request ranked above `rank` was refused as projected within
        CLASS_HOLD_S."""
        return any(
            now - at < CLASS_HOLD_S for higher, at in self._refused_at.items() if higher < rank
        )

    def check(
        self, request: PlacementRequest, *, arrived: float, now: float, queued: int
    ) -> Projection | None:
        """Admit (the projection, or None when no path is modelled: placement will say
        503) or raise the 429 the projection calls for."""
        self._checked_at[request.priority] = now  # its class is active
        projection = self.project(request, now, queued)
        rank = self._rank(request, now)
        verdict = self._verdict(projection, rank, arrived, now)
        if verdict == "unmodelled":
            return None
        assert projection is not None
        self._decided.add(1.0, now)
        if verdict == "prompt":
            self._count("prompt")
            raise self._prompt_refusal(request)
        if verdict == "projected":
            self._refusing.add(1.0, now)
            self._count("projected")
            self._refused_idle(request, now)
            left = self._left(rank, arrived, now)
            overrun = projection.upper - left
            retry_after = max(1, math.floor(overrun + 0.5))
            if overrun <= 0:  # held: a higher class was refused just now
                raise TtftBudgetExceeded(
                    "The fleet is refusing requests of a higher priority class; retry in "
                    f"{retry_after} s.",
                    retry_after=retry_after,
                )
            self._refused_at[rank] = now
            budget = f"TTFT budget of {self.budget:g} s"
            if self._share(rank) < 1.0:
                budget = (
                    f"share of the {budget} its priority class and tenant are given "
                    f"({left:.2f} s left)"
                )
            raise TtftBudgetExceeded(
                f"The first token is projected at {projection.upper:.2f} s, over the "
                f"{budget} by {overrun:.2f} s; retry in {retry_after} s.",
                retry_after=retry_after,
            )
        return projection

    def _prompt_refusal(self, request: PlacementRequest) -> PromptExceedsTtftBudget:
        """The prompt-alone 429, with the advice that can help: where the prompt (as
        sized here, maybe an estimate the context check let through) fills the model's
        whole context, no budget would serve it, and raising one is no advice."""
        tokens = request.prompt_tokens
        param = "messages" if request.route == "chat" else "prompt"
        limit = self._registry.max_model_len()
        if limit is not None and tokens >= limit:
            return PromptExceedsTtftBudget(
                f"The prompt (about {tokens} tokens) leaves no room for output in the "
                f"model's context of {limit} tokens, and would take longer than the TTFT "
                f"budget of {self.budget:g} s on every engine besides; shorten the prompt.",
                param=param,
            )
        return PromptExceedsTtftBudget(
            f"The prompt alone ({tokens} tokens) would take longer than the TTFT budget of "
            f"{self.budget:g} s on every engine; shorten the prompt or raise "
            "admission.ttft_target_s.",
            param=param,
        )

    def _refused_idle(self, request: PlacementRequest, now: float) -> None:
        """Tell the idle engines among the paths that they refused: learning only from
        what is admitted, their bounds would never see what could lower them
        (`narwhal.models.idle_refusals`)."""
        roles: tuple[Phase, ...] = ("both", "prefill")
        for role in roles:
            for entry in self._registry.candidates(role):
                model = entry.model
                if model is not None and model.idle:
                    tokens = uncached_tokens(self._prefix, entry, request)
                    model.idle_refusals.refused(tokens, now)

    def _count(self, reason: str) -> None:
        if self._refused is not None:
            self._refused(reason)

    def _best(
        self,
        entries: list[EngineEntry],
        request: PlacementRequest,
        now: float,
        queued: int,
        decode_part: float,
    ) -> Projection | None:
        """The path with the lowest bound, each engine pricing only what it would not find
        in its prefix cache, bounded by its own calibration. `solo` is the fastest
        prefill of the prompt alone, bounded the same way but without the lateness of
        the work in flight (the prompt alone is what the first 429 row is about)."""
        modelled = []
        solo = math.inf
        total = 0.0
        for entry in entries:
            model = entry.model
            if model is None:
                continue
            tokens = uncached_tokens(self._prefix, entry, request)
            alone = model.solo(tokens) + decode_part
            solo = min(solo, model.calibration.upper(alone, alone=True))
            total += alone
            modelled.append((entry, model, tokens))
        if not modelled:
            return None
        # The queue's wait: the requests queued ahead, each at this prompt's mean prefill
        # alone, shared over the paths.
        waiting = queued * (total / len(modelled)) / len(modelled) if queued else 0.0
        best: Projection | None = None
        parts = self.parts
        for entry, model, tokens in modelled:
            part = prefill_part(entry, model, tokens, now)
            parts.keep(request, entry.name, tokens, part)
            raw = part + decode_part + waiting
            upper = model.upper(raw, now)
            if best is None or upper < best.upper:
                best = Projection(raw, solo, model.expected(raw), upper)
        return best
