"""Usage: take the engine's when it sends one, compute it when it does not.

Seed, "Metadata and usage": non-streaming assembly retains "non-null engine usage";
"If the engine omits usage, Narwhal computes it from input length [and] measured
output token count". Engines send usage on a `choices: []` chunk (vLLM, SGLang,
llama.cpp; PROTOCOL.md §2.2), on the finishing chunk (transformers serve, §6.3), on
every chunk with continuous stats (cumulative, so the last one is the total), or as
OpenAI's `"usage": null` on every other chunk (§2.5): the last non-null one wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from narwhal.protocol.events import EngineOutputError


def event_usage(event: Mapping[str, Any]) -> dict[str, Any] | None:
    """The event's non-null usage object, or None. A usage that is not an object is
    a malformed supported field (502)."""
    usage = event.get("usage")
    if usage is None:
        return None
    if type(usage) is not dict:
        raise EngineOutputError("engine sent usage that is not an object")
    return usage


def computed_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """OpenAI's usage object from Narwhal's own measurements (the prompt's sizing and
    the validated output ID count)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def usage_tokens(usage: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) from an engine usage, None where a count is
    missing or not a nonnegative integer: for engines without token IDs, usage is the
    only output count there is (seed: `token_accounting: unavailable`)."""
    return _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None
