"""Joining streamed tool-call and legacy function-call fragments.

Seed, "Non-streaming assembly": "tool_calls: Calls are grouped by stream index and
returned in index order; ID, function name, and arguments concatenate
independently"; "Every tool call must contain: an ID, a function name"; "Tool
arguments remain engine-generated strings for the client to interpret"; "Legacy
function_call: Function name and argument fragments concatenate into one message
field".

What engines send (PROTOCOL.md §2.2, §6.3): vLLM gives a call's `id`, `type` and
`function.name` on its first fragment and `function.arguments` in later ones; the
finishing chunk may carry the last argument fragment; transformers serve sends each
call whole in one delta. Fragments of different calls may interleave, so everything
is keyed by `index`. Arguments are never parsed or repaired.
"""

from __future__ import annotations

from typing import Any

from narwhal.protocol.events import EngineOutputError
from narwhal.protocol.fields import (
    FUNCTION_KEYS,
    TOOL_CALL_KEYS,
    expect_index,
    expect_object,
    expect_str,
    is_empty,
    malformed,
    unsupported,
)


class _Call:
    __slots__ = ("arguments", "ids", "names")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.names: list[str] = []
        self.arguments: list[str] = []


class ToolCalls:
    """The tool calls of one choice, fed the `delta.tool_calls` arrays in stream order."""

    __slots__ = ("_calls",)

    def __init__(self) -> None:
        self._calls: dict[int, _Call] = {}

    def add(self, fragments: Any) -> None:
        """One delta's non-null `tool_calls` value."""
        if type(fragments) is not list:
            malformed("delta.tool_calls", "an array of objects")
        for fragment in fragments:
            self._add_fragment(fragment)

    def _add_fragment(self, fragment: Any) -> None:
        if type(fragment) is not dict:
            malformed("delta.tool_calls", "an array of objects")
        index = expect_index(fragment.get("index"), "tool call index")
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = _Call()
        for key, value in fragment.items():
            if value is None or key == "index":
                continue
            if key == "function":
                function = expect_object(value, "tool call function")
                _add_function(function, call.names, call.arguments, "tool call function")
            elif key == "id":
                call.ids.append(expect_str(value, "tool call id"))
            elif key == "type":
                if value != "function":
                    raise EngineOutputError(
                        f"engine sent an unsupported tool call type {value!r} (only function)"
                    )
            elif key not in TOOL_CALL_KEYS and not is_empty(value):
                unsupported("tool call", key)

    def __bool__(self) -> bool:
        return bool(self._calls)

    def result(self) -> list[dict[str, Any]]:
        """The calls in index order; UpstreamError when one lacks its id or name."""
        calls = []
        for index in sorted(self._calls):
            call = self._calls[index]
            call_id = "".join(call.ids)
            name = "".join(call.names)
            if not call_id:
                raise EngineOutputError(f"engine tool call at index {index} has no id")
            if not name:
                raise EngineOutputError(f"engine tool call at index {index} has no function name")
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": "".join(call.arguments)},
                }
            )
        return calls


class FunctionCall:
    """The legacy `delta.function_call` of one choice (OpenAI, PROTOCOL.md §2.5)."""

    __slots__ = ("_arguments", "_names", "_seen")

    def __init__(self) -> None:
        self._names: list[str] = []
        self._arguments: list[str] = []
        self._seen = False

    def add(self, value: Any) -> None:
        """One delta's non-null `function_call` value."""
        function = expect_object(value, "delta.function_call")
        if function:
            self._seen = True
            _add_function(function, self._names, self._arguments, "delta.function_call")

    def result(self) -> dict[str, str] | None:
        """`{"name", "arguments"}`, or None when no fragment came. A call without a
        name is as unusable as a tool call without one, so it is refused the same way."""
        if not self._seen:
            return None
        name = "".join(self._names)
        if not name:
            raise EngineOutputError("engine function_call has no name")
        return {"name": name, "arguments": "".join(self._arguments)}


def _add_function(
    function: dict[str, Any], names: list[str], arguments: list[str], where: str
) -> None:
    for key, value in function.items():
        if value is None:
            continue
        if key == "arguments":
            arguments.append(expect_str(value, f"{where} arguments"))
        elif key == "name":
            names.append(expect_str(value, f"{where} name"))
        elif key not in FUNCTION_KEYS and not is_empty(value):
            unsupported(where, key)
