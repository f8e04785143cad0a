"""Shaping the engine request per dialect (DESIGN.md §4, PROTOCOL.md §6)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.protocol.dialects import Dialect, capabilities, for_engine
from narwhal.protocol.requests import Route, parse_request
from narwhal.protocol.upstream import upstream_body

MODEL = "m"


def shaped(dialect: Dialect, route: Route, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, **fields}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    return upstream_body(
        parse_request(json.dumps(body).encode(), route, model=MODEL), capabilities(dialect)
    )


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


def test_an_unstreamed_request_keeps_the_clients_stream_false_and_its_ids() -> None:
    """What vLLM answers only without streaming (prompt_logprobs): no stream options,
    no stream interval, and still the IDs that count its output."""
    request = parse_request(
        json.dumps({"model": MODEL, "prompt": "hi", "prompt_logprobs": 2}).encode(),
        "completion",
        model=MODEL,
    )
    body = upstream_body(request, capabilities("vllm"), streamed=False)
    assert body["stream"] is False and body["return_token_ids"] is True
    assert "stream_options" not in body and "stream_interval" not in body
    assert body["prompt_logprobs"] == 2


@pytest.mark.parametrize(
    ("prompt", "asked", "forced"),
    [
        ("hi", {}, True),  # the router puts the echoed text back (echo.py)
        ([5, 6, 7], {}, False),  # only the engine can write token IDs' text, without IDs
        ([[5, 6, 7]], {}, False),  # a batch of one is the same prompt
        ([5, 6, 7], {"return_token_ids": True}, True),  # asked: vLLM blanks it for them too
    ],
)
def test_an_echo_of_token_ids_goes_without_asking_for_ids(
    prompt: Any, asked: dict[str, Any], forced: bool
) -> None:
    body = upstream_body(
        parse_request(
            json.dumps({"model": MODEL, "prompt": prompt, "echo": True, **asked}).encode(),
            "completion",
            model=MODEL,
        ),
        capabilities("vllm"),
    )
    assert ("return_token_ids" in body) is forced
    assert body.get("return_token_ids", True) is True


@pytest.mark.parametrize("dialect", ["vllm", "sglang", "openai"])
def test_the_class_goes_as_priority_only_to_an_engine_that_schedules_by_it(
    dialect: Dialect,
) -> None:
    request = parse_request(
        json.dumps({"model": MODEL, "prompt": "hi", "priority": 7}).encode(),
        "completion",
        model=MODEL,
    )
    ordered = for_engine(dialect, schedules_by_priority=True)
    body = upstream_body(request, ordered, priority=2)
    # vLLM started with --scheduling-policy priority gets the class (the router's, not
    # the client's); other engines get the body as the client wrote it.
    assert body["priority"] == (2 if dialect == "vllm" else 7)
    assert upstream_body(request, for_engine(dialect), priority=2)["priority"] == 7
