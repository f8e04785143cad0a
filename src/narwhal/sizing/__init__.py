"""Workload sizing: how many prompt tokens a request brings, without waiting on an engine.

`WorkloadSizer.size` counts in the router's own process, and says how sure it is: a
`PromptSize` is the count (`tokens`) and the bounds the engines' own count is expected in
(`low`, `high`), by source:

- "local": exact, by the configured tokenizer.json (`local`), or because the prompt is
  token IDs; low = high = tokens;
- "engine": an engine's own count (its tokenize endpoint, `remote`), cached by prompt
  from an earlier answer; low = high = tokens;
- "calibrated": the simulator's tokenizer (`local`), corrected by what the engines' counts
  have shown, with the interval those counts fell in (`calibration`); exact for
  `narwhal sim` engines, whose counts are the estimate's, so low = high there;
- "estimate": the same estimate uncorrected and without bounds, in `open` admission, where
  the count decides nothing.

Admission acts on `tokens` at once when its decision is the same at `low` and at `high`
(`sizing.bounds`); only when it is not does it call `engine_count`, which waits for an
engine's count at most a bounded time ("engine"; on timeout or failure the size as it was,
marked "fallback"; at once so while the engines' recent answers have come later than the
wait allows). What the engines answer, in time or later, and their
`usage.prompt_tokens` after a request, teach the calibration; so does one estimated prompt
in `_SAMPLE_EVERY`, sent to an engine off the request's path (every one long enough to
teach the bounds, one at a time, until they are learned).

Chat prompts count the chat template: exactly by the engine and for the sim's template,
as a per-message allowance with a configured tokenizer.json.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Final, Literal

from narwhal.protocol.requests import CompletionRequest, Route
from narwhal.sizing.calibration import MIN_INTERVAL_TOKENS, EstimateCalibration
from narwhal.sizing.local import PromptSizer, load_sizer, token_id_count
from narwhal.sizing.remote import EngineTokenizer, TokenizeCandidate, TokenizeQuery, make_query

_ROUTES: Final[tuple[Route, ...]] = ("chat", "completion")

Source = Literal["local", "engine", "calibrated", "fallback", "estimate"]
SOURCES: Final[tuple[Source, ...]] = ("local", "engine", "calibrated", "fallback", "estimate")
# Tokenizing a longer body takes milliseconds (about 40 ms a megabyte here): in pieces,
# yielding to the loop between them, so no other stream stalls meanwhile.
_SIZE_INLINE_BYTES: Final = 64 * 1024
# The engine's answer lists every token ID, about two bytes per prompt character, so a
# larger body's answer would pass the 1 MiB cap on answers anyway: not asked.
_ENGINE_MAX_BODY_BYTES: Final = 256 * 1024
# Once the bounds are learned, one estimated prompt in this many is still sent to an
# engine, in the background, so they follow a change that no admitted request shows.
_SAMPLE_EVERY: Final = 64

# Open admission: after this many prompts in the bounds' window, it learns from one in
# _OPEN_EVERY (the relay's per-request cost).
_OPEN_FULL: Final = 512
_OPEN_EVERY: Final = 8


@dataclass(frozen=True, slots=True)
class PromptSize:
    tokens: int
    low: int
    high: int
    source: Source
    # The text estimate before calibration, when one was made: what calibration learns from.
    estimated: int | None = None
    # What to ask an engine for its count (None: the prompt is not to be sent).
    query: TokenizeQuery | None = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def exact(cls, tokens: int, source: Source, estimated: int | None = None) -> PromptSize:
        return cls(tokens, tokens, tokens, source, estimated)

    @property
    def settled(self) -> bool:
        """Whether the count is known exactly (as far as sizing can know it)."""
        return self.low == self.high


class WorkloadSizer:
    """The front's one sizing call per request, and the bounded wait for an engine's count.

    `use_engine=False` is local sizing exactly as before, value for value: no tokenize
    calls and no calibration. The router enables it in predictive admission without a
    configured tokenizer, where a better count changes decisions.
    """

    def __init__(
        self,
        local: PromptSizer,
        remote: EngineTokenizer | None = None,
        *,
        use_engine: bool = False,
        calibration: EstimateCalibration | None = None,
    ) -> None:
        self._local = local
        self._remote = remote if use_engine else None
        self._use_engine = use_engine
        self._calibration = calibration if calibration is not None else EstimateCalibration()
        # Requests by the source of the size their admission acted on (`count`).
        self.sizes: collections.Counter[Source] = collections.Counter({s: 0 for s in SOURCES})
        self._since_sampled = 0
        self._open_seen = 0
        self._sampling = False
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def calibrating(self) -> bool:
        """Whether estimates are calibrated and bounded (predictive, no tokenizer.json)."""
        return self._use_engine and not self._local.exact

    async def size(self, request: CompletionRequest, body_bytes: int) -> PromptSize:
        """The prompt's size, from this process alone (a cached engine count at most)."""
        exact = token_id_count(request)
        if exact is not None:
            return PromptSize.exact(exact, "local")
        if self._local.exact:
            return PromptSize.exact(await self._count_here(request, body_bytes), "local")
        if not self._use_engine:
            # Open admission sizes by the estimate, value for value; its bounds, learned
            # from the engines' usage, are for the context check alone.
            estimated = await self._count_here(request, body_bytes)
            _, low, high = self._calibration.interval(request.route, estimated)
            return PromptSize(
                estimated, min(low, estimated), max(high, estimated), "estimate", estimated
            )
        remote = self._remote
        query = None
        if remote is not None and body_bytes <= _ENGINE_MAX_BODY_BYTES:
            query = make_query(request)
            hit = None if query is None else remote.cached(query)
            if hit is not None:
                return PromptSize.exact(hit, "engine")
        estimated = await self._count_here(request, body_bytes)
        route = request.route
        tokens, low, high = self._calibration.interval(route, estimated)
        if query is not None:
            self._sample_now_and_then(route, query, estimated)
        return PromptSize(tokens, low, high, "calibrated", estimated, query)

    async def engine_count(self, route: Route, size: PromptSize, wait_s: float) -> PromptSize:
        """An engine's count of a calibrated prompt, if one answers within `wait_s`; else
        `size` as it is, marked "fallback". An answer that comes later still teaches the
        calibration and fills the cache; a cancelled wait leaves the call running too."""
        fallback = dataclasses.replace(size, source="fallback")
        remote, query, estimated = self._remote, size.query, size.estimated
        if remote is None or query is None or estimated is None or wait_s <= 0:
            return fallback
        latency = remote.latency_s
        if latency is not None and latency > wait_s:
            # The engines' answers come later than the wait allows (an engine busy with a
            # burst): waiting would only delay the decision. Sampling in the background
            # finds out when they are quick again.
            self._sample(remote, route, query, estimated)
            return fallback
        task = self._spawn(self._ask(remote, route, query, estimated))
        done, _ = await asyncio.wait((task,), timeout=wait_s)
        count = task.result() if done else None
        if count is None:
            return fallback
        return PromptSize.exact(count, "engine", estimated)

    def learn_text(self, text: str, engine_count: int) -> None:
        """An engine's count of a text no client sent (a profiling probe's, at start-up):
        it sets the estimate's factor before the first request, which would otherwise be
        sized by the uncorrected estimate, off by whatever the model's tokenizer is (2.9
        times under it, for the test tier's tiny model). The bounds stay as they are."""
        if not self.calibrating:
            return
        estimated = self._local.count_text(text)
        for route in _ROUTES:
            self._calibration.seed(route, estimated, engine_count)

    def count(self, size: PromptSize) -> None:
        """One request's admission acted on `size` (narwhal_prompt_sizing_total)."""
        self.sizes[size.source] += 1

    def observe_engine_prompt_tokens(
        self, route: Route, size: PromptSize, engine_count: int
    ) -> None:
        """After a request: the engine's `usage.prompt_tokens` for a prompt sized as `size`.
        Only estimates teach the calibration; exact counts have nothing to correct, and an
        engine's answer to tokenize has taught it already."""
        if size.source in ("calibrated", "fallback", "estimate") and size.estimated is not None:
            if size.source == "estimate" and self._calibration.samples(route) >= _OPEN_FULL:
                # Open admission uses the bounds for the context check alone: once they
                # rest on a full window, one request in _OPEN_EVERY keeps them current.
                self._open_seen += 1
                if self._open_seen % _OPEN_EVERY:
                    return
            self._calibration.observe(route, size.estimated, engine_count)

    def calibration(self, route: Route) -> float:
        """The factor applied to the route's estimates now (1.0 until engines have answered)."""
        return self._calibration.ratio(route)

    def bounds(self, route: Route) -> tuple[float, float]:
        """The ratio interval the engines' count is expected in, times the estimate."""
        return self._calibration.bounds(route)

    def stats(self) -> dict[str, int]:
        stats = {f"sized_{source}": self.sizes[source] for source in SOURCES}
        if self._remote is not None:
            stats.update({f"tokenize_{k}": v for k, v in self._remote.stats().items()})
        return stats

    def _sample_now_and_then(self, route: Route, query: TokenizeQuery, estimated: int) -> None:
        self._since_sampled += 1
        calibration = self._calibration
        # Only prompts the bounds learn from are worth a call each while they are learned.
        learning = (
            estimated >= MIN_INTERVAL_TOKENS
            and calibration.samples(route) < calibration.min_samples
        )
        if self._sampling or not (learning or self._since_sampled >= _SAMPLE_EVERY):
            return
        remote = self._remote
        assert remote is not None, "a query is made only with an engine tokenizer"
        self._sample(remote, route, query, estimated)

    def _sample(
        self, remote: EngineTokenizer, route: Route, query: TokenizeQuery, estimated: int
    ) -> None:
        """Ask an engine in the background, one call at a time."""
        if self._sampling:
            return
        self._since_sampled = 0
        self._sampling = True
        task = self._spawn(self._ask(remote, route, query, estimated))
        task.add_done_callback(self._sampled)

    def _sampled(self, _: asyncio.Task[Any]) -> None:
        self._sampling = False

    async def _ask(
        self, remote: EngineTokenizer, route: Route, query: TokenizeQuery, estimated: int
    ) -> int | None:
        count = await remote.fetch(query)
        if count is not None:
            self._calibration.observe(route, estimated, count)
        return count

    def _spawn(self, work: Coroutine[Any, Any, int | None]) -> asyncio.Task[int | None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _count_here(self, request: CompletionRequest, body_bytes: int) -> int:
        if body_bytes > _SIZE_INLINE_BYTES:
            return await self._local.size_long(request)
        return self._local(request)


__all__ = [
    "EngineTokenizer",
    "PromptSize",
    "PromptSizer",
    "TokenizeCandidate",
    "WorkloadSizer",
    "load_sizer",
]
