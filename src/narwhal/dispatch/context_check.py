"""The context-length 400 on a sized prompt, before any engine work.

On the least the engines' count can be: a prompt whose count is not exact (not the
tokenizer's, not an engine's) is held to the low end of its estimate's bounds, as the
engines' usage has taught them (wide until it has). The rest of what admission decides
from a prompt (its placement request, the TTFT check, whether an estimate must wait for
an engine's count) is the decision core's (`narwhal.decision.brain`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from narwhal.lease import RequestContext
from narwhal.protocol.context import check_context_length
from narwhal.protocol.requests import CompletionRequest, Route
from narwhal.sizing import PromptSize

# (route, the prompt's size, how long to wait) -> an engine's count, or the size marked
# "fallback" (`WorkloadSizer.engine_count`).
EngineCount = Callable[[Route, PromptSize, float], Awaitable[PromptSize]]


def check_context(request: CompletionRequest, context: RequestContext, limit: int | None) -> None:
    """Raise the 400 for a request that cannot fit the model's context of `limit` tokens
    (None: unknown, nothing to check)."""
    if limit is None:
        return
    size = context.prompt_size
    if size is None or size.source in ("local", "engine"):
        check_context_length(request, least=context.prompt_tokens, exact=True, limit=limit)
        return
    check_context_length(request, least=max(1, size.low), exact=False, limit=limit)
