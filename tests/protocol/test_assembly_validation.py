"""The assembler's 502s (seed: "returns HTTP 502 for unsupported choice or chat-delta
fields that carry a value, including audio, annotations, and custom tool output, and
for malformed supported fields"), and what is *not* an error."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.errors import UpstreamError
from narwhal.protocol.assembly import Assembler
from narwhal.protocol.events import EngineError, EngineOutputError, Route
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.usage import MAX_TOKEN_COUNT

EXPOSURE = Exposure(token_ids=True, usage=True, continuous_usage=False)
EMPTY_VALUES = [None, "", [], {}]


def run(choice: dict[str, Any], route: Route = "chat", **top: Any) -> dict[str, Any]:
    """Assemble one event holding `choice` plus a finishing event."""
    assembler = Assembler(route, EXPOSURE)
    assembler.add({"id": "x", "choices": [choice], **top})
    assembler.add({"id": "x", "choices": [{"index": 0, "finish_reason": "stop"}]})
    return assembler.result(prompt_tokens=1, completion_tokens=1)


def chat_choice(**delta: Any) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "finish_reason": None}


def tool(**fields: Any) -> dict[str, Any]:
    return chat_choice(tool_calls=[{"index": 0, "id": "t", "function": {"name": "f"}, **fields}])


def assert_502(choice: dict[str, Any], match: str, route: Route = "chat") -> None:
    with pytest.raises(EngineOutputError, match=match) as info:
        run(choice, route)
    assert info.value.status == 502
    assert isinstance(info.value, UpstreamError)


# --- Unsupported fields with a value ------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("audio", {"id": "a1", "data": "UklGRg==", "transcript": "hi"}),
        ("annotations", [{"type": "url_citation", "url_citation": {"url": "https://x"}}]),
        ("name", "bot"),
        ("custom_field", 1),
        ("tool_call_id", "t"),
    ],
)
def test_unsupported_delta_field_with_value(key: str, value: Any) -> None:
    assert_502(chat_choice(**{key: value}), f"unsupported delta field {key!r}")


@pytest.mark.parametrize("value", EMPTY_VALUES, ids=repr)
@pytest.mark.parametrize("key", ["audio", "annotations", "custom_field"])
def test_unsupported_delta_field_null_or_empty_is_fine(key: str, value: Any) -> None:
    result = run(chat_choice(content="a", **{key: value}))
    assert result["choices"][0]["message"] == {"role": "assistant", "content": "a"}


def test_custom_tool_output_is_a_502() -> None:
    custom = {"index": 0, "id": "c", "type": "custom", "custom": {"name": "f", "input": "x"}}
    assert_502(chat_choice(tool_calls=[custom]), "unsupported tool call type 'custom'")


@pytest.mark.parametrize("value", ["", "tool", 1])
def test_tool_call_type_other_than_function_is_a_502(value: Any) -> None:
    assert_502(tool(type=value), "unsupported tool call type")


def test_unsupported_tool_call_field_with_value() -> None:
    assert_502(tool(custom={"input": "x"}), "unsupported tool call field 'custom'")


@pytest.mark.parametrize("value", EMPTY_VALUES, ids=repr)
def test_unsupported_tool_call_field_null_or_empty_is_fine(value: Any) -> None:
    result = run(tool(custom=value, type=None))
    assert result["choices"][0]["message"]["tool_calls"][0]["id"] == "t"


def test_unsupported_function_field() -> None:
    choice = chat_choice(tool_calls=[{"index": 0, "function": {"name": "f", "strict": True}}])
    assert_502(choice, "unsupported tool call function field 'strict'")
    choice = chat_choice(tool_calls=[{"index": 0, "id": "t", "function": {"name": "f", "x": ""}}])
    assert run(choice)["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "f"


def test_unsupported_function_call_field() -> None:
    assert_502(chat_choice(function_call={"name": "f", "x": 1}), "function_call field 'x'")


@pytest.mark.parametrize("route", ["chat", "completion"])
def test_unsupported_choice_field_with_value(route: Route) -> None:
    choice: dict[str, Any] = {"index": 0, "hidden_states": [[0.1, 0.2]]}
    assert_502(choice, "unsupported choice field 'hidden_states'", route)


@pytest.mark.parametrize("value", EMPTY_VALUES, ids=repr)
@pytest.mark.parametrize("route", ["chat", "completion"])
def test_unsupported_choice_field_null_or_empty_is_fine(route: Route, value: Any) -> None:
    run({"index": 0, "hidden_states": value, "message": value}, route)


def test_the_other_routes_output_field_is_unsupported() -> None:
    assert_502({"index": 0, "text": "hi"}, "unsupported choice field 'text'", "chat")
    assert_502({"index": 0, "delta": {"content": "hi"}}, "choice field 'delta'", "completion")
    run({"index": 0, "text": None, "delta": {}}, "chat")
    run({"index": 0, "text": "", "delta": None}, "completion")


def test_unsupported_logprobs_key() -> None:
    choice = chat_choice(content="a")
    choice["logprobs"] = {"content": [], "tokens": ["a"]}
    assert_502(choice, "unsupported logprobs field 'tokens'")
    choice["logprobs"] = {"content": [], "tokens": []}
    run(choice)


# --- Malformed supported fields -----------------------------------------------------


@pytest.mark.parametrize("key", ["content", "reasoning", "reasoning_content", "refusal"])
@pytest.mark.parametrize("value", [1, ["a"], {"text": "a"}, True])
def test_delta_text_that_is_not_a_string(key: str, value: Any) -> None:
    assert_502(chat_choice(**{key: value}), f"malformed delta.{key}")


def test_role_that_is_not_a_string() -> None:
    assert_502(chat_choice(role=1), "malformed delta.role")


@pytest.mark.parametrize("value", [{"index": 0}, "call", 1])
def test_tool_calls_not_a_list(value: Any) -> None:
    assert_502(chat_choice(tool_calls=value), "malformed delta.tool_calls")


@pytest.mark.parametrize("value", [["call"], [1], [None], [[]]])
def test_tool_calls_not_a_list_of_objects(value: Any) -> None:
    assert_502(chat_choice(tool_calls=value), "malformed delta.tool_calls")


@pytest.mark.parametrize("index", [None, "0", 1.0, True, -1])
def test_tool_call_index_not_an_int(index: Any) -> None:
    choice = chat_choice(tool_calls=[{"index": index, "id": "t", "function": {"name": "f"}}])
    assert_502(choice, "malformed tool call index")


def test_tool_call_missing_index() -> None:
    assert_502(chat_choice(tool_calls=[{"id": "t", "function": {"name": "f"}}]), "tool call index")


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"id": 7}, "tool call id"),
        ({"function": "f"}, "tool call function"),
        ({"function": {"name": ["f"]}}, "tool call function name"),
        ({"function": {"name": "f", "arguments": {"a": 1}}}, "tool call function arguments"),
    ],
)
def test_malformed_tool_call_fields(fields: dict[str, Any], match: str) -> None:
    choice = chat_choice(tool_calls=[{"index": 0, **fields}])
    assert_502(choice, f"malformed {match}")


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("f", "malformed delta.function_call"),
        ({"name": 1}, "function_call name"),
        ({"arguments": [1]}, "function_call arguments"),
    ],
)
def test_malformed_function_call(value: Any, match: str) -> None:
    assert_502(chat_choice(function_call=value), match)


@pytest.mark.parametrize("route", ["chat", "completion"])
@pytest.mark.parametrize("index", [None, "0", 0.0, False, -1])
def test_choice_index_not_an_int(route: Route, index: Any) -> None:
    assert_502({"index": index, "finish_reason": "stop"}, "malformed choice index", route)


def test_delta_not_an_object() -> None:
    assert_502({"index": 0, "delta": "hi"}, "malformed delta")
    assert_502({"index": 0, "delta": [{"content": "hi"}]}, "malformed delta")


def test_completion_text_not_a_string() -> None:
    assert_502({"index": 0, "text": 3}, "malformed text", "completion")
    assert_502({"index": 0, "text": ["a"]}, "malformed text", "completion")


@pytest.mark.parametrize("value", [1, True, ["stop"], {"type": "stop"}])
def test_finish_reason_not_a_string(value: Any) -> None:
    assert_502({"index": 0, "finish_reason": value}, "malformed finish_reason")


@pytest.mark.parametrize("value", [True, 1.5, ["</s>"], {"id": 2}])
def test_stop_reason_of_the_wrong_type(value: Any) -> None:
    assert_502({"index": 0, "stop_reason": value}, "malformed stop_reason")


@pytest.mark.parametrize(
    ("logprobs", "match"),
    [
        ([{"token": "a"}], "malformed logprobs"),
        ("a", "malformed logprobs"),
        ({"content": {"token": "a"}}, "malformed logprobs.content"),
        ({"content": ["a"]}, "malformed logprobs.content"),
        ({"content": [None]}, "malformed logprobs.content"),
        ({"refusal": "no"}, "malformed logprobs.refusal"),
    ],
)
def test_chat_logprobs_of_the_wrong_shape(logprobs: Any, match: str) -> None:
    choice = chat_choice(content="a")
    choice["logprobs"] = logprobs
    assert_502(choice, match)


@pytest.mark.parametrize(
    ("logprobs", "match"),
    [
        ({"tokens": "a"}, "logprobs.tokens"),
        ({"tokens": [1]}, "logprobs.tokens"),
        ({"text_offset": ["0"]}, "logprobs.text_offset"),
        ({"text_offset": [0.5]}, "logprobs.text_offset"),
        ({"token_logprobs": ["-1"]}, "logprobs.token_logprobs"),
        ({"top_logprobs": [["a", -1]]}, "logprobs.top_logprobs"),
        ({"content": [1]}, "logprobs.content"),
    ],
)
def test_completion_logprobs_of_the_wrong_shape(logprobs: Any, match: str) -> None:
    assert_502({"index": 0, "text": "a", "logprobs": logprobs}, match, "completion")


def test_choices_and_choice_of_the_wrong_type() -> None:
    assembler = Assembler("chat", EXPOSURE)
    with pytest.raises(EngineOutputError, match="malformed choices"):
        assembler.add({"choices": {"index": 0}})
    with pytest.raises(EngineOutputError, match="malformed choice"):
        assembler.add({"choices": ["x"]})


def test_usage_not_an_object() -> None:
    with pytest.raises(EngineOutputError, match="usage that is not an object"):
        Assembler("chat", EXPOSURE).add({"choices": [], "usage": [3, 4]})


def test_usage_counts_within_bounds_and_nulls_are_kept_as_sent() -> None:
    usage = {
        "prompt_tokens": MAX_TOKEN_COUNT,
        "completion_tokens": 0,
        "total_tokens": None,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": None},
        "completion_tokens_details": None,
        "engine_note": "not a count: not checked",
    }
    assembler = Assembler("chat", EXPOSURE)
    assembler.add({"id": "x", "choices": [chat_choice(content="a")]})
    assembler.add({"id": "x", "choices": [{"index": 0, "finish_reason": "stop"}]})
    assembler.add({"id": "x", "choices": [], "usage": usage})
    assert assembler.result(prompt_tokens=1, completion_tokens=1)["usage"] == usage


def test_malformed_ids_when_kept() -> None:
    with pytest.raises(EngineOutputError, match="Boolean"):
        run({"index": 0, "delta": {"content": "a"}, "token_ids": [True]})
    with pytest.raises(EngineOutputError, match="not a list"):
        run({"index": 0, "delta": {}}, prompt_token_ids="1 2 3")


# --- Engine errors in the stream ----------------------------------------------------


@pytest.mark.parametrize(
    ("event", "match"),
    [
        (
            {"error": {"message": "EngineCore died", "type": "InternalServerError", "code": 500}},
            r"engine error \(500 InternalServerError\): EngineCore died",
        ),
        (
            {
                "error": {
                    "object": "error",
                    "message": "bad",
                    "type": "BadRequestError",
                    "code": 400,
                }
            },
            r"engine error \(400 BadRequestError\): bad",
        ),
        ({"error": "CUDA out of memory"}, r"engine error: CUDA out of memory"),
        ({"object": "error", "message": "flat", "code": 503}, r"engine error \(503\): flat"),
    ],
)
def test_engine_error_event_raises_mapped_error(event: dict[str, Any], match: str) -> None:
    assembler = Assembler("chat", EXPOSURE)
    assembler.add({"id": "x", "choices": [chat_choice(content="partial")]})
    with pytest.raises(EngineError, match=match) as info:
        assembler.add(event)
    assert info.value.status == 502
    assert info.value.envelope()["error"]["code"] == "upstream_error"


# --- Accepted as engines really send it ---------------------------------------------


def test_vllm_nulls_and_metadata_are_accepted() -> None:
    choice = {
        "index": 0,
        "delta": {"role": None, "content": "a", "tool_calls": None, "reasoning": None},
        "logprobs": None,
        "finish_reason": None,
        "stop_reason": None,
        "token_ids": [1],
        "weight_versions": None,
        "routed_experts": None,
        "matched_stop": None,
    }
    result = run(choice, kv_transfer_params=None, prompt_token_ids=None, metrics=None, error=None)
    assert result["choices"][0]["message"] == {
        "role": "assistant",
        "content": "a",
        "reasoning": None,
        "tool_calls": None,
    }
    assert "error" not in result  # a null error key is no metadata


def test_completion_metadata_is_accepted() -> None:
    choice = {
        "index": 0,
        "text": "a",
        "prompt_logprobs": [None, {"1": {"logprob": -1.0}}],
        "weight_versions": ["w"],
        "matched_stop": None,
    }
    result = run(choice, "completion")
    assert result["choices"][0]["prompt_logprobs"] == [None, {"1": {"logprob": -1.0}}]
    assert result["choices"][0]["weight_versions"] == ["w"]
