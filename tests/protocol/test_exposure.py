"""The exposure rules: what a streaming client sees of the engine's events."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

from narwhal.protocol.events import decode_event
from narwhal.protocol.exposure import (
    Exposed,
    Exposure,
    apply_exposure,
    carries_nothing,
    expose_event,
    needs_rewrite,
)
from narwhal.protocol.sse import SSEDecoder, is_done
from tests.protocol.streams import ALL, SGLANG_CHAT, VLLM_CHAT, VLLM_COMPLETION

NOTHING = Exposure(token_ids=False, usage=False, continuous_usage=False)
IDS = Exposure(token_ids=True, usage=False, continuous_usage=False)
USAGE = Exposure(token_ids=False, usage=True, continuous_usage=False)
IDS_USAGE = Exposure(token_ids=True, usage=True, continuous_usage=False)
EVERYTHING = Exposure(token_ids=True, usage=True, continuous_usage=True)
ALL_EXPOSURES = [
    Exposure(*flags, null_ids=null_ids)
    for flags in itertools.product((False, True), repeat=3)
    for null_ids in (False, True)
]

USAGE_OBJ = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def chat_role() -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}],
        "prompt_token_ids": [1, 2, 3],
        "prompt_text": None,
    }


def chat_content(**extra: Any) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [
            {"index": 0, "delta": {"content": "Hi"}, "finish_reason": None, "token_ids": [9]}
        ],
        "kv_transfer_params": None,
        **extra,
    }


def chat_finish(**extra: Any) -> dict[str, Any]:
    event = chat_content(**extra)
    event["choices"][0]["finish_reason"] = "stop"
    return event


def completion_first(**extra: Any) -> dict[str, Any]:
    return {
        "id": "cmpl",
        "object": "text_completion",
        "choices": [
            {
                "index": 0,
                "text": " Paris",
                "finish_reason": None,
                "prompt_token_ids": [7, 8],
                "token_ids": [9],
                "weight_versions": None,
            }
        ],
        **extra,
    }


def usage_only() -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": dict(USAGE_OBJ)}


def sglext_chunk() -> dict[str, Any]:
    return {"id": "s", "choices": [], "sglext": {"input_ids": [1], "output_ids": [[2, 3]]}}


# --- needs_rewrite ------------------------------------------------------------------


def test_needs_rewrite_only_false_when_nothing_can_be_removed() -> None:
    assert needs_rewrite(EVERYTHING) is False
    for exposure in ALL_EXPOSURES:
        # (What the engine writes for unasked fields matters only when something is unasked.)
        asked_everything = exposure.token_ids and exposure.usage and exposure.continuous_usage
        assert needs_rewrite(exposure) is not asked_everything


@pytest.mark.parametrize(
    "event",
    [chat_role(), chat_content(usage=USAGE_OBJ), usage_only(), sglext_chunk(), completion_first()],
)
def test_everything_exposed_leaves_every_event_alone(event: dict[str, Any]) -> None:
    before = copy.deepcopy(event)
    assert apply_exposure(event, EVERYTHING) is Exposed.UNCHANGED
    assert event == before


# --- token IDs ----------------------------------------------------------------------


def test_chat_without_token_ids() -> None:
    role = chat_role()
    assert apply_exposure(role, USAGE) is Exposed.CHANGED
    assert "prompt_token_ids" not in role
    assert role["prompt_text"] is None  # not an ID list: stays as sent
    content = chat_content()
    assert apply_exposure(content, USAGE) is Exposed.CHANGED
    assert content == {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}],
        "kv_transfer_params": None,
    }


def test_chat_null_ids_are_removed_too() -> None:
    event = chat_content()
    event["choices"][0]["token_ids"] = None
    assert apply_exposure(event, NOTHING) is Exposed.CHANGED
    assert "token_ids" not in event["choices"][0]


def test_chat_with_token_ids_keeps_them() -> None:
    role, content = chat_role(), chat_content()
    assert apply_exposure(role, IDS) is Exposed.UNCHANGED
    assert apply_exposure(content, IDS) is Exposed.UNCHANGED
    assert role["prompt_token_ids"] == [1, 2, 3]
    assert content["choices"][0]["token_ids"] == [9]


def test_completion_without_token_ids() -> None:
    event = completion_first()
    assert expose_event(event, NOTHING) is event
    assert event["choices"][0] == {
        "index": 0,
        "text": " Paris",
        "finish_reason": None,
        "weight_versions": None,
    }


def test_completion_with_token_ids_keeps_them() -> None:
    event = completion_first()
    assert apply_exposure(event, IDS) is Exposed.UNCHANGED
    assert event["choices"][0]["prompt_token_ids"] == [7, 8]


def test_sglang_non_streaming_id_lists_are_removed() -> None:
    event = {"choices": [{"index": 0, "response_token_ids": [1], "prompt_token_ids": [2]}]}
    assert apply_exposure(event, NOTHING) is Exposed.CHANGED
    assert event == {"choices": [{"index": 0}]}


def test_sglext_chunk_is_dropped_without_token_ids() -> None:
    assert expose_event(sglext_chunk(), NOTHING) is None
    assert expose_event(sglext_chunk(), USAGE) is None
    assert apply_exposure(sglext_chunk(), IDS) is Exposed.UNCHANGED


def test_sglext_is_removed_from_an_event_that_carries_more() -> None:
    event = usage_only()
    event["sglext"] = {"output_ids": [[1]]}
    assert apply_exposure(event, USAGE) is Exposed.CHANGED
    assert event == usage_only()


# --- usage --------------------------------------------------------------------------


@pytest.mark.parametrize("exposure", [NOTHING, IDS])
def test_usage_only_chunk_dropped_without_usage(exposure: Exposure) -> None:
    assert expose_event(usage_only(), exposure) is None
    assert apply_exposure(usage_only(), exposure) is Exposed.DROPPED


@pytest.mark.parametrize("exposure", [USAGE, IDS_USAGE, EVERYTHING])
def test_usage_only_chunk_kept_with_usage(exposure: Exposure) -> None:
    event = usage_only()
    assert apply_exposure(event, exposure) is Exposed.UNCHANGED
    assert event["usage"] == USAGE_OBJ


def test_usage_on_the_finishing_chunk_removed_without_usage() -> None:
    # transformers serve / openai dialect (PROTOCOL.md §6.3): usage rides the finish.
    event = chat_finish(usage=dict(USAGE_OBJ))
    assert apply_exposure(event, IDS) is Exposed.CHANGED
    assert "usage" not in event
    assert event["choices"][0]["finish_reason"] == "stop"


def test_usage_on_the_finishing_chunk_kept_with_usage() -> None:
    event = chat_finish(usage=dict(USAGE_OBJ))
    assert apply_exposure(event, IDS_USAGE) is Exposed.UNCHANGED
    assert event["usage"] == USAGE_OBJ


def test_continuous_usage_removed_without_continuous_usage() -> None:
    role = chat_role()
    role["usage"] = dict(USAGE_OBJ)
    content = chat_content(usage=dict(USAGE_OBJ))
    for event in (role, content):
        assert apply_exposure(event, IDS_USAGE) is Exposed.CHANGED
        assert "usage" not in event


def test_continuous_usage_kept_with_continuous_usage() -> None:
    content = chat_content(usage=dict(USAGE_OBJ))
    exposure = Exposure(token_ids=True, usage=True, continuous_usage=True)
    assert apply_exposure(content, exposure) is Exposed.UNCHANGED
    assert content["usage"] == USAGE_OBJ


def test_continuous_usage_removed_without_usage_at_all() -> None:
    # continuous_usage_stats means nothing without include_usage (PROTOCOL.md §2.2).
    content = chat_content(usage=dict(USAGE_OBJ))
    exposure = Exposure(token_ids=True, usage=False, continuous_usage=True)
    assert apply_exposure(content, exposure) is Exposed.CHANGED
    assert "usage" not in content


def test_openai_null_usage_on_every_chunk() -> None:
    # OpenAI sends "usage": null on every other chunk under include_usage (§2.5).
    event = chat_content(usage=None)
    assert apply_exposure(event, IDS_USAGE) is Exposed.UNCHANGED
    assert event["usage"] is None
    event = chat_content(usage=None)
    assert apply_exposure(event, IDS) is Exposed.CHANGED
    assert "usage" not in event


def test_sglang_null_usage_stays_for_every_client() -> None:
    # SGLang writes "usage": null on every chunk whatever was asked (§6.1): a client
    # that did not ask for usage gets that null from SGLang itself.
    sglang = Exposure(token_ids=False, usage=False, continuous_usage=False, null_usage=True)
    event = chat_content(usage=None)
    assert apply_exposure(event, sglang) is Exposed.CHANGED  # its IDs went
    assert "usage" in event and event["usage"] is None
    event = chat_content(usage=None)
    with_ids = Exposure(token_ids=True, usage=False, continuous_usage=False, null_usage=True)
    assert apply_exposure(event, with_ids) is Exposed.UNCHANGED
    # Its usage itself still goes, and the usage-only chunk with it.
    assert expose_event(usage_only(), sglang) is None
    finishing = chat_content(usage=dict(USAGE_OBJ))
    assert apply_exposure(finishing, sglang) is Exposed.CHANGED
    assert "usage" not in finishing


def test_completion_usage_rules() -> None:
    finishing = completion_first(usage=dict(USAGE_OBJ))
    finishing["choices"][0]["finish_reason"] = "length"
    assert apply_exposure(finishing, IDS_USAGE) is Exposed.UNCHANGED
    running = completion_first(usage=dict(USAGE_OBJ))
    assert apply_exposure(running, IDS_USAGE) is Exposed.CHANGED
    assert "usage" not in running
    final = {"id": "cmpl", "object": "text_completion", "choices": [], "usage": USAGE_OBJ}
    assert expose_event(final, IDS) is None


def test_every_choice_must_have_finished_to_keep_usage() -> None:
    event = {
        "choices": [
            {"index": 0, "delta": {}, "finish_reason": "stop"},
            {"index": 1, "delta": {"content": "x"}, "finish_reason": None},
        ],
        "usage": dict(USAGE_OBJ),
    }
    assert apply_exposure(event, IDS_USAGE) is Exposed.CHANGED
    assert "usage" not in event


# --- events that only carried IDs ----------------------------------------------------


def id_only(**choice: Any) -> dict[str, Any]:
    """vLLM (0.13 on) while its parser holds text back: an empty delta with the IDs."""
    fields = {"delta": {}, "logprobs": None, "finish_reason": None, "token_ids": [11]}
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, **fields, **choice}],
        "kv_transfer_params": None,
    }


@pytest.mark.parametrize("exposure", [NOTHING, USAGE])
def test_an_event_that_only_carried_ids_is_dropped_without_them(exposure: Exposure) -> None:
    assert apply_exposure(id_only(), exposure) is Exposed.DROPPED
    # vLLM 0.11.1 to 0.15.1 writes reasoning_content: null on every delta.
    assert apply_exposure(id_only(delta={"reasoning_content": None}), exposure) is Exposed.DROPPED
    completion = {"choices": [{"index": 0, "text": "", "token_ids": [4], "stop_reason": None}]}
    assert apply_exposure(completion, exposure) is Exposed.DROPPED
    assert apply_exposure(id_only(), IDS) is Exposed.UNCHANGED


@pytest.mark.parametrize(
    "choice",
    [
        {"finish_reason": "stop"},  # the finishing chunk
        {"logprobs": {"content": [{"token": "a", "logprob": -1.0}]}},  # vLLM sends these too
        {"delta": {"role": "assistant"}},
        {"delta": {"content": ""}},
        {"delta": {"tool_calls": []}},
        {"annotations": []},  # a value Narwhal does not know is still a value
    ],
)
def test_an_event_with_anything_else_is_kept(choice: dict[str, Any]) -> None:
    assert apply_exposure(id_only(**choice), NOTHING) is Exposed.CHANGED


def test_only_events_that_had_ids_are_dropped_for_it() -> None:
    """An engine's own empty event (no ID list was removed) is not Narwhal's to drop,
    nor is one that keeps continuous usage the client asked for."""
    event = id_only()
    del event["choices"][0]["token_ids"]
    assert apply_exposure(event, NOTHING) is Exposed.UNCHANGED
    continuous = Exposure(token_ids=False, usage=True, continuous_usage=True)
    assert apply_exposure(id_only(), continuous) is Exposed.DROPPED
    with_usage = id_only()
    with_usage["usage"] = dict(USAGE_OBJ)
    assert apply_exposure(dict(with_usage, choices=[dict(with_usage["choices"][0])]),
                          NOTHING) is Exposed.DROPPED  # fmt: skip
    assert apply_exposure(with_usage, continuous) is Exposed.CHANGED


# --- nothing else changes -----------------------------------------------------------


def test_error_events_are_never_dropped() -> None:
    event = {"error": {"message": "boom", "code": 500}, "usage": None}
    assert expose_event(event, NOTHING) == {"error": {"message": "boom", "code": 500}}


@pytest.mark.parametrize("exposure", ALL_EXPOSURES, ids=repr)
@pytest.mark.parametrize("stream", ALL, ids=lambda s: s.name)
def test_exposure_only_removes(stream: Any, exposure: Exposure) -> None:
    """Over whole recorded streams: each output event is the engine's event minus the
    removed keys (or, with `null_ids`, with its ID lists null), in the same order;
    nothing added, nothing renamed."""
    for sse in SSEDecoder().feed(stream.body):
        if is_done(sse):
            continue
        original = decode_event(sse.data)
        if exposure.null_ids and not exposure.token_ids:
            original = _ids_nulled(original)
        event = decode_event(sse.data)
        verdict = apply_exposure(event, exposure)
        if verdict is Exposed.DROPPED:
            # The usage or ID chunk, or an event that only carried IDs (for a client
            # without them): nothing with a value goes.
            assert not original.get("choices") or (
                not exposure.token_ids and carries_nothing(event)
            )
            continue
        nulled = exposure.null_ids and not exposure.token_ids
        assert (verdict is Exposed.UNCHANGED) == (event == original) or nulled
        assert _is_subset(event, original)
        if exposure.token_ids:
            assert event.get("prompt_token_ids") == original.get("prompt_token_ids")
        elif exposure.null_ids:
            assert event.get("prompt_token_ids") is None and "sglext" not in event
        else:
            assert "prompt_token_ids" not in event and "sglext" not in event


def _ids_nulled(event: dict[str, Any]) -> dict[str, Any]:
    """The event as vLLM writes it for a client that did not ask for IDs."""
    out = dict(event)
    if "prompt_token_ids" in out:
        out["prompt_token_ids"] = None
    if isinstance(out.get("choices"), list):
        out["choices"] = [
            {k: None if k in ("token_ids", "prompt_token_ids") else v for k, v in c.items()}
            if isinstance(c, dict)
            else c
            for c in out["choices"]
        ]
    return out


def _is_subset(small: Any, big: Any) -> bool:
    if isinstance(small, dict):
        keys = [k for k in big if k in small]
        return list(small) == keys and all(_is_subset(small[k], big[k]) for k in small)
    if isinstance(small, list):
        return len(small) == len(big) and all(map(_is_subset, small, big))
    return bool(small == big)


def test_streamed_vllm_chat_for_a_default_client() -> None:
    """A client that asked for nothing extra gets vLLM's stream minus IDs and usage."""
    out = []
    for sse in SSEDecoder().feed(VLLM_CHAT.body):
        if is_done(sse):
            out.append("[DONE]")
            continue
        event = expose_event(decode_event(sse.data), NOTHING)
        if event is not None:
            out.append(event)
    assert len(out) == 5  # the usage-only chunk and the ID-only empty delta are gone
    assert all("prompt_token_ids" not in e and "usage" not in e for e in out[:-1])
    assert all("token_ids" not in c for e in out[:-1] for c in e["choices"])


def test_streamed_sglang_and_completion_for_a_client_without_ids() -> None:
    kept = [
        expose_event(decode_event(sse.data), USAGE)
        for sse in SSEDecoder().feed(SGLANG_CHAT.body)
        if not is_done(sse)
    ]
    assert sum(e is None for e in kept) == 1  # only the sglext chunk
    completions = [
        expose_event(decode_event(sse.data), USAGE)
        for sse in SSEDecoder().feed(VLLM_COMPLETION.body)
        if not is_done(sse)
    ]
    assert all(e is not None for e in completions)
