"""Request validation, sans-IO: the seed's request-level refusal rows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.errors import (
    InvalidRequest,
    InvalidSamplingWidth,
    ModelNotFound,
    NarwhalError,
    UnsupportedOption,
)
from narwhal.protocol.requests import Route, check_one_prompt, parse_request

MODEL = "m"


def chat(**fields: Any) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}
    return json.dumps(body).encode()


def completion(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "hi", **fields}).encode()


def refuse(raw: bytes, route: Route = "chat") -> NarwhalError:
    with pytest.raises(NarwhalError) as info:
        parse_request(raw, route, model=MODEL)
    return info.value


def test_valid_chat_keeps_every_field_for_the_engine() -> None:
    raw = chat(temperature=0.2, top_k=5, repetition_penalty=1.1, stream=True)
    request = parse_request(raw, "chat", model=MODEL)
    assert request.body["top_k"] == 5
    assert request.body["repetition_penalty"] == 1.1
    assert request.stream is True
    assert request.return_token_ids is False


@pytest.mark.parametrize(
    "raw",
    [b"{", b"", b"nul", b'{"model": "m",}', b"\xff\xfe", b'{"model": "m"} trailing'],
)
def test_invalid_json_is_400_without_param(raw: bytes) -> None:
    error = refuse(raw)
    assert type(error) is InvalidRequest
    assert error.status == 400
    assert error.envelope()["error"]["type"] == "invalid_request_error"
    assert error.param is None


@pytest.mark.parametrize("raw", [b"[]", b"1", b'"s"', b"null", b"true"])
def test_body_that_is_not_an_object_is_400(raw: bytes) -> None:
    assert refuse(raw).status == 400


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": 3}, "model"),
        ({"model": None}, "model"),
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [3]}, "messages.0"),
        ({"messages": [{"role": 1, "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
            "messages.0.content.0.text",
        ),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": {}}]},
            "messages.1.content",
        ),
        ({"stream": "yes"}, "stream"),
        ({"stream": True, "stream_options": []}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
        ({"n": "2"}, "n"),
        ({"n": True}, "n"),
        ({"n": 1.0}, "n"),
        ({"n": 0}, "n"),
        ({"best_of": []}, "best_of"),
        ({"max_tokens": "10"}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 2.5}, "max_completion_tokens"),
        ({"return_token_ids": "true"}, "return_token_ids"),
        ({"tools": {}}, "tools"),
        ({"tools": [1]}, "tools.0"),
        ({"tools": [{"type": "function", "function": {"name": 3}}]}, "tools.0.function.name"),
        ({"tool_choice": 3}, "tool_choice"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {}}}, "tool_choice.function.name"),
        ({"modalities": "text"}, "modalities"),
        ({"modalities": [1]}, "modalities.0"),
        ({"audio": "alloy"}, "audio"),
        ({"logprobs": 1}, "logprobs"),
        ({"top_logprobs": "3"}, "top_logprobs"),
        ({"top_logprobs": 99}, "top_logprobs"),
    ],
)
def test_wrong_type_in_an_interpreted_chat_field_names_it(
    fields: dict[str, Any], param: str
) -> None:
    error = refuse(chat(**fields))
    assert error.status == 400
    assert error.envelope()["error"]["type"] == "invalid_request_error"
    assert error.param == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": None}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["a", 5]}, "prompt.1"),
        ({"prompt": [[1, 2], [True]]}, "prompt.1"),
        ({"echo": "yes"}, "echo"),
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"best_of": "3"}, "best_of"),
    ],
)
def test_wrong_type_in_an_interpreted_completion_field_names_it(
    fields: dict[str, Any], param: str
) -> None:
    error = refuse(completion(**fields), "completion")
    assert error.status == 400
    assert error.param == param


@pytest.mark.parametrize("prompt", ["text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_every_openai_prompt_form_is_accepted(prompt: Any) -> None:
    parse_request(completion(prompt=prompt), "completion", model=MODEL)


@pytest.mark.parametrize("prompt", ["text", ["a"], [1, 2, 3], [[1, 2]]])
def test_one_prompt_in_any_form_is_served(prompt: Any) -> None:
    """A flat list of IDs is one prompt, and so is a batch of one."""
    check_one_prompt(parse_request(completion(prompt=prompt), "completion", model=MODEL))


@pytest.mark.parametrize("prompt", [["a", "b"], [[1, 2], [3]], ["a", [1, 2]]])
def test_a_batch_of_prompts_is_a_400_naming_prompt(prompt: Any) -> None:
    """vLLM answers a batch with one choice per prompt; the router sizes, projects and
    places one prompt per request, so it refuses a batch itself, before any engine work,
    rather than blaming the engines for an answer it cannot relay."""
    parsed = parse_request(completion(prompt=prompt), "completion", model=MODEL)
    with pytest.raises(InvalidRequest) as info:
        check_one_prompt(parsed)
    error = info.value
    assert error.status == 400 and error.outcome == "invalid"
    assert error.param == "prompt" and error.code is None
    assert f"holds {len(prompt)} prompts" in error.message


def test_other_model_is_404_model_not_found() -> None:
    error = refuse(chat(model="other"))
    assert isinstance(error, ModelNotFound)
    assert error.status == 404
    assert error.envelope()["error"]["code"] == "model_not_found"
    assert error.param == "model"


def test_type_errors_come_before_the_model_check() -> None:
    assert refuse(chat(model="other", stream="x")).status == 400


@pytest.mark.parametrize(
    ("field", "route"),
    [("n", "chat"), ("n", "completion"), ("best_of", "completion"), ("best_of", "chat")],
)
def test_sampling_width_above_one_is_refused(field: str, route: Route) -> None:
    raw = chat(**{field: 2}) if route == "chat" else completion(**{field: 3})
    error = refuse(raw, route)
    assert isinstance(error, InvalidSamplingWidth)
    assert error.status == 400
    assert error.message == "Invalid sampling width"
    assert error.param == field


def test_sampling_width_of_one_is_fine() -> None:
    parse_request(chat(n=1, best_of=1), "chat", model=MODEL)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"modalities": ["audio"]}, "modalities"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools.0.type"),
        (
            {"tools": [{"type": "function", "function": {"name": "f"}}, {"type": "web_search"}]},
            "tools.1.type",
        ),
        ({"tool_choice": {"type": "custom", "custom": {"name": "x"}}}, "tool_choice.type"),
    ],
)
def test_unsupported_non_streaming_options_name_the_option(
    fields: dict[str, Any], param: str
) -> None:
    error = refuse(chat(**fields))
    assert isinstance(error, UnsupportedOption)
    assert error.status == 400
    assert error.envelope()["error"]["type"] == "invalid_request_error"
    assert error.param == param


def test_audio_output_may_stream() -> None:
    request = parse_request(
        chat(stream=True, modalities=["text", "audio"], audio={"voice": "alloy"}),
        "chat",
        model=MODEL,
    )
    assert request.stream


def test_text_modality_and_function_tools_are_fine() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    request = parse_request(
        chat(modalities=["text"], tools=tools, tool_choice="auto"), "chat", model=MODEL
    )
    assert request.body["tools"] == tools


def test_stream_options_without_stream_is_400() -> None:
    assert refuse(chat(stream_options={"include_usage": True})).param == "stream_options"


def test_stream_flags_are_read() -> None:
    request = parse_request(
        chat(
            stream=True,
            stream_options={"include_usage": True},
            return_token_ids=True,
            max_completion_tokens=7,
        ),
        "chat",
        model=MODEL,
    )
    assert request.include_usage and not request.continuous_usage
    assert request.return_token_ids
    assert request.max_tokens == 7


def test_nulls_are_absent_values() -> None:
    request = parse_request(
        chat(stream=None, n=None, max_tokens=None, tools=None, audio=None, stream_options=None),
        "chat",
        model=MODEL,
    )
    assert request.stream is False and request.max_tokens is None


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_output_caps_are_bounded(field: str) -> None:
    """A 400-digit max_tokens passed the parser and overflowed placement's float (a 500)."""
    assert parse_request(chat(**{field: 2**31 - 1}), "chat", model=MODEL).max_tokens == 2**31 - 1
    for value in (2**31, 2**63, 10**400):
        error = refuse(chat(**{field: value}))
        assert error.status == 400
        assert error.param == field
        assert len(error.message) < 200


@pytest.mark.parametrize(
    "raw",
    [
        chat(model="m" * 500_000),
        chat(tool_choice="x" * 100_000),
        chat(top_logprobs=10**400),
        chat(tools=[{"type": "y" * 100_000}]),
    ],
)
def test_a_refusal_does_not_echo_a_huge_value(raw: bytes) -> None:
    assert len(refuse(raw).message) < 400
