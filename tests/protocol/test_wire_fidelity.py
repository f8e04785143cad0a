"""The wire cases where Narwhal's own upstream request would change vLLM's answer, sans-IO:
the context-length refusal, the echo's text put back, and the unstreamed answer relayed
(end to end against `narwhal sim`: tests/e2e/test_wire.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.errors import ContextLengthExceeded
from narwhal.protocol.context import check_context_length
from narwhal.protocol.echo import echo_text, restore_echo
from narwhal.protocol.events import EngineOutputError
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.requests import CompletionRequest, Route, parse_request
from narwhal.protocol.tracker import OutputTracker
from narwhal.protocol.unstreamed import relay_answer, unstreamed_field

MODEL = "m"


def parsed(route: Route = "completion", **fields: Any) -> CompletionRequest:
    body: dict[str, Any] = {"model": MODEL, **fields}
    if route == "chat":
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
    else:
        body.setdefault("prompt", "hi")
    return parse_request(json.dumps(body).encode(), route, model=MODEL)


# --- context length ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "fields", "least", "param"),
    [
        ("completion", {}, 1024, "prompt"),  # no room for one output token
        ("chat", {}, 2000, "messages"),
        ("completion", {"max_tokens": 25}, 1000, "max_tokens"),
        ("chat", {"max_completion_tokens": 25, "max_tokens": 1}, 1000, "max_completion_tokens"),
    ],
)
def test_a_request_beyond_the_context_is_400_context_length_exceeded(
    route: Route, fields: dict[str, Any], least: int, param: str
) -> None:
    with pytest.raises(ContextLengthExceeded) as info:
        check_context_length(parsed(route, **fields), least=least, exact=True, limit=1024)
    error = info.value
    assert error.status == 400 and error.outcome == "invalid"
    envelope = error.envelope()["error"]
    assert envelope["type"] == "invalid_request_error"
    assert envelope["code"] == "context_length_exceeded" and envelope["param"] == param
    assert "maximum context length is 1024 tokens" in error.message
    assert str(least) in error.message


@pytest.mark.parametrize(("least", "cap"), [(1023, None), (1000, 24), (1, 1023)])
def test_a_request_that_fits_the_context_passes(least: int, cap: int | None) -> None:
    fields = {} if cap is None else {"max_tokens": cap}
    check_context_length(parsed(**fields), least=least, exact=True, limit=1024)


def test_an_estimate_is_held_to_its_lower_bound_and_says_so() -> None:
    with pytest.raises(ContextLengthExceeded) as info:
        check_context_length(parsed(max_tokens=100), least=1000, exact=False, limit=1024)
    assert "at least 1100 tokens" in info.value.message
    assert "at least 1000 (estimated)" in info.value.message


# --- echo --------------------------------------------------------------------------------


def test_the_echo_text_is_the_prompt_only_where_the_router_must_put_it_back() -> None:
    assert echo_text(parsed(prompt="Once", echo=True)) == "Once"
    assert echo_text(parsed(prompt=["Once"], echo=True)) == "Once"
    assert echo_text(parsed(prompt="Once")) is None
    assert echo_text(parsed(prompt="Once", echo=True, return_token_ids=True)) is None
    assert echo_text(parsed(prompt=[1, 2], echo=True)) is None
    assert echo_text(parsed("chat", echo=True)) is None


def test_the_echo_goes_in_front_of_each_echo_chunk_only() -> None:
    echo_chunk: dict[str, Any] = {
        "choices": [{"index": 0, "text": " upon", "prompt_token_ids": [1, 2], "token_ids": [3]}]
    }
    later: dict[str, Any] = {
        "choices": [{"index": 0, "text": " a", "prompt_token_ids": None, "token_ids": [4]}]
    }
    assert restore_echo(echo_chunk, "Once") is True
    assert echo_chunk["choices"][0]["text"] == "Once upon"
    assert restore_echo(later, "Once") is False
    assert later["choices"][0]["text"] == " a"


# --- unstreamed answers ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "fields", "field"),
    [
        ("completion", {"prompt_logprobs": 1}, "prompt_logprobs"),
        ("chat", {"prompt_logprobs": -1}, "prompt_logprobs"),
        ("completion", {"prompt_logprobs": 0}, None),  # vLLM streams that
        ("completion", {"use_beam_search": True}, "use_beam_search"),
        ("chat", {"use_beam_search": True}, None),
        ("completion", {}, None),
    ],
)
def test_what_vllm_answers_only_unstreamed(
    route: Route, fields: dict[str, Any], field: str | None
) -> None:
    assert unstreamed_field(parsed(route, **fields)) == field


def answer(**choice: Any) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "text": " upon a time",
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "prompt_logprobs": [None, {"2": {"logprob": -1.0}}],
                "prompt_token_ids": [1, 2],
                "token_ids": [3, 4, 5],
                **choice,
            }
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5},
    }


def vllm_exposure(**fields: Any) -> Exposure:
    defaults: dict[str, Any] = {"token_ids": False, "usage": False, "continuous_usage": False}
    return Exposure(**{**defaults, **fields}, null_ids=True)


def test_an_unstreamed_answer_is_counted_from_its_ids_and_shown_as_vllm_would() -> None:
    tracker = OutputTracker("completion", token_ids=True, prompt_ids=False, choices=1)
    relayed = relay_answer(answer(), tracker, vllm_exposure(), now=1.0)
    assert tracker.output_tokens() == (3, "token_ids") and tracker.finished
    choice = relayed["choices"][0]
    # IDs the client did not ask for are null, as in vLLM's own answer; the rest stays.
    assert choice["token_ids"] is None and choice["prompt_token_ids"] is None
    assert choice["prompt_logprobs"] == [None, {"2": {"logprob": -1.0}}]
    assert choice["finish_reason"] == "length" and "stop_reason" in choice
    assert relayed["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}


def test_an_unstreamed_answer_keeps_ids_for_clients_that_ask_and_puts_the_echo_back() -> None:
    tracker = OutputTracker("completion", token_ids=True, prompt_ids=True, choices=1)
    relayed = relay_answer(answer(), tracker, vllm_exposure(token_ids=True), now=1.0)
    assert relayed["choices"][0]["token_ids"] == [3, 4, 5]
    tracker = OutputTracker("completion", token_ids=True, prompt_ids=True, choices=1)
    echoed = relay_answer(answer(), tracker, vllm_exposure(echo=True, echo_text="Once"), 1.0)
    assert echoed["choices"][0]["text"] == "Once upon a time"
    assert echoed["choices"][0]["prompt_token_ids"] is None  # unstreamed: only when asked


@pytest.mark.parametrize(
    "choice", [{"finish_reason": None}, {"token_ids": None}, {"token_ids": [3, -1]}]
)
def test_an_unfinished_or_unaccountable_answer_fails_the_attempt(choice: dict[str, Any]) -> None:
    tracker = OutputTracker("completion", token_ids=True, choices=1)
    with pytest.raises(EngineOutputError):
        relay_answer(answer(**choice), tracker, vllm_exposure(), now=1.0)
