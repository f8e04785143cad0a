"""Workload sizing: how many prompt tokens a request brings, once per request.

`WorkloadSizer.size` takes the most exact count it can cheaply have, in this order:

1. "tokenizer": counted exactly here, by the configured tokenizer.json (`local`), or
   because the prompt is token IDs;
2. "engine": an engine's own tokenize endpoint (`remote`), when enabled and it answers
   in time; cached, so a repeated prompt costs no call;
3. "estimate": the simulator's tokenizer (`local`), exact for `narwhal sim` engines and
   otherwise corrected by what the engines' own counts have shown (`calibration`).
   Once it has matched the engines' counts exactly for a run of prompts, the engines are
   not asked on the request's path any more (a round trip for nothing, which a refusal
   would wait for); one prompt in `_VERIFY_EVERY` is still checked, in the background,
   and the first difference sends sizing back to the engines.

Chat prompts count the chat template: exactly by the engine and for the sim's template,
as a per-message allowance with a configured tokenizer.json.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Final, Literal

from narwhal.protocol.requests import CompletionRequest, Route
from narwhal.sizing.calibration import EstimateCalibration
from narwhal.sizing.local import PromptSizer, load_sizer, token_id_count
from narwhal.sizing.remote import EngineTokenizer, TokenizeCandidate, TokenizeQuery, make_query

Source = Literal["tokenizer", "engine", "estimate"]
SOURCES: Final[tuple[Source, ...]] = ("tokenizer", "engine", "estimate")
# Tokenizing a longer body takes milliseconds (about 40 ms a megabyte here): in pieces,
# yielding to the loop between them, so no other stream stalls meanwhile.
_SIZE_INLINE_BYTES: Final = 64 * 1024
# The engine's answer lists every token ID, about two bytes per prompt character, so a
# larger body's answer would pass the 1 MiB cap on answers anyway: not asked.
_ENGINE_MAX_BODY_BYTES: Final = 256 * 1024
# Once the estimate is known to be exact, one prompt in this many is still checked.
_VERIFY_EVERY: Final = 64


@dataclass(frozen=True, slots=True)
class PromptSize:
    tokens: int
    source: Source
    # The text estimate before calibration, when one was made: what calibration learns from.
    estimated: int | None = None


class WorkloadSizer:
    """The front's one sizing call per request.

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
        self.sizes: collections.Counter[Source] = collections.Counter()
        self._since_verified = 0
        self._verifying = False
        self._tasks: set[asyncio.Task[None]] = set()

    def attach_remote(self, remote: EngineTokenizer) -> None:
        """The engine tokenizer, once its session exists (the router's start-up)."""
        if self._use_engine:
            self._remote = remote

    async def size(self, request: CompletionRequest, body_bytes: int) -> PromptSize:
        size = await self._size(request, body_bytes)
        self.sizes[size.source] += 1
        return size

    def observe_engine_prompt_tokens(
        self, route: Route, size: PromptSize, engine_count: int
    ) -> None:
        """After a request: the engine's `usage.prompt_tokens` for a prompt sized as `size`.
        Only estimates teach the calibration; exact counts have nothing to correct."""
        if self._use_engine and size.source == "estimate" and size.estimated is not None:
            self._calibration.observe(route, size.estimated, engine_count)

    def calibration(self, route: Route) -> float:
        """The factor applied to the route's estimates now (1.0 until engines have answered)."""
        return self._calibration.ratio(route)

    def stats(self) -> dict[str, int]:
        stats = {f"sized_{source}": self.sizes[source] for source in SOURCES}
        if self._remote is not None:
            stats.update({f"tokenize_{k}": v for k, v in self._remote.stats().items()})
        return stats

    async def _size(self, request: CompletionRequest, body_bytes: int) -> PromptSize:
        exact = token_id_count(request)
        if exact is not None:
            return PromptSize(exact, "tokenizer")
        if self._local.exact:
            return PromptSize(await self._count_here(request, body_bytes), "tokenizer")
        remote = self._remote
        if remote is not None and self._calibration.exact(request.route):
            # The estimate has been the engines' count exactly: use it, and check now and
            # then, off the request's path, that it still is.
            estimated = await self._count_here(request, body_bytes)
            self._verify_now_and_then(request, body_bytes, estimated)
            return PromptSize(estimated, "estimate", estimated)
        query = None
        if remote is not None and body_bytes <= _ENGINE_MAX_BODY_BYTES:
            query = make_query(request)
            hit = None if query is None else remote.cached(query)
            if hit is not None:
                return PromptSize(hit, "engine")
        estimated = await self._count_here(request, body_bytes)
        if remote is not None and query is not None:
            count = await remote.fetch(query)
            if count is not None:
                self._calibration.observe(request.route, estimated, count)
                return PromptSize(count, "engine", estimated)
        tokens = (
            self._calibration.apply(request.route, estimated) if self._use_engine else estimated
        )
        return PromptSize(tokens, "estimate", estimated)

    def _verify_now_and_then(
        self, request: CompletionRequest, body_bytes: int, estimated: int
    ) -> None:
        self._since_verified += 1
        if self._since_verified < _VERIFY_EVERY or self._verifying or self._remote is None:
            return
        if body_bytes > _ENGINE_MAX_BODY_BYTES:
            return
        query = make_query(request)
        if query is None:
            return
        self._since_verified = 0
        self._verifying = True
        task = asyncio.get_running_loop().create_task(self._verify(request.route, query, estimated))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _verify(self, route: Route, query: TokenizeQuery, estimated: int) -> None:
        try:
            assert self._remote is not None
            count = await self._remote.fetch(query)
            if count is not None:
                self._calibration.observe(route, estimated, count)
        finally:
            self._verifying = False

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
