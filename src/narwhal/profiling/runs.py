"""Profiling runs: probe requests to engines, timed from validated token IDs (I/O side).

In predictive mode an engine takes work only once profiled. For each engine the
`Profiler` sends probe requests of `fleet.probe_prompt_tokens` tokens (default
`PROBE_PROMPTS`) and `PROBE_OUTPUT` output tokens one after another (so each measures the
engine alone; `SOLO_PASSES` times over, the faster of each size standing), then
`CONCURRENT_PROBES` equal ones at once (how the engine serves prompts that arrive
together: `fit_concurrency`). Every probe goes through the same client, stream and
`OutputTracker` as client requests: an event that omits its ID list, holds a Boolean or a
malformed list fails the probe (the seed), and the engine stays unprofiled with that
reason shown in /admin/engines. The fit is `narwhal.models.profile`'s (sans-IO).

- Probe lengths are the engine's tokens (`narwhal.profiling.probe_text`: its /tokenize,
  else the configured tokenizer, else an estimate checked against its usage), fitted
  under its `max_model_len` (from /v1/models, the monitor's) less the probe's output.
- Probes carry `X-Request-Id: narwhal-profile-<engine>-<n>`, are never counted as client
  traffic (they do not pass the front), and open with words in a random order so that no
  two share a prefix an engine could have cached.
- When: an engine that is up and unprofiled (at start, when it joins, when it comes back
  after going down: it may be another model, another GPU); a profiled engine when it is
  a new process (its max_model_len changed, or its counters went back: `EngineHealth.
  restarts`), and when its drift says it no longer matches its profile (at most once per
  `REPROFILE_EVERY_S`). Never on a timer: an idle engine gets no probes, unless its
  bound refuses clients while it sits idle (`narwhal.models.idle_refusals`): then one
  probe of the refused length, learned from as a client request is, and again after 1,
  2, 4 ... s while that goes on. Each run is logged once, with that reason.
- A failed run is retried after 1, 2, 4 ... seconds (at most `RETRY_MAX_S`); the engine
  stays out of placement with the reason in /admin/engines, logged once per reason (not
  once per retry).
- Vendors' prompts: the completion route for vLLM and SGLang (the route both give IDs
  on), the chat route for generic servers; `ignore_eos` (vLLM, SGLang) fixes the length.

Nothing here raises into the loop: every failure is the engine's profiling state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import msgspec

from narwhal.engines.client import EngineClient
from narwhal.engines.stream import EngineStream
from narwhal.errors import NarwhalError
from narwhal.models.drift import DRIFT_THRESHOLD
from narwhal.models.engine import EngineModel
from narwhal.models.idle_refusals import IDLE_REFUSALS_AFTER_S
from narwhal.models.profile import (
    CONCURRENT_OUTPUT,
    CONCURRENT_PROBES,
    CONCURRENT_PROMPT,
    MIN_TPOT_S,
    PROBE_OUTPUT,
    PROBE_PROMPTS,
    ConcurrentSample,
    ProbeSample,
    ProfileError,
    Source,
    fit_probe_sizes,
    fit_profile,
    rescale,
)
from narwhal.profiling.probe_text import ProbeCounter, ProbeText
from narwhal.profiling.readings import (
    check_within,
    concurrency_of,
    probe_route,
    probes_unchanged,
    step_tokens,
    with_hint,
)
from narwhal.protocol.assembly import Assembler
from narwhal.protocol.dialects import DialectCapabilities
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.forward import StreamCollector
from narwhal.protocol.requests import CompletionRequest, Route, parse_request
from narwhal.protocol.tracker import OutputTracker
from narwhal.protocol.upstream import CHOICES, upstream_body
from narwhal.scheduler.predictive import decoding_on, prefill_part
from narwhal.scheduler.registry import EngineEntry, EngineRegistry

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S: Final = 10.0
RETRY_MAX_S: Final = 30.0
REPROFILE_EVERY_S: Final = 30.0
_TICK_S: Final = 0.25
SOLO_PASSES: Final = 2


@dataclasses.dataclass(frozen=True, slots=True)
class _Why:
    """Why a run starts: its words for the log, and whether the old profile's shape still
    holds (a drift: rescale it) or the engine is new (fit afresh)."""

    reason: str
    rescale: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class _Probed:
    """One probe's measurement and what it cost the engine."""

    sample: ProbeSample
    tokens: int  # prompt and output tokens the engine served for it
    last_token_s: float  # its last output, from the same start as its TTFT


