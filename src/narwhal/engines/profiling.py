"""Profiling runs: probe requests to engines, timed from validated token IDs (I/O side).

In predictive mode an engine takes work only once profiled. For each engine the
`Profiler` sends `PROBE_PROMPTS` requests of `PROBE_OUTPUT` tokens one after another
(so each measures the engine alone), through the same client, stream and `OutputTracker`
as client requests: an event that omits its ID list, holds a Boolean or a malformed list
fails the probe (the seed), and the engine stays unprofiled with that reason shown in
/admin/engines. The fit is `narwhal.models.profile`'s (sans-IO).

- Probes carry `X-Request-Id: narwhal-profile-<engine>-<n>`, are never counted as client
  traffic (they do not pass the front), and open with words in a random order so that no
  two share a prefix an engine could have cached.
- Rate limits: one run at a time per engine; a failed run is retried after 1, 2, 4 ...
  seconds (at most `RETRY_MAX_S`); a drifting engine, or one no served request has
  taught anything for `IDLE_REPROFILE_S` (placement may have stopped sending it work
  when it ran slow: it must be found again when it recovers), is re-profiled at most
  once per `REPROFILE_EVERY_S`.
- An engine that goes down loses its profile (it may come back another model, another
  GPU) and is profiled again when it comes back.
- Vendors' prompts: the completion route for vLLM and SGLang (the route both give IDs
  on), the chat route for generic servers; `ignore_eos` (vLLM, SGLang) fixes the length.

Nothing here raises into the loop: every failure is the engine's profiling state.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec

from narwhal.engines.client import EngineClient
from narwhal.engines.stream import EngineStream
from narwhal.errors import NarwhalError
from narwhal.models.engine import EngineModel
from narwhal.models.profile import (
    MIN_TPOT_S,
    PROBE_OUTPUT,
    PROBE_PROMPTS,
    ProbeSample,
    ProfileError,
    Source,
    fit_profile,
    rescale,
)
from narwhal.protocol.assembly import Assembler
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.forward import StreamCollector
from narwhal.protocol.requests import CompletionRequest, Route, parse_request
from narwhal.protocol.tracker import OutputTracker
from narwhal.protocol.upstream import CHOICES, upstream_body
from narwhal.scheduler.predictive import decoding_on
from narwhal.scheduler.registry import EngineEntry, EngineRegistry

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S: Final = 10.0
RETRY_MAX_S: Final = 30.0
REPROFILE_EVERY_S: Final = 30.0
IDLE_REPROFILE_S: Final = 30.0  # an engine no request has taught anything for this long
_TICK_S: Final = 0.25
# One token each in the simulator's tokenizer and in common BPE vocabularies.
_WORDS: Final = (
    " time", " year", " way", " day", " man", " thing", " world", " life", " hand",
    " part", " child", " eye", " woman", " place", " work", " week", " case", " point",
    " group", " fact",
)  # fmt: skip


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
    ) -> None:
        """`changed` is called when an engine's profile appears or goes (placement must
        look again)."""
        self._registry = registry
        self._clients = clients
        self._model = model
        self._changed = changed
        self._probe_timeout = probe_timeout_s
        self._rng = rng or random.Random()
        self._runs: dict[str, asyncio.Task[None]] = {}
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._was_up: dict[str, bool] = {}
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
        for state in (self._retry_at, self._failures, self._was_up):
            state.pop(name, None)

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
                self._was_up[name] = False
                continue
            self._was_up[name] = True
            if not model.profiled:
                if now >= self._retry_at.get(name, 0.0):
                    self._run(entry, model, reprofile=False)
            elif model.drifted or model.idle_for(now) >= IDLE_REPROFILE_S:
                # Drifting, or unheard of for long (given no work after it was found slow,
                # it would never be found recovered): measure it again.
                model.profiling.reprofile_wanted = True
                last = model.profiling.last_reprofile_at or model.profile.measured_monotonic  # type: ignore[union-attr]
                if now - last >= REPROFILE_EVERY_S:
                    self._run(entry, model, reprofile=True)

    def _forget(self, model: EngineModel, reason: str) -> None:
        model.profile = None
        model.profiling.state = "unprofiled"
        model.profiling.reason = reason
        self._registry.invalidate()
        self._changed()

    def _run(self, entry: EngineEntry, model: EngineModel, *, reprofile: bool) -> None:
        if not reprofile:
            model.profiling.state = "profiling"
        self._runs[entry.name] = asyncio.create_task(
            self._profile(entry, model, reprofile), name=f"narwhal-profile-{entry.name}"
        )

    async def _profile(self, entry: EngineEntry, model: EngineModel, reprofile: bool) -> None:
        name = entry.name
        state = model.profiling
        state.attempts += 1
        try:
            samples, source = await self._probe_all(entry, model)
            now, wall = time.monotonic(), time.time()
            if reprofile and model.profile is not None:
                profile = rescale(model.profile, samples, wall=wall, now=now)
            else:
                profile = fit_profile(samples, source=source, wall=wall, now=now)
        except (NarwhalError, ProfileError, TimeoutError) as error:
            self._failed(entry, model, reprofile, _reason(error))
            return
        except Exception as error:  # a bug: the engine stays out of placement, loudly
            log.exception("profiler: profiling engine %s failed", name)
            self._failed(entry, model, reprofile, f"internal error: {error!r}")
            return
        finally:
            # Only its own: a run cancelled by `forget` may end after the next one began.
            if self._runs.get(name) is asyncio.current_task():
                del self._runs[name]
        was_profiled = model.profiled
        model.install(profile)
        self._failures.pop(name, None)
        a, b, *_ = profile.prefill
        log.info(
            "profiler: engine %s %s: prefill %.1f ms + %.1f ms per 1k tokens, TPOT %.2f ms "
            "(%d probes, %s)",
            name,
            "re-profiled after drift" if reprofile else "profiled",
            1e3 * a,
            1e3 * b,
            1e3 * profile.tpot[0],
            profile.samples,
            profile.source,
        )
        if not was_profiled:
            self._registry.invalidate()
            self._changed()

    def _failed(self, entry: EngineEntry, model: EngineModel, reprofile: bool, reason: str) -> None:
        name = entry.name
        failures = self._failures.get(name, 0) + 1
        self._failures[name] = failures
        delay = min(RETRY_MAX_S, 2.0 ** (failures - 1))
        self._retry_at[name] = time.monotonic() + delay
        model.profiling.reason = reason
        if reprofile and model.profiled:
            # Keep serving on the old profile; try again no sooner than the usual pace.
            model.profiling.last_reprofile_at = time.monotonic()
            log.warning("profiler: re-profiling engine %s failed: %s", name, reason)
            return
        model.profiling.state = "failed"
        log.warning(
            "profiler: engine %s stays out of placement, unprofiled: %s (next try in %.0f s)",
            name,
            reason,
            delay,
        )

    async def _probe_all(
        self, entry: EngineEntry, model: EngineModel
    ) -> tuple[list[ProbeSample], Source]:
        client = self._clients[entry.name]
        route: Route = "completion" if client.capabilities.token_ids_on else "chat"
        source: Source = (
            "token_ids" if route in client.capabilities.token_ids_on else ("usage_and_events")
        )
        samples = []
        for prompt_tokens in PROBE_PROMPTS:
            samples.append(await self._probe(entry, model, client, route, prompt_tokens))
        return samples, source

    async def _probe(
        self,
        entry: EngineEntry,
        model: EngineModel,
        client: EngineClient,
        route: Route,
        prompt_tokens: int,
    ) -> ProbeSample:
        request = self._request(route, prompt_tokens, client)
        tracker = OutputTracker(
            route,
            token_ids=route in client.capabilities.token_ids_on,
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
            sent = time.monotonic()
            response = await client.open_stream(
                route, upstream_body(request, client.dialect), request_id=request_id
            )
            stream = EngineStream(client.name, response, sink)
            try:
                while not stream.done and await stream.read() is not None:
                    pass
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
        return ProbeSample(
            prompt_tokens=counted if type(counted) is int and counted > 0 else prompt_tokens,
            ttft_s=tracker.first_output_at - sent,
            tpot_s=tpot,
            backlog_s=backlog,
            decoding=decoding,
            stretch=stretch,
        )

    def _request(self, route: Route, prompt_tokens: int, client: EngineClient) -> CompletionRequest:
        words = self._rng.choices(_WORDS, k=max(1, prompt_tokens - 8))
        text = "Narwhal profile" + "".join(words)
        body: dict[str, Any] = {"model": self._model, "max_tokens": PROBE_OUTPUT, "temperature": 0}
        if route == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        if client.capabilities.vllm_fields:  # vLLM and SGLang: a fixed output length
            body["ignore_eos"] = True
        return parse_request(msgspec.json.encode(body), route, model=self._model)


def _reason(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "a probe got no complete answer in time"
    if isinstance(error, NarwhalError):
        return error.message
    return str(error)
