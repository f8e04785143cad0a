"""Token-ID validation and counting, one test per rule of the seed's "Token identity
and output accounting" and PROTOCOL.md §1."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from narwhal.errors import UpstreamError
from narwhal.protocol.assembly import Assembler
from narwhal.protocol.events import EngineOutputError, Route
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.tokens import (
    TokenIdError,
    check_token_ids,
    count_event_token_ids,
    count_prompt_token_ids,
    sglext_output_ids,
    sglext_output_token_count,
)
from narwhal.protocol.tracker import OutputTracker


def chat(delta: dict[str, Any], **choice: Any) -> dict[str, Any]:
    return {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": None, **choice}]}


def completion(text: Any, **choice: Any) -> dict[str, Any]:
    return {"id": "c", "choices": [{"index": 0, "text": text, **choice}]}


def test_token_id_error_is_a_502() -> None:
    assert issubclass(TokenIdError, UpstreamError)
    assert TokenIdError("x").status == 502


@pytest.mark.parametrize(
    "delta",
    [
        {"content": "Hi"},
        {"reasoning": "r"},
        {"reasoning_content": "r"},
        {"refusal": "no"},
        {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]},
        {"function_call": {"arguments": "{"}},
    ],
    ids=lambda d: next(iter(d)),
)
def test_chat_output_without_ids_is_an_error(delta: dict[str, Any]) -> None:
    with pytest.raises(TokenIdError, match="omits token_ids"):
        count_event_token_ids(chat(delta), "chat")
    with pytest.raises(TokenIdError, match="omits token_ids"):
        count_event_token_ids(chat(delta, token_ids=None), "chat")


def test_completion_text_without_ids_is_an_error() -> None:
    with pytest.raises(TokenIdError, match="omits token_ids"):
        count_event_token_ids(completion(" Paris"), "completion")
    with pytest.raises(TokenIdError, match="omits token_ids"):
        count_event_token_ids(completion(" Paris", token_ids=None), "completion")


@pytest.mark.parametrize("route", ["chat", "completion"])
def test_ids_are_counted(route: Route) -> None:
    event = (
        chat({"content": "Hi"}, token_ids=[1, 2, 3])
        if route == "chat"
        else completion("Hi", token_ids=[1, 2, 3])
    )
    assert count_event_token_ids(event, route) == 3


def test_empty_delta_with_ids_is_counted() -> None:
    # vLLM 0.13+: the parser held text back, the IDs still come (PROTOCOL.md §1.2).
    assert count_event_token_ids(chat({}, token_ids=[151657, 12]), "chat") == 2
    assert count_event_token_ids(completion("", token_ids=[198]), "completion") == 1


@pytest.mark.parametrize(
    "event",
    [
        chat({}),
        chat({"role": "assistant", "content": ""}),
        chat({"content": None, "reasoning_content": None, "tool_calls": []}),
        chat({"content": "", "reasoning": ""}, token_ids=None),
        {"id": "c", "choices": [{"index": 0, "finish_reason": "stop"}]},
        {"id": "c", "choices": [], "usage": {"prompt_tokens": 1}},
        {"id": "c"},
    ],
)
def test_event_without_output_and_without_ids_is_fine(event: dict[str, Any]) -> None:
    assert count_event_token_ids(event, "chat") == 0


def test_completion_without_text_and_without_ids_is_fine() -> None:
    assert count_event_token_ids(completion(""), "completion") == 0
    assert count_event_token_ids(completion(None, finish_reason="stop"), "completion") == 0


def test_empty_id_list_on_an_event_without_output() -> None:
    assert count_event_token_ids(chat({}, token_ids=[]), "chat") == 0


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([True], "Boolean"),
        ([1, False], "Boolean"),
        ([1.0], "not an integer"),
        ([-1], "negative"),
        (["3"], "not an integer"),
        ([[1, 2]], "not an integer"),
        ([None], "not an integer"),
        ([{"id": 1}], "not an integer"),
    ],
)
def test_malformed_id_lists_are_errors(ids: list[Any], message: str) -> None:
    with pytest.raises(TokenIdError, match=message):
        count_event_token_ids(chat({"content": "x"}, token_ids=ids), "chat")
    with pytest.raises(TokenIdError, match=message):
        count_event_token_ids(completion("x", token_ids=ids), "completion")


@pytest.mark.parametrize("ids", ["1,2", 5, {"0": 1}, True, "[]"])
def test_ids_that_are_not_a_list_are_errors(ids: Any) -> None:
    with pytest.raises(TokenIdError, match="not a list"):
        count_event_token_ids(chat({"content": "x"}, token_ids=ids), "chat")
    # Even on an event that carries no output.
    with pytest.raises(TokenIdError, match="not a list"):
        count_event_token_ids(chat({}, token_ids=ids), "chat")


def test_ids_as_decoded_from_json() -> None:
    # The engine's JSON, decoded as the relay does: true/1.0 must not pass as ints.
    for raw in (b"[1,true]", b"[1.0]", b"[-1]", b'["3"]', b"[[3]]"):
        ids = msgspec.json.decode(raw)
        with pytest.raises(TokenIdError):
            check_token_ids(ids, "token_ids")
    assert check_token_ids(msgspec.json.decode(b"[0,1,4294967296]"), "token_ids") == 3


def test_long_lists_use_the_same_rules() -> None:
    good = list(range(10_000))
    assert check_token_ids(good, "prompt_token_ids") == 10_000
    for bad, message in (([True], "Boolean"), ([-5], "negative"), ([2.0], "not an integer")):
        with pytest.raises(TokenIdError, match=message):
            check_token_ids(good + bad + good, "prompt_token_ids")


def test_prompt_ids_are_validated_top_level_and_per_choice() -> None:
    role = chat({"role": "assistant", "content": ""}, token_ids=None)
    role["prompt_token_ids"] = [1, 2, 3]
    assert count_event_token_ids(role, "chat") == 0
    assert count_prompt_token_ids(role) == 3
    role["prompt_token_ids"] = [1, True]
    with pytest.raises(TokenIdError, match="Boolean token id in prompt_token_ids"):
        count_event_token_ids(role, "chat")
    first = completion(" Paris", token_ids=[12366], prompt_token_ids=[791, 6864, 315])
    assert count_event_token_ids(first, "completion") == 1
    assert count_prompt_token_ids(first) == 3
    first["choices"][0]["prompt_token_ids"] = "791"
    with pytest.raises(TokenIdError, match="prompt_token_ids that is not a list"):
        count_event_token_ids(first, "completion")


def test_null_prompt_ids_are_absent() -> None:
    event = completion("x", token_ids=[1], prompt_token_ids=None)
    event["prompt_token_ids"] = None
    assert count_event_token_ids(event, "completion") == 1
    assert count_prompt_token_ids(event) is None


def test_several_choices_are_summed() -> None:
    event = {
        "choices": [
            {"index": 0, "delta": {"content": "a"}, "token_ids": [1]},
            {"index": 1, "delta": {"content": "b"}, "token_ids": [2, 3]},
        ]
    }
    assert count_event_token_ids(event, "chat") == 3
    event["choices"][1]["token_ids"] = None
    with pytest.raises(TokenIdError):
        count_event_token_ids(event, "chat")


@pytest.mark.parametrize(
    "event",
    [{"choices": {"index": 0}}, {"choices": ["x"]}, {"choices": [{"index": 0, "delta": "hi"}]}],
)
def test_malformed_structure_is_a_502(event: dict[str, Any]) -> None:
    with pytest.raises(EngineOutputError):
        count_event_token_ids(event, "chat")


def test_sglext_output_ids() -> None:
    event = {"choices": [], "sglext": {"input_ids": [1, 2], "output_ids": [[5, 6, 7]]}}
    assert sglext_output_token_count(event) == 3
    assert count_event_token_ids(event, "chat") == 0
    assert sglext_output_token_count({"choices": []}) is None
    assert sglext_output_token_count({"sglext": {"input_ids": [1]}}) is None
    for bad in ({"output_ids": [[True]]}, {"output_ids": [5]}, {"output_ids": 5}, []):
        with pytest.raises(TokenIdError):
            sglext_output_token_count({"sglext": bad})
    assert sglext_output_ids(event) == [[5, 6, 7]]


@pytest.mark.parametrize("bad", [[1], {"output_ids": [[True]]}, {"output_ids": {"0": [1]}}])
def test_the_tracker_and_the_assembler_refuse_bad_sglext_alike(bad: Any) -> None:
    """One check of SGLang's end-of-stream IDs (`sglext_output_ids`) for both consumers
    of a non-streaming attempt's events."""
    event = {"choices": [], "sglext": bad}
    tracker = OutputTracker("chat", token_ids=False)
    with pytest.raises(TokenIdError) as counted:
        tracker.observe(event, 0.0)
    assembler = Assembler("chat", Exposure(token_ids=True, usage=True, continuous_usage=False))
    with pytest.raises(TokenIdError) as assembled:
        assembler.add(event)
    assert counted.value.message == assembled.value.message


def test_prompt_ids_are_checked_only_for_clients_that_see_them() -> None:
    event = {
        "prompt_token_ids": [1, True],
        "choices": [{"index": 0, "delta": {"content": "x"}, "token_ids": [5]}],
    }
    with pytest.raises(TokenIdError):
        count_event_token_ids(event, "chat")
    assert count_event_token_ids(event, "chat", prompt_ids=False) == 1
