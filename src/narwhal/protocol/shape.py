"""What makes an engine event malformed, decided once for every consumer.

Seed, "Non-streaming assembly": the assembler "returns HTTP 502 … for malformed supported
fields". A streaming client must not be handed what the assembler refuses (a
`finish_reason` of 5, a choice `index` of -1, a `delta` that is the string "hi"), and an
attempt must not count such a finish as one: `check_event` is the one check, called on
every event by the assembler (`Assembler.add`) and by the streaming forwarder's general
path (`StreamForwarder`); its fast path decodes into typed structs (`plain.py`) that
accept nothing this refuses, and anything they do not type goes the general way.

Malformed is a supported field whose value has the wrong type or shape: a choice without
a nonnegative integer `index`; a `finish_reason` that is not a string; a `stop_reason`
neither integer nor string; a chat `delta` that is not an object, or whose text fields,
`role`, `tool_calls` (each fragment with its own nonnegative `index`, a string `id`, a
`function` object of strings) or `function_call` have the wrong type; a completion
`text` that is not a string; `logprobs` whose arrays (`logprobs.py`) are not what the
route's shape says; `choices` that are not an array of objects; `usage` that is not an
object, or whose token counts are not nonnegative integers within bounds (`usage.py`). A
null is always "not sent" (PROTOCOL.md §1.2).

Not here, on purpose:
- *Unsupported* fields (a key outside the allow-lists of `fields.py` that carries a
  value: audio, annotations, custom tool calls). The assembler refuses them because it
  cannot assemble what it does not understand; a stream forwards them in the engine's
  shape (seed, "Streaming responses").
- Token IDs: `tokens.py`, through `OutputTracker` on both paths.
- What only a whole stream shows (a choice that never finished, a tool call without an
  id or name): the assembler's `result`, the stream's end check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from narwhal.protocol.events import Route
from narwhal.protocol.fields import (
    DELTA_TEXT,
    expect_index,
    expect_list,
    expect_object,
    expect_str,
    malformed,
)
from narwhal.protocol.logprobs import ELEMENT_CHECKS
from narwhal.protocol.usage import event_usage


def check_event(event: Mapping[str, Any], route: Route) -> None:
    """Raise EngineOutputError (502) when a supported field of the event is malformed."""
    # Every event of a non-streaming request comes here: the usual one is settled inline.
    if event.get("usage") is not None:
        event_usage(event)  # (it raises for a malformed one)
    choices = event.get("choices")
    if choices is None:
        return
    if type(choices) is not list:
        malformed("choices", "an array")
    checks = _CHOICE[route]
    for choice in choices:
        if type(choice) is not dict:
            malformed("choice", "an object")
        index = choice.get("index")
        if type(index) is not int or index < 0:
            expect_index(index, "choice index")  # (its error)
        for key, value in choice.items():
            if value is not None and key in checks:
                checks[key](value)


def check_finish_reason(value: Any) -> str | None:
    """A choice's finish_reason: None (unfinished) or a string."""
    if value is not None and type(value) is not str:
        malformed("finish_reason", "a string")
    return value


def _stop_reason(value: Any) -> None:
    # PROTOCOL.md §2.2: the stop token id or the stop string.
    if type(value) is not int and type(value) is not str:
        malformed("stop_reason", "an integer or a string")


def _logprobs(route: Route) -> Callable[[Any], None]:
    checks = ELEMENT_CHECKS[route]

    def check(value: Any) -> None:
        for key, values in expect_object(value, "logprobs").items():
            element = checks.get(key)
            if element is not None and values is not None:
                where = f"logprobs.{key}"
                element(expect_list(values, where), where)

    return check


def _delta(value: Any) -> None:
    if type(value) is not dict:
        malformed("delta", "an object")
    for key, item in value.items():
        if item is None or (type(item) is str and key in _DELTA_TEXT):
            continue
        if key in _DELTA_TEXT:
            malformed(f"delta.{key}", "a string")
        elif key == "tool_calls":
            _tool_calls(item)
        elif key == "role":
            expect_str(item, "delta.role")
        elif key == "function_call":
            _function(expect_object(item, "delta.function_call"), "delta.function_call")


def _tool_calls(value: Any) -> None:
    if type(value) is not list:
        malformed("delta.tool_calls", "an array of objects")
    for fragment in value:
        if type(fragment) is not dict:
            malformed("delta.tool_calls", "an array of objects")
        expect_index(fragment.get("index"), "tool call index")
        call_id = fragment.get("id")
        if call_id is not None:
            expect_str(call_id, "tool call id")
        function = fragment.get("function")
        if function is not None:
            _function(expect_object(function, "tool call function"), "tool call function")


def _function(function: dict[str, Any], where: str) -> None:
    name = function.get("name")
    if name is not None:
        expect_str(name, f"{where} name")
    arguments = function.get("arguments")
    if arguments is not None:
        expect_str(arguments, f"{where} arguments")


def _text(value: Any) -> None:
    expect_str(value, "text")


_DELTA_TEXT: Final = frozenset(DELTA_TEXT)
# Each route's choice fields with a shape to check (a non-null value); every other key is
# metadata, an ID list (tokens.py) or unsupported (the assembler's allow-lists).
_CHOICE: Final[dict[Route, dict[str, Callable[[Any], object]]]] = {
    "chat": {
        "finish_reason": check_finish_reason,
        "stop_reason": _stop_reason,
        "logprobs": _logprobs("chat"),
        "delta": _delta,
    },
    "completion": {
        "finish_reason": check_finish_reason,
        "stop_reason": _stop_reason,
        "logprobs": _logprobs("completion"),
        "text": _text,
    },
}
