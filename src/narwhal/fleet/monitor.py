"""Periodic health checks and metrics scrapes of every configured engine.

One task per engine runs probe rounds: GET /health and, when the engine has metrics
(every `vllm`/`sglang` engine; an `openai` one until it answers 404), GET /metrics,
concurrently, each bounded by `fleet.probe_timeout_s`. The outcomes go into the
engine's `EngineHealth` (the decisions live there, in `state.py`); the pause before the
next round comes from `backoff.py`. `start()` runs the first round for every engine and
waits for it, so the router can place work as soon as it returns.

Whenever an engine's placeability changes (or `monitoring_degraded()` does, which
decides the router's /ready reason), subscribers are called synchronously on the loop,
so requests waiting for an engine can be placed again. Staleness of a broken
metrics endpoint is re-evaluated at the end of each round, so it is noticed at most one
round (interval + probe timeout) after the deadline passes.

A configuration reload changes the fleet while it runs: `add` starts probing a new engine
(its first round at once; like every engine it is not placeable before a round has
passed), `remove` stops, `update` takes an engine's new key, `reconfigure` the new probe
settings.

Every answer is read within `fleet.max_probe_answer_bytes` (the /v1/models list within
`probe.MAX_MODELS` cards too): an answer over it is that probe failing, as any other
failure of it is (a /health too large is a failed check, a /metrics one a failed scrape,
a /v1/models or /version one "cannot tell"), and its reason is kept in the engine's
state (`oversized`, in /admin/engines) and logged once, until the probe is answered
within the bounds again.

Nothing here may end a probe task except `close()` and `remove()`: probe errors are
outcomes, and any other exception is logged and the loop carries on.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import aiohttp
from prometheus_client import CollectorRegistry

from narwhal.config import EngineConfig, FleetConfig
from narwhal.engines.session import HttpSession
from narwhal.fleet.backoff import next_delay
from narwhal.fleet.metrics import FleetMetrics
from narwhal.fleet.probe import (
    Oversized,
    Refused,
    check_health,
    engine_version,
    list_models,
    scrape_metrics,
    too_large,
)
from narwhal.fleet.scrape import EngineScrape
from narwhal.fleet.state import EngineHealth, HealthCheck, MetricsFailure, ScrapeResult
from narwhal.protocol.dialects import (
    TOKEN_IDS_SINCE,
    DialectCapabilities,
    capabilities,
    for_engine,
    vllm_supplies_token_ids,
)

log = logging.getLogger(__name__)


# vLLM's first release with `return_token_ids` (PROTOCOL.md §1).
class _Engine:
    __slots__ = ("base_url", "config", "headers", "placeable", "state")

    def __init__(self, config: EngineConfig, state: EngineHealth) -> None:
        self.state = state
        self.configure(config)
        self.placeable = state.placeable  # as last announced to subscribers

    @property
    def capabilities(self) -> DialectCapabilities:
        resolved = self.state.capabilities
        return resolved if resolved is not None else capabilities(self.config.dialect)

    def configure(self, config: EngineConfig) -> None:
        self.config = config
        self.state.capabilities = for_engine(
            config.dialect,
            supplies_token_ids=self.state.supplies_token_ids,
            schedules_by_priority=config.scheduling_policy == "priority",
        )
        self.base_url = config.url.rstrip("/")
        # Its key on every probe, /health and /metrics too: which routes an engine guards
        # is its business (vLLM guards /v1 only, SGLang all but /health and /metrics).
        auth = config.authorization
        self.headers: dict[str, str] = {} if auth is None else {"Authorization": auth}

    def scrapes_metrics(self) -> bool:
        return not self.capabilities.metrics_optional or self.state.metrics_supported is not False


class FleetMonitor:
    def __init__(
        self,
        engines: Sequence[EngineConfig],
        fleet: FleetConfig,
        session: HttpSession,
        registry: CollectorRegistry,
        *,
        rng: random.Random | None = None,
        model: str | None = None,
        own_requests: Callable[[str], int] = lambda name: 0,
    ) -> None:
        """`model`: the configured model; engines whose /v1/models does not list it stay
        out of placement (checked whenever an engine comes up). None: no check.
        `own_requests`: see `count_own_requests`."""
        self._model = model
        self._fleet = fleet
        self._session = session
        self._rng = rng if rng is not None else random.Random()
        self._timeout = aiohttp.ClientTimeout(total=fleet.probe_timeout_s)
        self._engines: dict[str, _Engine] = {}
        self._states: dict[str, EngineHealth] = {}  # the metrics' live view of the fleet
        for config in engines:
            if config.name in self._engines:
                raise ValueError(f"duplicate engine name {config.name!r}")
            self._engines[config.name] = self._engine(config)
        self._metrics = FleetMetrics(registry, self._states, time.monotonic)
        self._subscribers: list[Callable[[], None]] = []
        self._degraded = False  # monitoring_degraded() as last announced
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._started = False
        self._closed = False
        self._own_requests = own_requests

    def count_own_requests(self, own_requests: Callable[[str], int]) -> None:
        """How many of Narwhal's requests an engine holds now (by name): read the moment a
        scrape answers, so that what the scrape shows beyond them is known to be
        someone else's work, not Narwhal's requests that have finished since."""
        self._own_requests = own_requests

    def _engine(self, config: EngineConfig) -> _Engine:
        state = self._states[config.name] = EngineHealth(stale_after_s=self._fleet.stale_after_s)
        return _Engine(config, state)

    async def start(self) -> None:
        """Check every engine once (concurrently), then keep checking in the background."""
        if self._started:
            raise RuntimeError("FleetMonitor.start() called twice")
        self._started = True
        started_at = time.monotonic()
        await asyncio.gather(*(self._guarded_round(e) for e in self._engines.values()))
        if self._closed:  # close() ran while the first round was in flight
            return
        for name, engine in self._engines.items():
            self._tasks[name] = asyncio.create_task(
                self._run(engine, started_at), name=f"fleet-probe-{name}"
            )

    async def close(self) -> None:
        """Stop every probe task and wait for it; take the fleet's series off the registry."""
        if not self._closed:
            self._closed = True
            self._metrics.unregister()
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def add(self, config: EngineConfig) -> EngineHealth:
        """Monitor one more engine (a reload): its first round starts now; its state."""
        if config.name in self._engines:
            raise ValueError(f"duplicate engine name {config.name!r}")
        engine = self._engines[config.name] = self._engine(config)
        self._metrics.add(config.name)
        if self._started and not self._closed:
            self._tasks[config.name] = asyncio.create_task(
                self._first_round_then_run(engine), name=f"fleet-probe-{config.name}"
            )
        return engine.state

    def remove(self, name: str) -> None:
        """Stop monitoring an engine (its probe task is cancelled, not awaited)."""
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
        if self._engines.pop(name, None) is not None:
            del self._states[name]
            self._metrics.remove(name)

    def update(self, config: EngineConfig) -> None:
        """The engine's configuration changed in place (its key, its wave, its limits; a
        new URL or dialect is another engine: `remove`, then `add`)."""
        self._engines[config.name].configure(config)

    def reconfigure(self, fleet: FleetConfig) -> None:
        """Probe by `fleet`'s interval, timeout and staleness from the next round on."""
        self._fleet = fleet
        self._timeout = aiohttp.ClientTimeout(total=fleet.probe_timeout_s)
        for engine in self._engines.values():
            engine.state.stale_after_s = fleet.stale_after_s

    def health(self, name: str) -> EngineHealth:
        """The engine's live state (KeyError for an unknown name). Do not modify it."""
        return self._engines[name].state

    def is_placeable(self, name: str) -> bool:
        return self._engines[name].state.placeable

    def monitoring_degraded(self) -> bool:
        """No engine can take work, and monitoring (not health) is why for at least one."""
        states = [e.state for e in self._engines.values()]
        return (
            bool(states)
            and not any(s.placeable for s in states)
            and any(s.healthy and s.monitoring_failed for s in states)
        )

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call `callback()` on the loop whenever an engine's placeability changes (or,
        with it or alone, `monitoring_degraded()`); it reads the new state itself."""
        self._subscribers.append(callback)

    def report(self, name: str, now: float) -> dict[str, Any]:
        """The engine's monitoring view for /admin/engines; `now` from time.monotonic()."""
        state = self._engines[name].state
        age = state.scrape_age(now)
        return {
            "health": state.status,
            "consecutive_failures": state.consecutive_failures,
            "last_scrape": _scrape_view(state.last_scrape),
            "scrape_age_s": None if age is None else round(age, 3),
            "metrics": state.metrics_state(),
            "serves_model": state.serves_model,
            "max_model_len": state.max_model_len,
            "credentials_refused": state.credentials_refused,
            "version": state.version,
            "supplies_token_ids": state.supplies_token_ids,
            "oversized_answers": dict(state.oversized),
        }

    # --- the probe loop ----------------------------------------------------------------

    async def _first_round_then_run(self, engine: _Engine) -> None:
        started_at = time.monotonic()
        await self._guarded_round(engine)
        await self._run(engine, started_at)

    async def _run(self, engine: _Engine, last_round_at: float) -> None:
        while True:
            delay = next_delay(
                self._fleet.probe_interval_s, engine.state.consecutive_failures, self._rng
            )
            # Paced start to start, so a slow answer does not stretch the cadence; a round
            # that overran starts the next at once (sleep(0) still yields to the loop).
            await asyncio.sleep(max(0.0, last_round_at + delay - time.monotonic()))
            last_round_at = time.monotonic()
            await self._guarded_round(engine)

    async def _guarded_round(self, engine: _Engine) -> None:
        try:
            await self._round(engine)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("fleet: probe round for engine %s failed", engine.config.name)

    async def _round(self, engine: _Engine) -> None:
        if engine.scrapes_metrics():
            health, (scrape, own) = await asyncio.gather(self._check(engine), self._scrape(engine))
        else:
            health, scrape, own = await self._check(engine), None, 0
        state, name = engine.state, engine.config.name
        was_status = state.status
        limit = self._fleet.max_probe_answer_bytes
        oversized = health is HealthCheck.TOO_LARGE
        reason = too_large("/health", limit) if oversized else None
        _note(name, state, "/health", reason, health in _ANSWERED_HEALTH)
        if scrape is not None:
            oversized = scrape is MetricsFailure.TOO_LARGE
            reason = too_large("/metrics", limit) if oversized else None
            answered = isinstance(scrape, EngineScrape) or scrape in _ANSWERED_METRICS
            _note(name, state, "/metrics", reason, answered)
        if health is not HealthCheck.OK:
            self._metrics.count_failure(name, "health")
        else:
            # Before the health is recorded, so that no one (placement, subscribers)
            # sees the engine placeable while what it serves is still being asked.
            # A restart seen in its counters (`recheck`) is a new process too.
            new_process = was_status != "up" or state.recheck
            if self._model is not None and (new_process or state.serves_model is None):
                await self._check_model(engine)
            if engine.capabilities.version_gates_token_ids and new_process:
                await self._check_version(engine)  # (a restart may have changed it)
            if state.recheck:
                log.info(
                    "fleet: engine %s restarted (its metrics counters went back): "
                    "max_model_len %s, version %s",
                    name,
                    state.max_model_len,
                    state.version,
                )
                state.recheck = False
        # From here to the announcement nothing awaits: a change is seen and
        # announced in one step of the loop.
        now = time.monotonic()
        state.record_health(health, now)
        if scrape is not None:
            state.record_scrape(scrape, now, own)
            if isinstance(scrape, MetricsFailure) and state.metrics_supported is not False:
                self._metrics.count_failure(name, "metrics")
        else:
            state.refresh(now)
        _log_changes(name, state, health, was_status, engine.placeable, now)
        self._announce(engine)

    async def _check_model(self, engine: _Engine) -> None:
        state = engine.state
        models = await list_models(
            self._session,
            engine.base_url,
            self._timeout,
            engine.headers,
            self._fleet.max_probe_answer_bytes,
        )
        reason = models.reason if isinstance(models, Oversized) else None
        answered = isinstance(models, dict | Refused)
        _note(engine.config.name, state, "/v1/models", reason, answered)
        refused = isinstance(models, Refused)
        if refused and not state.credentials_refused:
            log.error(
                "fleet: engine %s refused the router's credentials on /v1/models (%s): it "
                "was started with an API key (vLLM/SGLang --api-key); give the router that "
                "key as engines[].api_key (or api_key_env, api_key_file). Out of placement "
                "until it accepts the router's requests",
                engine.config.name,
                "the configured api_key is wrong" if engine.headers else "no api_key is set",
            )
        elif not refused and state.credentials_refused:
            log.info("fleet: engine %s accepts the router's credentials again", engine.config.name)
        state.credentials_refused = refused
        if models is None or isinstance(models, Refused | Oversized):
            # Cannot tell (refused: out of placement already); ask again next round.
            return
        serves = self._model in models
        if serves is False and engine.state.serves_model is not False:
            log.warning(
                "fleet: engine %s does not serve model %s (it lists: %s)",
                engine.config.name,
                self._model,
                ", ".join(sorted(models)) or "nothing",
            )
        engine.state.serves_model = serves
        engine.state.max_model_len = models.get(self._model) if self._model in models else None

    async def _check_version(self, engine: _Engine) -> None:
        """A vLLM older than `return_token_ids` sends no IDs (PROTOCOL.md: the dialect
        must work with 0.10.2+, and an engine that sends no IDs is not fine), so every
        request placed there fails: say so, and what to do, when it comes up."""
        answer = await engine_version(
            self._session,
            engine.base_url,
            self._timeout,
            engine.headers,
            self._fleet.max_probe_answer_bytes,
        )
        reason = answer.reason if isinstance(answer, Oversized) else None
        _note(engine.config.name, engine.state, "/version", reason, isinstance(answer, str))
        version = None if isinstance(answer, Oversized) else answer
        state = engine.state
        state.version = version
        state.supplies_token_ids = None if version is None else vllm_supplies_token_ids(version)
        state.capabilities = for_engine(
            engine.config.dialect,
            supplies_token_ids=state.supplies_token_ids,
            schedules_by_priority=engine.config.scheduling_policy == "priority",
        )
        if state.supplies_token_ids is False:
            log.warning(
                "fleet: engine %s runs vLLM %s, which sends no token IDs (return_token_ids "
                "came in %s): it is asked for none and served without token accounting "
                "(output counted from its usage and events). Upgrade it for exact "
                "per-token accounting.",
                engine.config.name,
                version,
                ".".join(map(str, TOKEN_IDS_SINCE)),
            )

    async def _check(self, engine: _Engine) -> HealthCheck:
        try:
            return await check_health(
                self._session,
                engine.base_url,
                self._timeout,
                engine.headers,
                self._fleet.max_probe_answer_bytes,
            )
        except Exception:
            log.exception("fleet: health check of engine %s raised", engine.config.name)
            return HealthCheck.ERROR

    async def _scrape(self, engine: _Engine) -> tuple[ScrapeResult, int]:
        """The scrape, and Narwhal's own requests on the engine as it answered."""
        try:
            result = await scrape_metrics(
                self._session,
                engine.base_url,
                engine.capabilities,
                self._timeout,
                engine.headers,
                self._fleet.max_probe_answer_bytes,
            )
        except Exception:
            log.exception("fleet: metrics scrape of engine %s raised", engine.config.name)
            result = MetricsFailure.ERROR
        return result, self._own_requests(engine.config.name)

    def _announce(self, engine: _Engine) -> None:
        placeable, degraded = engine.state.placeable, self.monitoring_degraded()
        if placeable == engine.placeable and degraded == self._degraded:
            return
        engine.placeable = placeable
        if degraded != self._degraded:
            self._degraded = degraded
            log.warning("fleet: monitoring %s", "degraded" if degraded else "recovered")
        for callback in list(self._subscribers):
            try:
                callback()
            except Exception:
                log.exception("fleet: placeability subscriber raised")


