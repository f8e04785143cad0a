"""One engine's performance model (sans-IO): its profile, what it has learned, its lane.

What placement and the predictive check ask of an engine, with `now` passed in:

    ttft(prompt, ...)           seconds until a prompt placed now has its first token:
                                the lane's steps, or longer while every sequence slot
                                or the KV cache's room is taken (until decodes finish)
    service(prompt, decoding)   seconds this prompt's prefill takes alone
    backlog(now)                seconds of prefill work Narwhal has placed there, left
    tpot(decoding)              seconds per output token for a request decoding there
    first_step(prompt)          decode engines: the KV transfer and first step
    drift, penalty              how much slower than its profile it is (> 0), and the
                                cost multiplier placement applies for it

What it is told, from the transitions admission makes and from every served request:
a prefill placed or finished (its measured service time, by the lane's departure rule),
a TPOT observed, a first decode step measured. Each updates an online least-squares fit
(`AnchoredLeastSquares`, anchored to the profile) and the drift scores. Everything is
O(1) per call and the state is bounded by the requests in flight.

Until it is profiled, an engine's model runs on generic defaults; predictive admission
does not place work on it then (the registry's ready gate).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import replace
from typing import Any, Final

from narwhal.models import one_at_a_time
from narwhal.models.calibration import Calibration
from narwhal.models.decode import DecodeBook
from narwhal.models.discipline import EngineDiscipline
from narwhal.models.drift import DriftScore, DriftWatch
from narwhal.models.idle_refusals import IdleRefusals
from narwhal.models.kv_cache import KvCacheRoom
from narwhal.models.lane import PrefillLane, StepCosts
from narwhal.models.lengths import OutputLengths
from narwhal.models.pending import PendingPrefill, PendingPrefills
from narwhal.models.profile import (
    MIN_PREFILL_S,
    MIN_TPOT_S,
    Profile,
    Profiling,
    dot,
    first_step_features,
    per_prompt_cost,
    prefill_features,
    throughput_prior,
    tpot_features,
)
from narwhal.models.rate import DecayingRate
from narwhal.models.regression import AnchoredLeastSquares
from narwhal.models.throughput import PrefillThroughput

# Before any profile: an 8B-class model on one modern GPU, roughly.
DEFAULT_PROFILE: Final = Profile(
    prefill=(0.01, 0.05, 0.0, 0.006),
    tpot=(0.006, 0.006),
    first_step=(0.012, 0.005),
    measured_at=0.0,
    measured_monotonic=0.0,
    samples=0,
    source="token_ids",
)
# How many samples' weight the profile has in each fit, per coefficient. The intercepts
# and the prompt slope are measured by the probes (firm); the load slopes are guesses.
_PREFILL_STRENGTH: Final = (8.0, 8.0, 40.0, 2.0)
_TPOT_STRENGTH: Final = (8.0, 2.0)
_FIRST_STEP_STRENGTH: Final = (4.0, 4.0)
_HALF_LIFE: Final = 200.0  # samples
# A measured sample more than this factor away from the model is clipped to it, so a
# stall or a clock jump moves the fit by one bounded step, not to the moon.
_CLIP: Final = 10.0
_RATE_TAU_S: Final = 2.0  # the prefill-rate averages' time constant
# TPOT observed where prefill stretched decode steps more than this is not learned from.
_MAX_LEARNED_STRETCH: Final = 2.0
_TTFT_KEPT_S: Final = 0.001

DEFAULT_STEP_BUDGET: Final = 8192  # vLLM's max_num_batched_tokens on large GPUs
DEFAULT_MAX_SEQUENCES: Final = 256  # vLLM's max_num_seqs


class EngineModel:
    def __init__(
        self,
        name: str,
        *,
        step_budget: int = DEFAULT_STEP_BUDGET,
        max_sequences: int = DEFAULT_MAX_SEQUENCES,
        lengths: OutputLengths | None = None,
        calibration: Calibration | None = None,
    ) -> None:
        self.name = name
        self.step_budget = step_budget
        self.max_sequences = max_sequences
        self.kv_cache = KvCacheRoom()
        # The requests decoding here, their remaining work corrected as they produce.
        self.decoding = DecodeBook(lengths or OutputLengths())
        self.profile: Profile | None = None
        self.profiling = Profiling()
        self._baseline = DEFAULT_PROFILE  # what drift is measured against
        self.prefill_fit = AnchoredLeastSquares(
            DEFAULT_PROFILE.prefill, _PREFILL_STRENGTH, half_life=_HALF_LIFE
        )
        self.tpot_fit = AnchoredLeastSquares(
            DEFAULT_PROFILE.tpot, _TPOT_STRENGTH, half_life=_HALF_LIFE
        )
        self.first_step_fit = AnchoredLeastSquares(
            DEFAULT_PROFILE.first_step, _FIRST_STEP_STRENGTH, half_life=_HALF_LIFE
        )
        self.drift_watch = DriftWatch()
        self.lane = PrefillLane()
        self.throughput = PrefillThroughput(*throughput_prior(DEFAULT_PROFILE), max_sequences)
        # How this engine's projections turn out: the bound admission uses.
        self.calibration = calibration or Calibration(budget_s=1.0)
        self._rate = DecayingRate(
            tau_s=_RATE_TAU_S
        )  # prompt tokens per second placed here for prefill
        self._starts = DecayingRate(tau_s=_RATE_TAU_S)  # prompts per second placed here for prefill
        self._stretched_at = -math.inf  # when prefill last stretched decode steps a lot
        self.observed_at = -math.inf  # when a served request last taught the model
        self._pending = PendingPrefills()
        # Whether it serves one request at a time, and what its steps hold.
        self.discipline = EngineDiscipline()
        self.tpot_observed: float | None = None  # an average of what requests saw
        self._costs: tuple[tuple[int, int, int, int], StepCosts] | None = None
        self._last_ttft: tuple[tuple[object, ...], float, float] | None = None
        # Refusals made while it was idle: when the router probes it to learn again.
        self.idle_refusals = IdleRefusals()

    # --- profile --------------------------------------------------------------------------

    @property
    def profiled(self) -> bool:
        return self.profile is not None

    def install(self, profile: Profile, *, same_process: bool = False) -> None:
        """A new baseline (first profile or re-profile): the fits restart from it.
        `same_process`: a re-profile for drift of an engine that did not restart, whose
        bound's calibration is kept: its errors are the host's and the load's as much as
        the profile's, and reset, the bound would go back to the few-samples regime
        (a prior margin, the second largest of a handful) where first tokens exceed it
        several times as often. On a real vLLM under steady load, probes among its
        requests re-profiled it every 35 s, each a reset."""
        self.profile = profile
        self._baseline = profile
        self.prefill_fit.reset(profile.prefill)
        self.tpot_fit.reset(profile.tpot)
        self.first_step_fit.reset(profile.first_step)
        self.drift_watch.reset()
        alpha, beta, gamma = throughput_prior(profile)
        self.throughput.reset(alpha, beta, per_prompt_cost(profile, alpha, gamma))
        if not same_process:
            self.calibration.reset()
        self.discipline.install(profile)
        state = self.profiling
        state.state = "profiled"
        state.reason = None
        state.reprofile_wanted = False
        if profile.kind == "reprofile":
            state.reprofiles += 1
            state.last_reprofile_at = profile.measured_monotonic

    def accept_drift(self) -> None:
        """Probes for a drift found the engine, alone, as its profile says: what drifted is
        how it serves under load (a chat template rendered and tokenized on a busy host,
        decodes in the prefill's steps), which the fits and the calibration have been
        following all along. Drift is measured from what the fits say now, so only a
        further change asks for probes; nothing learned is reset."""
        self._baseline = replace(
            self._baseline,
            prefill=tuple(self.prefill_fit.theta),  # type: ignore[arg-type]
            tpot=tuple(self.tpot_fit.theta),  # type: ignore[arg-type]
        )
        self.drift_watch.reset()
        self.profiling.reprofile_wanted = False

    def probe_size_hint(self) -> int | None:
        """The next profile's probe at clients' prompt length (`DriftWatch`)."""
        return self.drift_watch.probe_size_hint()

    @property
    def prefill_drift(self) -> DriftScore:
        return self.drift_watch.prefill

    @property
    def tpot_drift(self) -> DriftScore:
        return self.drift_watch.tpot

    @property
    def drift(self) -> float:
        """How much slower than its profile the engine runs now (log ratio; > 0 slower)."""
        return self.drift_watch.score

    @property
    def drifted(self) -> bool:
        return self.drift_watch.drifted

    @property
    def penalty(self) -> float:
        """Cost multiplier for new work: 1, or more while the engine runs slow."""
        return 1.0 + max(0.0, self.drift)

    # --- predictions ----------------------------------------------------------------------

    def service(self, prompt_tokens: float, decoding: float) -> float:
        """Seconds of prefill for this prompt alone (the regression on solo prefills)."""
        x = prefill_features(prompt_tokens, decoding)
        predicted = self.prefill_fit.predict(x)
        # The fit may not wander below a fraction of its baseline (a prompt longer than
        # any it has seen, a negative quadratic term learned from noise).
        floor = 0.3 * dot(self._baseline.prefill, x)
        return max(MIN_PREFILL_S, floor, predicted)

    def step_costs(self, decoding: float) -> StepCosts:
        """One engine step's costs, from the fits: the decode step (TPOT without prefill)
        is its base; the prefill slope its cost per token; what a prefill alone costs
        beyond both, its cost per prompt. Asked several times a request: kept until the
        fits or the decode batch change."""
        key = (
            int(decoding),
            self.prefill_fit.version,
            self.tpot_fit.version,
            self._budget(decoding),
        )
        cached = self._costs
        if cached is not None and cached[0] == key:
            return cached[1]
        costs = self._step_costs(decoding)
        self._costs = (key, costs)
        return costs

    def _step_costs(self, decoding: float) -> StepCosts:
        t, u, *_ = self.tpot_fit.theta
        base = max(MIN_TPOT_S, t + u * decoding / 100.0)
        a, b, *_ = self.prefill_fit.theta
        per_token = max(b, 0.3 * self._baseline.prefill[1], 0.0) / 1000.0
        per_prompt = max(0.0, a - max(MIN_TPOT_S, t))
        return StepCosts(self._budget(decoding), base, per_token, per_prompt)

    def _beside_head(self, decoding: float) -> int:
        """Prompt tokens after the first one waiting that the step finishing it may
        prefill as well: a step's budget; none where the engine serves one at a time."""
        return 0 if self.one_at_a_time else self._budget(decoding)

    def _budget(self, decoding: float) -> int:
        """Prefill tokens a step has: its budget (`EngineDiscipline.step_budget`) less one
        per decoding sequence."""
        return max(256, self.discipline.step_budget(self.step_budget) - int(decoding))

    def ttft(
        self,
        prompt_tokens: int,
        decoding: float,
        now: float,
        sequences: int = 0,
        kv_usage: float | None = None,
    ) -> float:
        """Seconds until a prompt placed now would have its first token here;
        `sequences`: the requests the engine holds a sequence slot for already;
        `kv_usage`: the share of its KV cache in use, as its metrics last said.

        The check and then placement ask the same question within microseconds: the
        last answer is kept for a millisecond while nothing it depends on changes."""
        key = (
            prompt_tokens,
            int(decoding),
            sequences,
            kv_usage,
            self.lane.version,
            self.prefill_fit.version,
            self.tpot_fit.version,
        )
        last = self._last_ttft
        if last is not None and last[0] == key and 0.0 <= now - last[1] < _TTFT_KEPT_S:
            return last[2]
        projected = self._ttft(prompt_tokens, decoding, now, sequences, kv_usage)
        self._last_ttft = (key, now, projected)
        return projected

    def _ttft(
        self,
        prompt_tokens: int,
        decoding: float,
        now: float,
        sequences: int,
        kv_usage: float | None,
    ) -> float:
        costs = self.step_costs(decoding)
        # The lane follows a chunked-prefill scheduler's steps (with no prompts expected
        # to join the last one: how many would depends on a step budget that is only
        # configured, never seen); the rate the engine has been seen to clear prompts at
        # bounds it from below whatever the scheduler.
        projected, _ = self.lane.project(prompt_tokens, now, costs, 0.0)
        projected = max(
            projected,
            self.throughput.projection(prompt_tokens, now, decoding, self._beside_head(decoding)),
        )
        if self.one_at_a_time:
            waited = one_at_a_time.wait(self.decoding, self._pending, self.decode_step(1.0), now)
            projected = max(projected, waited + self.service(prompt_tokens, 0.0))
        # Never less than the prompt's own prefill alone.
        alone = self.service(prompt_tokens, decoding)
        projected = max(projected, alone)
        if sequences >= self.max_sequences:
            # Every sequence slot is taken (vLLM's --max-num-seqs): the prefill cannot
            # start before enough of the requests decoding there have finished.
            wait = self.slot_wait(sequences - self.max_sequences + 1, decoding, now)
            projected = max(projected, wait + alone)
        if kv_usage is not None:
            wait = self.kv_wait(prompt_tokens, kv_usage, decoding, now)
            if wait:
                projected = max(projected, wait + alone)
        return projected

    @property
    def one_at_a_time(self) -> bool:
        """Whether the engine runs one request at a time (`EngineDiscipline`)."""
        return self.discipline.one_at_a_time

    @property
    def idle(self) -> bool:
        """Nothing of Narwhal's in flight here (no prefill waiting, no decode)."""
        return not self._pending and not len(self.decoding)

    def upper(self, projected: float, now: float) -> float:
        """The TTFT a projection made now stays under (at the calibration's quantile)."""
        bound = self.calibration.upper(projected, self.lateness(now), idle=self.idle)
        if self.one_at_a_time:
            step = self.decode_step(1.0)
            spread = one_at_a_time.spread(self.decoding, self._pending, step, now)
            bound = max(bound, projected + spread)
        return bound

    def expected(self, projected: float) -> float:
        return self.calibration.expected(projected, idle=self.idle)

    def lateness(self, now: float) -> float:
        """How much later than their own bounds the prefills waiting here already are
        (1 when none is): a first token that has not come by its bound is a measurement
        too, and this one is in hand while the others wait. O(prefills waiting)."""
        s = self.calibration.additive_s
        worst = 1.0
        for pending in self._pending:
            if pending.projected is None:
                continue
            late = (now - pending.placed_at + s) / (pending.upper + s)
            if late > worst:
                worst = late
        return worst

    @property
    def kv_capacity(self) -> float | None:
        """The KV cache's size in tokens, as learned (None until it has been)."""
        return self.kv_cache.capacity

    def kv_wait(self, prompt_tokens: int, kv_usage: float, decoding: float, now: float) -> float:
        """Seconds until the engine's KV cache has room for this prompt and those ahead
        of it (`narwhal.models.kv_cache`)."""
        held = self.decoding.kv_tokens(now) + self.lane.tokens()
        waiting = self.lane.waiting_tokens()
        tokens = self.kv_cache.wait_tokens(
            prompt_tokens, kv_usage, held, waiting, self.decoding, now
        )
        return tokens * self.tpot(decoding, now) if tokens else 0.0

    def slot_wait(self, slots: int, decoding: float, now: float) -> float:
        """Seconds until `slots` of the requests decoding here have finished, by their
        corrected remaining work (decode correction) at the TPOT they decode at."""
        remaining = self.decoding.remaining(now)
        if not remaining:
            return 0.0
        if slots > len(remaining):
            return max(remaining) * self.tpot(decoding, now)
        kth = heapq.nsmallest(slots, remaining)[-1]
        return kth * self.tpot(decoding, now)

    def solo(self, prompt_tokens: int) -> float:
        """The prompt's prefill with nothing ahead and nothing decoding."""
        return self.service(prompt_tokens, 0.0)

    def backlog(self, now: float, decoding: float = 0.0) -> float:
        """Seconds of prefill work ahead of a request placed now (by the lane, or by the
        rate the engine clears prompts at, whichever says more)."""
        if not len(self.lane):
            return 0.0
        _, ahead = self.lane.project(0, now, self.step_costs(decoding), 0.0)
        throughput = self.throughput
        cleared = throughput.ahead(now, self._beside_head(decoding)) * throughput.seconds_per_token(
            decoding
        )
        return max(ahead, cleared)

    def utilisation(self, now: float) -> float:
        """The share of the engine's time the prefill placed there takes (rho)."""
        costs = self.step_costs(0.0)
        return self._rate.value(now) * costs.per_token + self._starts.value(now) * costs.per_prompt

    def stretch(self, decoding: float, now: float) -> float:
        """How much the prefill placed on the engine lengthens its decode steps: by
        1 / (1 - rho), but never past a step that is all prefill (its whole budget)."""
        costs = self.step_costs(decoding)
        rho = min(0.99, self.utilisation(now))
        full = 1.0 + (costs.budget * costs.per_token + costs.per_prompt) / costs.base
        stretch = min(1.0 / (1.0 - rho), full)
        if stretch > _MAX_LEARNED_STRETCH:
            self._stretched_at = now
        return stretch

    def decode_step(self, decoding: float) -> float:
        """Seconds per decode step with nothing but decoding on the engine."""
        x = tpot_features(decoding)
        floor = 0.3 * dot(self._baseline.tpot, x)
        return max(MIN_TPOT_S, floor, self.tpot_fit.predict(x))

    def tpot(self, decoding: float, now: float) -> float:
        """Seconds per output token for a request decoding here now."""
        return self.decode_step(decoding) * self.stretch(decoding, now)

    def first_step(self, prompt_tokens: float) -> float:
        x = first_step_features(prompt_tokens)
        return max(MIN_TPOT_S, self.first_step_fit.predict(x))

    # --- what happened --------------------------------------------------------------------

    def prefill_placed(
        self,
        key: object,
        prompt_tokens: int,
        decoding: float,
        now: float,
        projected: float | None = None,
        output: float = 0.0,
        *,
        probe: bool = False,
    ) -> None:
        """`projected`: the prompt's TTFT here as projected at placement (seconds);
        `output`: its expected output tokens; `probe`: the router's own request, placed
        to learn from an engine refused while idle (`IdleRefusals`), not a client's."""
        if not probe:
            self.idle_refusals.placed()
        features = prefill_features(prompt_tokens, decoding)
        estimate = self.service(prompt_tokens, decoding)
        solo = len(self.lane) == 0
        upper = math.inf if projected is None else self.upper(projected, now)
        idle = self.idle
        self.lane.add(key, prompt_tokens, now)
        self.throughput.placed(key, prompt_tokens, now, decoding)
        self._pending.add(
            key,
            PendingPrefill(features, estimate, solo, now, projected, upper, decoding, output, idle),
        )
        self._rate.add(prompt_tokens, now)
        self._starts.add(1.0, now)

    def prefill_finished(
        self, key: object, now: float, decoding: float = 0.0, others: float | None = None
    ) -> float | None:
        """The prefill of `key` finished at `now`: a step ended; learn from it.
        `others`: the sequences decoding there beside it (`decoding` when not given)."""
        finished = self._pending.finish(key)
        pending, alone = (None, False) if finished is None else finished
        if pending is not None:
            self.discipline.first_token(decoding if others is None else others, pending.decoding_at)
        measured = self.lane.finish(key, now, self._budget(decoding))
        self.throughput.finished(key, now, decoding)
        if pending is None or measured is None:
            return None
        self.observed_at = now
        # (`alone`: nothing placed here after it before its first token, see
        # `narwhal.models.pending`. The idle class, which bounds what is admitted onto an
        # idle engine, keeps the others: what comes after is part of what such a first
        # token waits for.)
        if pending.projected is not None:
            self.calibration.add(
                pending.projected,
                now - pending.placed_at,
                idle=pending.idle,
                alone=pending.idle and alone,
                upper=pending.upper,
                now=now,
            )
        if pending.solo and alone:
            # Alone on the engine, the measurement is this prompt's own prefill: what the
            # fit learns from (under load, a service time by the departure rule is a
            # share of a step, not a function of the prompt), and what says whether the
            # engine still matches its profile.
            self.prefill_fit.update(pending.features, _clipped(measured, pending.estimate))
            self.drift_watch.solo_prefill(
                round(1000.0 * pending.features[1]),
                measured,
                dot(self._baseline.prefill, pending.features),
            )
        return measured

    def prefill_dropped(self, key: object, now: float, decoding: float = 0.0) -> None:
        """A prefill that will not finish here (failed, cancelled)."""
        self._pending.drop(key)
        self.lane.remove(key)
        self.throughput.dropped(key, now, decoding)

    def observe_tpot(
        self,
        tpot: float,
        decoding: float,
        now: float,
        *,
        stretch_before: float = 1.0,
        since: float | None = None,
    ) -> None:
        """A request's TPOT; `decoding` the batch it decoded in, `stretch_before` the
        engine's `stretch` when it started decoding at `since` (now is its end)."""
        if not (math.isfinite(tpot) and tpot > 0):
            return
        observed = self.tpot_observed
        self.tpot_observed = tpot if observed is None else observed + 0.1 * (tpot - observed)
        self.observed_at = now
        at_end = self.stretch(decoding, now)
        stretch = (stretch_before + at_end) / 2
        stretched = since is not None and self._stretched_at >= since
        if stretched or max(stretch_before, at_end) > _MAX_LEARNED_STRETCH:
            # Mostly prefill around it: its TPOT says more about that prefill than about
            # the engine's decode step, which is what the fit and the drift score are of.
            return
        x = tpot_features(decoding)
        step = tpot / stretch  # the observation without the stretch
        self.tpot_fit.update(x, _clipped(step, self.decode_step(decoding)))
        self.drift_watch.tpot.add(tpot, stretch * max(MIN_TPOT_S, dot(self._baseline.tpot, x)))

    def observe_first_step(self, prompt_tokens: int, seconds: float) -> None:
        if not (math.isfinite(seconds) and seconds > 0):
            return
        x = first_step_features(prompt_tokens)
        self.first_step_fit.update(x, _clipped(seconds, self.first_step(prompt_tokens)))

    # --- report ---------------------------------------------------------------------------

    def view(self, now: float) -> dict[str, Any]:
        a, b, c, e = self.prefill_fit.theta
        t, u = self.tpot_fit.theta
        return {
            "prefill_s": {
                "base": a,
                "per_1k_tokens": b,
                "per_1k_tokens_squared": c,
                "per_100_decoding": e,
                "samples": self.prefill_fit.samples,
            },
            "decode_step_s": {
                "base": t,
                "per_100_decoding": u,
                "samples": self.tpot_fit.samples,
            },
        }


def _clipped(measured: float, expected: float) -> float:
    if expected <= 0:
        return measured
    return min(expected * _CLIP, max(expected / _CLIP, measured))
