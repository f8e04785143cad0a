"""Joining streamed logprobs (seed: "Chat logprobs: Content and refusal arrays
concatenate in stream order"; "Text-completion logprobs: Token, logprob, and offset
arrays concatenate in stream order").

Shapes (PROTOCOL.md): chat `{"content": [{token, logprob, bytes, top_logprobs}],
"refusal": [...]}` (§2.2, OpenAI's `refusal` list §2.5); completions `{"text_offset":
[int], "token_logprobs": [float|null], "tokens": [str], "top_logprobs": [{str: float}
|null]}` (§2.3; vLLM keeps `text_offset` counting across chunks, so plain
concatenation gives the right offsets); llama.cpp answers completions in the chat
shape `{"content": [...]}` (§6.2), which is joined the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from narwhal.protocol.events import Route
from narwhal.protocol.fields import (
    CHAT_LOGPROBS,
    COMPLETION_LOGPROBS,
    LLAMACPP_COMPLETION_LOGPROBS,
    expect_list,
    expect_object,
    is_empty,
    malformed,
    unsupported,
)

_NUMBER: Final = (int, float)


def _entries(values: list[Any], where: str) -> None:
    for value in values:
        if type(value) is not dict:
            malformed(where, "an array of objects")


def _tokens(values: list[Any], where: str) -> None:
    for value in values:
        if type(value) is not str:
            malformed(where, "an array of strings")


def _offsets(values: list[Any], where: str) -> None:
    for value in values:
        if type(value) is not int:
            malformed(where, "an array of integers")


def _numbers(values: list[Any], where: str) -> None:
    for value in values:
        if value is not None and type(value) not in _NUMBER:
            malformed(where, "an array of numbers")


def _maps(values: list[Any], where: str) -> None:
    for value in values:
        if value is not None and type(value) is not dict:
            malformed(where, "an array of objects")


# The check on the elements of each accepted array.
_ELEMENTS: Final = {
    "content": _entries,
    "refusal": _entries,
    "text_offset": _offsets,
    "token_logprobs": _numbers,
    "tokens": _tokens,
    "top_logprobs": _maps,
}
# Each route's allow-list (fields.py) with its checks (shape.py checks every event by them).
ELEMENT_CHECKS: Final[dict[Route, dict[str, Callable[[list[Any], str], None]]]] = {
    "chat": {key: _ELEMENTS[key] for key in CHAT_LOGPROBS},
    "completion": {
        key: _ELEMENTS[key] for key in COMPLETION_LOGPROBS + LLAMACPP_COMPLETION_LOGPROBS
    },
}


class Logprobs:
    """The logprobs of one choice, fed each chunk's non-null `logprobs` object."""

    __slots__ = ("_checks", "_lists", "_route", "_seen")

    def __init__(self, route: Route) -> None:
        self._route = route
        self._checks = ELEMENT_CHECKS[route]
        self._lists: dict[str, list[Any]] = {}
        self._seen = False

    def add(self, logprobs: Any) -> None:
        obj = expect_object(logprobs, "logprobs")
        self._seen = True
        for key, value in obj.items():
            if value is None:
                continue
            check = self._checks.get(key)
            if check is None:
                if is_empty(value):
                    continue
                unsupported("logprobs", key)
            where = f"logprobs.{key}"
            check(expect_list(value, where), where)
            joined = self._lists.get(key)
            if joined is None:
                self._lists[key] = list(value)
            else:
                joined.extend(value)

    def result(self) -> dict[str, Any] | None:
        """The joined object, or None when the engine sent no logprobs at all."""
        if not self._seen:
            return None
        lists = self._lists
        if self._route == "chat":
            out: dict[str, Any] = {"content": lists.get("content")}
            if "refusal" in lists:
                out["refusal"] = lists["refusal"]
            return out
        if "content" in lists and not any(key in lists for key in COMPLETION_LOGPROBS):
            return {"content": lists["content"]}  # llama.cpp's chat-style shape
        out = {key: lists.get(key, []) for key in COMPLETION_LOGPROBS}
        if "content" in lists:
            out["content"] = lists["content"]
        return out
