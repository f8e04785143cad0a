"""Shaping the engine request per dialect (DESIGN.md §4, PROTOCOL.md §6)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.protocol.dialects import Dialect
from narwhal.protocol.requests import Route, parse_request
from narwhal.protocol.upstream import upstream_body

MODEL = "m"


def shaped(dialect: Dialect, route: Route, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, **fields}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    return upstream_body(parse_request(json.dumps(body).encode(), route, model=MODEL), dialect)


@pytest.mark.parametrize("route", ["chat", "completion"])
@pytest.mark.parametrize("asked", [{}, {"return_token_ids": False, "stream": False}])
def test_vllm_is_always_asked_for_a_stream_with_ids_and_usage(
    route: Route, asked: dict[str, Any]
) -> None:
    body = shaped("vllm", route, **asked)
    assert body["stream"] is True and body["return_token_ids"] is True
    assert body["stream_interval"] == 1
    assert body["stream_options"] == {"include_usage": True}


def test_sglang_completions_give_ids_per_event() -> None:
    body = shaped("sglang", "completion", stream_interval=4)
    assert body["return_token_ids"] is True and "stream_interval" not in body


def test_sglang_chat_ids_come_in_sglext_for_clients_that_ask() -> None:
    """SGLang answers 400 to return_token_ids on a streamed chat (PROTOCOL.md §6.1)."""
    asked = shaped("sglang", "chat", return_token_ids=True)
    assert "return_token_ids" not in asked
    assert asked["return_input_ids_in_sglext"] is True
    assert asked["return_output_ids_in_sglext"] is True
    plain = shaped("sglang", "chat")
    assert not any(key.endswith("_in_sglext") for key in plain)


def test_openai_engines_get_no_vllm_fields() -> None:
    body = shaped("openai", "chat", return_token_ids=True, stream_interval=2)
    assert "return_token_ids" not in body and "stream_interval" not in body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