class Profiler:
    def __init__(
        self,
        registry: EngineRegistry,
        clients: Mapping[str, EngineClient],
        *,
        model: str,
        changed: Callable[[], None],
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        rng: random.Random | None = None,
        counter: ProbeCounter | None = None,
        probe_sizes: Callable[[], Sequence[int] | None] = lambda: None,
    ) -> None:
        """`changed` is called when an engine's profile appears or goes (placement must
        look again); `counter` counts probe texts in each engine's tokens (None: every
        text is estimated and checked against the engine's usage); `probe_sizes` gives
        `fleet.probe_prompt_tokens` (read at each run, so a reload applies to the next)."""
        self._registry = registry
        self._clients = clients
        self._model = model
        self._changed = changed
        self._probe_timeout = probe_timeout_s
        self._rng = rng or random.Random()
        self._counter = counter or ProbeCounter(None, None, model=model)
        self._probe_sizes = probe_sizes
        self._runs: dict[str, asyncio.Task[None]] = {}
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._logged_failure: dict[str, str] = {}  # the reason last logged, per engine
        self._was_up: dict[str, bool] = {}
        # Why an engine that lost its profile is profiled again (it came back, or the
        # re-profile of its new process failed); absent: a first profile.
        self._again: dict[str, str] = {}
        self._restarts: dict[str, int] = {}  # the engine's restarts as last profiled
        self._loop_task: asyncio.Task[None] | None = None
        self._sequence = itertools.count(1)

    async def start(self, wait_s: float) -> None:
        """Profile every engine that is up, waiting up to `wait_s` for them, then keep
        watching in the background."""
        self._tick()
        runs = list(self._runs.values())
        if runs:
            await asyncio.wait(runs, timeout=wait_s)
        self._loop_task = asyncio.create_task(self._watch(), name="narwhal-profiler")

    async def close(self) -> None:
        tasks = [*self._runs.values()]
        if self._loop_task is not None:
            tasks.append(self._loop_task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._runs.clear()

    def forget(self, name: str) -> None:
        """The engine left the fleet (a reload): stop any run there, forget its retries."""
        run = self._runs.pop(name, None)
        if run is not None:
            run.cancel()
        for state in (
            self._retry_at,
            self._failures,
            self._was_up,
            self._logged_failure,
            self._restarts,
        ):
            state.pop(name, None)
        self._again.pop(name, None)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(_TICK_S)
            try:
                self._tick()
            except Exception:
                log.exception("profiler: watching the engines failed")

    def _tick(self) -> None:
        now = time.monotonic()
        for name, entry in self._registry.entries.items():
            model = entry.model
            if model is None or name in self._runs or entry.retiring:
                continue
            health = entry.health
            up = health is not None and health.healthy
            if not up:
                if self._was_up.get(name) and model.profiled:
                    self._forget(model, "the engine went down; profiled again when up")
                    self._again[name] = "the engine came back up"
                self._was_up[name] = False
                continue
            self._was_up[name] = True
            if health is not None and health.recheck:
                continue  # a new process: the monitor reads its /v1/models first
            why = self._why(name, entry, model, now)
            if why is not None:
                self._run(entry, model, why)
            elif model.profiled:
                tokens = model.idle_refusals.due(now, idle=model.idle)
                if tokens is not None:
                    self._runs[name] = asyncio.create_task(
                        self._relearn(entry, model, tokens), name=f"narwhal-relearn-{name}"
                    )

    def _why(self, name: str, entry: EngineEntry, model: EngineModel, now: float) -> _Why | None:
        """Why the engine needs probes now, or None (most ticks, and every idle one)."""
        health = entry.health
        profile = model.profile
        if now < self._retry_at.get(name, 0.0):
            return None  # a run failed: the next waits for its backoff
        if profile is None:
            return _Why(self._again.get(name, "first profile"))
        restarts = health.restarts if health is not None else 0
        context = health.max_model_len if health is not None else None
        changed = context is not None and context != profile.max_model_len
        limit = f"max_model_len {profile.max_model_len} -> {context}" if changed else None
        if restarts != self._restarts.get(name, restarts):
            return _Why(
                "the engine restarted (its metrics counters went back"
                + (f"; {limit})" if limit else ")")
            )
        if limit:
            return _Why(f"its {limit}")
        if model.drifted:
            model.profiling.reprofile_wanted = True
            last = model.profiling.last_reprofile_at or profile.measured_monotonic
            if now - last < REPROFILE_EVERY_S:
                return None
            prefill, tpot = model.prefill_drift.score, model.tpot_drift.score
            # Either way past the threshold: slower (> 0), or faster (< 0: recovered).
            worst = max(prefill, tpot, key=abs)
            return _Why(
                f"drift {worst:+.2f} past {DRIFT_THRESHOLD:.2f}: prefill {prefill:+.2f}, "
                f"TPOT {tpot:+.2f}",
                rescale=True,
            )
        return None

    def _forget(self, model: EngineModel, reason: str) -> None:
        model.profile = None
        model.profiling.state = "unprofiled"
        model.profiling.reason = reason
        self._registry.invalidate()
        self._changed()

    def _run(self, entry: EngineEntry, model: EngineModel, why: _Why) -> None:
        if model.profile is None:
            model.profiling.state = "profiling"
        self._runs[entry.name] = asyncio.create_task(
            self._profile(entry, model, why), name=f"narwhal-profile-{entry.name}"
        )

    async def _profile(self, entry: EngineEntry, model: EngineModel, why: _Why) -> None:
        name = entry.name
        state = model.profiling
        state.attempts += 1
        health = entry.health
        restarts = health.restarts if health is not None else 0
        context = health.max_model_len if health is not None else None
        try:
            samples, concurrent, source, text = await self._probe_all(entry, model, context)
            now, wall = time.monotonic(), time.time()
            old = model.profile
            if why.rescale and old is not None:
                profile = rescale(old, samples, wall=wall, now=now)
            else:
                profile = fit_profile(samples, source=source, wall=wall, now=now)
                if old is not None:  # a new process of a profiled engine: a re-profile
                    profile = dataclasses.replace(profile, kind="reprofile")
            profile = dataclasses.replace(profile, max_model_len=context)
            profile = profile.with_concurrency(concurrency_of(profile, concurrent))
        except (NarwhalError, ProfileError, TimeoutError) as error:
            self._failed(entry, model, why, _reason(error))
            return
        except Exception as error:  # a bug: the engine stays out of placement, loudly
            log.exception("profiler: profiling engine %s failed", name)
            self._failed(entry, model, why, f"internal error: {error!r}")
            return
        finally:
            # Only its own: a run cancelled by `forget` may end after the next one began.
            if self._runs.get(name) is asyncio.current_task():
                del self._runs[name]
        if why.rescale and old is not None and probes_unchanged(profile):
            # The engine alone is as profiled: the drift is of the load (`accept_drift`).
            model.accept_drift()
            state.probe_runs += 1
            state.last_reason = why.reason
            state.last_reprofile_at = now
            k_prefill, k_tpot = profile.rescaled
            log.info(
                "profiler: engine %s probed (%s): alone it is as profiled (prefill x%.2f, "
                "TPOT x%.2f, within %.2f): what drifted is how it serves under load, which "
                "the learned fits follow; drift is now measured from them, and the "
                "profile, the fits and the bound's calibration are kept",
                name,
                why.reason,
                k_prefill,
                k_tpot,
                DRIFT_THRESHOLD,
            )
            return
        was_profiled = model.profiled
        # A drift's re-profile (`rescale`) is of the same process: a restart is not.
        model.install(profile, same_process=why.rescale and old is not None)
        state.probe_runs += 1
        state.last_reason = why.reason
        self._failures.pop(name, None)
        self._retry_at.pop(name, None)
        self._logged_failure.pop(name, None)
        self._again.pop(name, None)
        self._restarts[name] = restarts
        a, b, *_ = profile.prefill
        log.info(
            "profiler: engine %s %s (%s): prefill %.1f ms + %.1f ms per 1k tokens, TPOT "
            "%.2f ms, prompts arriving together: %s (spread %s, a step holds %s tokens); "
            "%d probes of %s tokens, "
            "the faster of %d each (%s), %s",
            name,
            "re-profiled" if profile.kind == "reprofile" else "profiled",
            why.reason,
            1e3 * a,
            1e3 * b,
            1e3 * profile.tpot[0],
            profile.prefill_discipline,
            _fmt(profile.concurrent_first_token_spread),
            step_tokens(profile),
            profile.samples,
            "/".join(map(str, profile.probe_prompt_tokens)),
            SOLO_PASSES,
            text,
            profile.source,
        )
        if not was_profiled:
            self._registry.invalidate()
            self._changed()

    def _failed(self, entry: EngineEntry, model: EngineModel, why: _Why, reason: str) -> None:
        name = entry.name
        failures = self._failures.get(name, 0) + 1
        self._failures[name] = failures
        delay = min(RETRY_MAX_S, 2.0 ** (failures - 1))
        self._retry_at[name] = time.monotonic() + delay
        model.profiling.reason = reason
        # One line per reason, not one per retry: the retries are in /admin/engines.
        first = self._logged_failure.get(name) != reason
        self._logged_failure[name] = reason
        if model.profiled and not why.rescale:
            # A new process (a restart, another max_model_len) the probes cannot measure:
            # the old process's profile says nothing of it. Out of placement until it can.
            self._forget(model, reason)
            self._again[name] = why.reason
        if model.profiled:
            # Drift: keep serving on the old profile; try again no sooner than the usual
            # pace.
            model.profiling.last_reprofile_at = time.monotonic()
            if first:
                log.warning(
                    "profiler: re-profiling engine %s failed, it serves on its profile: %s "
                    "(retried with backoff)",
                    name,
                    reason,
                )
            return
        model.profiling.state = "failed"
        if first:
            log.warning(
                "profiler: engine %s stays out of placement, unprofiled: %s (retried "
                "after 1, 2, 4 ... %.0f s; /admin/engines shows the attempts)",
                name,
                reason,
                RETRY_MAX_S,
            )

    async def _relearn(self, entry: EngineEntry, model: EngineModel, tokens: int) -> None:
        """One probe of `tokens` prompt tokens to an engine whose bound has been refusing
        requests while it sat idle (`narwhal.models.idle_refusals`), placed and learned
        from as a client request is: its first token trains the prefill fit and the idle
        class's error, which nothing admitted could."""
        name = entry.name
        refusals = model.idle_refusals
        refusals.probing(time.monotonic())
        key = f"narwhal-relearn-{name}-{next(self._sequence)}"
        placed = False
        try:
            client = self._clients[name]
            route, _ = probe_route(entry.capabilities)
            health = entry.health
            context = health.max_model_len if health is not None else None
            (size,) = fit_probe_sizes((tokens,), context)
            texts = ProbeText(
                self._counter.for_engine(
                    client, entry.capabilities, completion=route == "completion"
                ),
                self._rng,
            )
            text, counted = await texts.build(size)
            if not model.idle or not model.profiled:
                return  # a client request was placed meanwhile: it teaches the model
            now = time.monotonic()
            decoding = decoding_on(entry)
            projected = prefill_part(entry, model, counted, now)
            model.prefill_placed(key, counted, decoding, now, projected, PROBE_OUTPUT, probe=True)
            placed = True
            if refusals.episode == 1:
                log.info(
                    "profiler: engine %s refused requests while idle for %.0f s: probing it "
                    "(a %d-token prompt, projected %.3f s) to learn from, as no request "
                    "admitted there could; again after 1, 2, 4 ... s while that goes on",
                    name,
                    IDLE_REFUSALS_AFTER_S,
                    counted,
                    projected,
                )

            def first_token(at: float) -> None:
                model.prefill_finished(key, at, decoding_on(entry))

            probed = await self._probe(
                entry, model, client, route, text, PROBE_OUTPUT, first=first_token
            )
            model.profiling.probe_tokens += probed.tokens
        except (NarwhalError, ProfileError, TimeoutError) as error:
            log.debug("profiler: probing idle engine %s failed: %s", name, _reason(error))
        except Exception:
            log.exception("profiler: probing idle engine %s failed", name)
        finally:
            if placed:
                # (a no-op once its first token came)
                model.prefill_dropped(key, time.monotonic(), decoding_on(entry))
            if self._runs.get(name) is asyncio.current_task():
                del self._runs[name]

    async def _probe_all(
        self, entry: EngineEntry, model: EngineModel, context: int | None
    ) -> tuple[list[ProbeSample], list[ConcurrentSample], Source, str]:
        """The solo probes, then the concurrent ones; and how their texts were sized."""
        client = self._clients[entry.name]
        route, source = probe_route(entry.capabilities)
        sizes = fit_probe_sizes(
            with_hint(self._probe_sizes() or PROBE_PROMPTS, model.probe_size_hint(), context),
            context,
        )
        texts = ProbeText(
            self._counter.for_engine(client, entry.capabilities, completion=route == "completion"),
            self._rng,
        )
        # Every size is probed in SOLO_PASSES passes and the faster of its probes stands:
        # an engine's first requests after a start run cold (vLLM's first prompt of each
        # length took 2-5x its later ones on CPU), and a profile taken from them refuses
        # what the engine could serve until learning catches up.
        passes: list[list[ProbeSample]] = []
        for _ in range(SOLO_PASSES):
            measured: list[ProbeSample] = []
            for target in sizes:
                text, _ = await texts.build(target)
                probed = await self._probe(entry, model, client, route, text, PROBE_OUTPUT)
                check_within(probed.sample, context, PROBE_OUTPUT)
                if not texts.counted:
                    texts.learn(text, probed.sample.prompt_tokens)
                measured.append(probed.sample)
                model.profiling.probe_tokens += probed.tokens
            passes.append(measured)
        samples = [min(same, key=lambda s: s.ttft_s) for same in zip(*passes, strict=True)]
        (size,) = fit_probe_sizes((CONCURRENT_PROMPT,), context, CONCURRENT_OUTPUT)
        concurrent = [await self._together(entry, model, client, route, texts, size)]
        solo = fit_profile(samples, source=source, wall=0.0, now=0.0)
        if concurrency_of(solo, concurrent).discipline != "batched":
            # Noise on a busy host only adds gaps between first tokens that came together;
            # it cannot close the gaps of an engine that serves one prompt after another.
            # So a "serial" verdict is asked twice, and the smaller spread stands.
            concurrent.append(await self._together(entry, model, client, route, texts, size))
        # (A counter that stopped answering midway left the rest estimated.)
        how = "counted" if texts.counted else "estimated, checked against its usage"
        return samples, concurrent, source, f"texts {how}, {texts.round_trips} counts"

    async def _together(
        self,
        entry: EngineEntry,
        model: EngineModel,
        client: EngineClient,
        route: Route,
        texts: ProbeText,
        size: int,
    ) -> ConcurrentSample:
        """CONCURRENT_PROBES prompts of `size` tokens sent at once."""
        prompts = [(await texts.build(size))[0] for _ in range(CONCURRENT_PROBES)]
        sent = time.monotonic()
        together = await asyncio.gather(
            *(
                self._probe(entry, model, client, route, p, CONCURRENT_OUTPUT, sent=sent)
                for p in prompts
            )
        )
        model.profiling.probe_tokens += sum(p.tokens for p in together)
        counted = [p.sample.prompt_tokens for p in together]
        return ConcurrentSample(
            prompt_tokens=round(sum(counted) / len(counted)),
            first_token_s=tuple(p.sample.ttft_s for p in together),
            last_token_s=tuple(p.last_token_s for p in together),
        )

    async def _probe(
        self,
        entry: EngineEntry,
        model: EngineModel,
        client: EngineClient,
        route: Route,
        text: str,
        output: int,
        *,
        sent: float | None = None,
        first: Callable[[float], None] | None = None,
    ) -> _Probed:
        """One probe; its TTFT from `sent` (the moment probes sent together left) or from
        its own sending; `first` is told when its first output came, as it comes."""
        engine = entry.capabilities
        request = self._request(route, text, output, engine)
        tracker = OutputTracker(
            route,
            token_ids=route in engine.token_ids_on,
            prompt_ids=False,
            choices=CHOICES,
        )
        exposure = Exposure(token_ids=False, usage=True, continuous_usage=False)
        sink = StreamCollector(tracker, Assembler(route, exposure, choices=CHOICES))
        request_id = f"narwhal-profile-{entry.name}-{next(self._sequence)}"
        now = time.monotonic()
        decoding = decoding_on(entry)
        backlog, stretch = model.backlog(now, decoding), model.stretch(decoding, now)
        async with asyncio.timeout(self._probe_timeout):
            start = time.monotonic() if sent is None else sent
            response = await client.open_stream(
                route, upstream_body(request, engine), request_id=request_id
            )
            stream = EngineStream(client.name, response, sink)
            try:
                while not stream.done and await stream.read() is not None:
                    if first is not None and tracker.first_output_at is not None:
                        first(tracker.first_output_at)
                        first = None
            finally:
                stream.close()
        if tracker.first_output_at is None:
            raise ProfileError(f"probe {request_id} produced no output")
        usage = tracker.usage or {}
        counted = usage.get("prompt_tokens")
        tokens, _ = tracker.output_tokens()
        tpot = tracker.time_per_output_token()
        if tpot is None and tokens >= 2:
            # Every token came in one read: faster than can be timed from here.
            tpot = MIN_TPOT_S
        prompt_tokens = counted if type(counted) is int and counted > 0 else len(text.split())
        sample = ProbeSample(
            prompt_tokens=prompt_tokens,
            ttft_s=tracker.first_output_at - start,
            tpot_s=tpot,
            backlog_s=backlog,
            decoding=decoding,
            stretch=stretch,
        )
        return _Probed(sample, prompt_tokens + tokens, tracker.event_times[-1] - start)

    def _request(
        self, route: Route, text: str, output: int, engine: DialectCapabilities
    ) -> CompletionRequest:
        body: dict[str, Any] = {"model": self._model, "max_tokens": output, "temperature": 0}
        if route == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        if engine.vllm_fields:  # vLLM and SGLang: a fixed output length
            body["ignore_eos"] = True
        return parse_request(msgspec.json.encode(body), route, model=self._model)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _reason(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "a probe got no complete answer in time"
    if isinstance(error, NarwhalError):
        return error.message
    return str(error)