def _log_changes(
    name: str,
    state: EngineHealth,
    health: HealthCheck,
    was_status: str,
    was_placeable: bool,
    now: float,
) -> None:
    if state.status != was_status:
        if state.status == "up":
            log.info("fleet: engine %s is up", name)
        elif state.status == "down":
            log.warning(
                "fleet: engine %s is down (%s, %d consecutive failed checks)",
                name,
                health.value,
                state.consecutive_failures,
            )
    elif state.healthy and state.placeable != was_placeable:
        # Up all along, so metrics made the difference.
        if state.placeable:
            log.info("fleet: engine %s: metrics readable again", name)
        else:
            log.warning(
                "fleet: engine %s out of placement: no good metrics scrape for %.1f s",
                name,
                state.scrape_age(now) or 0.0,
            )


# The outcomes that say the engine answered (within the bounds): a probe that only failed
# to get an answer (a timeout, a refused connection) leaves an oversized reason standing.
_ANSWERED_HEALTH: Final = frozenset({HealthCheck.OK, HealthCheck.UNHEALTHY, HealthCheck.BAD_STATUS})
_ANSWERED_METRICS: Final = frozenset(
    {MetricsFailure.ABSENT, MetricsFailure.UNREADABLE, MetricsFailure.BAD_STATUS}
)


def _note(name: str, state: EngineHealth, path: str, reason: str | None, answered: bool) -> None:
    """Keep why the probe of `path` failed for its answer's size (`reason`), or forget it
    once the engine `answered` within the bounds; log a reason once, when it appears,
    not every round it repeats."""
    if reason is not None:
        if state.oversized.get(path) != reason:
            state.oversized[path] = reason
            log.warning(
                "fleet: engine %s: %s; the probe fails (the connection is closed, the "
                "rest not read) until it answers within the bound",
                name,
                reason,
            )
    elif answered and state.oversized.pop(path, None) is not None:
        log.info("fleet: engine %s answers %s within the bounds again", name, path)


def _scrape_view(scrape: EngineScrape | None) -> dict[str, float | None] | None:
    if scrape is None:
        return None
    return {"running": scrape.running, "waiting": scrape.waiting, "kv_usage": scrape.kv_usage}
