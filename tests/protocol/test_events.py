"""Shared event helpers: JSON in and out, engine errors, usage."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.errors import UpstreamError
from narwhal.protocol.events import (
    EngineError,
    EngineOutputError,
    all_finished,
    decode_event,
    encode_event,
    encode_sse_event,
    engine_error,
    finish_reasons,
    is_usage_only,
    raise_for_engine_error,
)
from narwhal.protocol.sse import SSEDecoder, format_event
from narwhal.protocol.usage import computed_usage, event_usage, usage_tokens


def test_decode_and_encode_round_trip() -> None:
    raw = b'{"id":"c","choices":[{"index":0,"delta":{"content":"h\\u00e9"},"logprobs":-0.1}]}'
    event = decode_event(raw)
    assert event["choices"][0]["delta"]["content"] == "hé"
    assert decode_event(encode_event(event)) == event


def test_encode_sse_event_frames_like_the_decoder_reads() -> None:
    event = {"a": "line\nbreak\r", "b": [1, 2]}
    for name in (None, "sglext_ids"):
        frame = encode_sse_event(event, name)
        decoded = SSEDecoder().feed(frame)
        assert [(decode_event(e.data), e.event, e.raw) for e in decoded] == [(event, name, frame)]
        assert frame == format_event(encode_event(event), name)


@pytest.mark.parametrize("raw", [b"not json", b"[1,2]", b'"s"', b"", b'{"a":', b"\xff"])
def test_decode_rejects_what_is_not_a_json_object(raw: bytes) -> None:
    with pytest.raises(EngineOutputError, match="not a JSON object") as info:
        decode_event(raw)
    assert info.value.status == 502


def test_usage_only_and_finish_helpers() -> None:
    usage = {"prompt_tokens": 1}
    assert is_usage_only({"choices": [], "usage": usage})
    assert not is_usage_only({"choices": [], "usage": None})
    assert not is_usage_only({"choices": [{"index": 0}], "usage": usage})
    running = {"choices": [{"index": 0, "finish_reason": None}]}
    finished = {"choices": [{"index": 0, "finish_reason": "stop"}, {"finish_reason": "length"}]}
    assert finish_reasons(running) == [None]
    assert finish_reasons(finished) == ["stop", "length"]
    assert finish_reasons({"choices": []}) == []
    assert not all_finished(running)
    assert all_finished(finished)
    assert not all_finished({"choices": []})


@pytest.mark.parametrize(
    ("event", "status", "kind", "message"),
    [
        # vLLM >= 0.10.1 (PROTOCOL.md §3.1)
        (
            {"error": {"message": "m", "type": "BadRequestError", "param": None, "code": 400}},
            400,
            "BadRequestError",
            "engine error (400 BadRequestError): m",
        ),
        # SGLang streaming: its flat object nested under "error" (§3.3)
        (
            {"error": {"object": "error", "message": "m", "type": "x", "param": None, "code": 500}},
            500,
            "x",
            "engine error (500 x): m",
        ),
        # llama.cpp (§3.3)
        (
            {"error": {"code": 400, "message": "ctx", "type": "exceed_context_size_error"}},
            400,
            "exceed_context_size_error",
            "engine error (400 exceed_context_size_error): ctx",
        ),
        # transformers serve mid-stream (§3.3)
        ({"error": "boom"}, None, None, "engine error: boom"),
        # flat (SGLang non-streaming, vLLM < 0.10.1)
        (
            {"object": "error", "message": "m", "type": "BadRequestError", "code": 400},
            400,
            "BadRequestError",
            "engine error (400 BadRequestError): m",
        ),
        # OpenAI: string code, no status
        (
            {"error": {"message": "m", "type": "server_error", "code": "server_error"}},
            None,
            "server_error",
            "engine error (server_error): m",
        ),
        ({"error": {"code": 500}}, 500, None, "engine error (500): no message"),
        ({"error": {"message": {"detail": "x"}}}, None, None, 'engine error: {"detail":"x"}'),
    ],
)
def test_engine_error_shapes(
    event: dict[str, Any], status: int | None, kind: str | None, message: str
) -> None:
    error = engine_error(event)
    assert isinstance(error, EngineError)
    assert isinstance(error, UpstreamError)
    assert (error.engine_status, error.engine_type, error.message) == (status, kind, message)
    # Narwhal's envelope, never the engine's (integer code, engine type).
    assert error.envelope() == {
        "error": {
            "message": message,
            "type": "server_error",
            "param": None,
            "code": "upstream_error",
        }
    }
    with pytest.raises(EngineError) as raised:
        raise_for_engine_error(event)
    assert raised.value.message == message


def test_engine_error_bool_code_is_not_a_status() -> None:
    error = engine_error({"error": {"message": "m", "code": True}})
    assert error is not None and error.engine_status is None


def test_long_engine_messages_are_cut() -> None:
    error = engine_error({"error": "x" * 10_000})
    assert error is not None and len(error.message) < 1100


@pytest.mark.parametrize(
    "event",
    [
        {"id": "c", "choices": []},
        {"id": "c", "choices": [], "error": None},
        {"object": "chat.completion.chunk", "choices": []},
    ],
)
def test_normal_events_are_not_errors(event: dict[str, Any]) -> None:
    assert engine_error(event) is None
    raise_for_engine_error(event)  # passes


def test_usage_helpers() -> None:
    assert event_usage({"usage": None}) is None
    assert event_usage({}) is None
    assert event_usage({"usage": {"prompt_tokens": 1}}) == {"prompt_tokens": 1}
    with pytest.raises(EngineOutputError):
        event_usage({"usage": 5})
    assert computed_usage(3, 4) == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert usage_tokens({"prompt_tokens": 3, "completion_tokens": 4}) == (3, 4)
    assert usage_tokens({"prompt_tokens": True, "completion_tokens": -1}) == (None, None)
    assert usage_tokens({}) == (None, None)
