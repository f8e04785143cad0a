"""Usage: take the engine's when it sends one, compute it when it does not.

Seed, "Metadata and usage": non-streaming assembly retains "non-null engine usage";
"If the engine omits usage, Narwhal computes it from input length [and] measured
output token count". Engines send usage on a `choices: []` chunk (vLLM, SGLang,
llama.cpp; PROTOCOL.md §2.2), on the finishing chunk (transformers serve, §6.3), on
every chunk with continuous stats (cumulative, so the last one is the total), or as
OpenAI's `"usage": null` on every other chunk (§2.5): the last non-null one wins.

Usage is a supported field, so a malformed one fails the attempt like any other (seed:
502 "for malformed supported fields"; after the headers, an error event): a usage that
is not an object, and any count in it that is not a nonnegative integer below
`MAX_TOKEN_COUNT` (a bool is no integer here). The counts are every `*_tokens` key of the
usage (`prompt_tokens`, `completion_tokens`, `total_tokens`, SGLang's `reasoning_tokens`)
and of its `*_tokens_details` objects (`cached_tokens`, `reasoning_tokens`, ...); a null
is "not sent" (PROTOCOL.md §1.2). Unchecked, such counts reached clients as the engine
wrote them, and the router's own books: a 401-digit `prompt_tokens` overflowed the token
counters (a 500), 2**70 was added to them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, NoReturn

from narwhal.protocol.events import EngineOutputError
from narwhal.protocol.fields import malformed

MAX_TOKEN_COUNT: Final = 2**31 - 1
"""The largest token count a usage may carry. The longest contexts served today are about
10 million tokens (2**23 or so), a request's usage counts one context (Narwhal sends no
batches and n is 1), so anything near this is an engine's error, not a count; and a bound
this size keeps every count exact in the float64 Prometheus counters it is added to, and
within the int32 fields some clients decode usage into."""


def event_usage(event: Mapping[str, Any]) -> dict[str, Any] | None:
    """The event's non-null usage object, or None. A usage that is not an object, or a
    count in it that is not one (module doc), is a malformed supported field (502)."""
    usage = event.get("usage")
    if usage is None:
        return None
    if type(usage) is not dict:
        raise EngineOutputError("engine sent usage that is not an object")
    for key, value in usage.items():
        # (Per event with continuous usage stats: the usual in-range count costs one test.)
        if type(value) is int:
            if not 0 <= value <= MAX_TOKEN_COUNT and key.endswith("_tokens"):
                _bad_count(f"usage.{key}")
        elif value is not None:
            if key.endswith("_tokens"):
                _bad_count(f"usage.{key}")
            if key.endswith("_tokens_details"):
                _check_details(value, f"usage.{key}")
    return usage


def _check_details(details: Any, where: str) -> None:
    if type(details) is not dict:
        malformed(where, "an object")
    for key, value in details.items():
        if value is None or not key.endswith("_tokens"):
            continue
        if type(value) is not int or not 0 <= value <= MAX_TOKEN_COUNT:
            _bad_count(f"{where}.{key}")


def _bad_count(where: str) -> NoReturn:
    malformed(where, f"an integer from 0 to {MAX_TOKEN_COUNT}")


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
    missing (`event_usage` refused any other bad value): for engines without token IDs,
    usage is the only output count there is (seed: `token_accounting: unavailable`)."""
    return _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None
