"""Streaming and non-streaming agree on what is malformed (`shape.check_event`).

Every row is an event the assembler refuses as malformed. Each goes through both sinks:
the `StreamCollector` (non-streaming: tracker, then assembler) and the `StreamForwarder`
(streaming), for every client exposure (raw bytes forwarded or re-encoded), with and
without token IDs from the engine, alone in a read, after a plain event in the same
read, under an SSE event name, and byte by byte. Both must refuse it, with the same
error, and the streaming client must get none of its bytes. The tracker must not count
its finish, and the fast path must leave it to the general one.

Then hypothesis holds the rule in general: whatever `check_event` passes, the assembler
never calls malformed (it may still refuse an *unsupported* field, which a stream
forwards: seed, "Streaming responses"), and whatever the fast path's typed decode
accepts, `check_event` passes.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.errors import UpstreamError
from narwhal.protocol.assembly import Assembler
from narwhal.protocol.events import EngineOutputError, Route
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.forward import StreamCollector, StreamForwarder
from narwhal.protocol.plain import decode_plain
from narwhal.protocol.shape import check_event
from narwhal.protocol.tracker import OutputTracker
from narwhal.protocol.usage import MAX_TOKEN_COUNT

EXPOSURES = [Exposure(*flags) for flags in itertools.product((False, True), repeat=3)]


def chat(**choice: Any) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, **choice}]}


def completion(**choice: Any) -> dict[str, Any]:
    return {"id": "t", "object": "text_completion", "choices": [{"index": 0, **choice}]}


def tool(**fragment: Any) -> dict[str, Any]:
    return chat(delta={"tool_calls": [{"index": 0, **fragment}]}, token_ids=[7])


# (route, event, what the error says)
MALFORMED: dict[str, tuple[Route, dict[str, Any], str]] = {
    "finish_reason 5": ("chat", chat(delta={}, finish_reason=5), "finish_reason"),
    "finish_reason true": ("chat", chat(delta={}, finish_reason=True), "finish_reason"),
    "finish_reason list": ("chat", chat(delta={}, finish_reason=["stop"]), "finish_reason"),
    "finish_reason object": ("chat", chat(finish_reason={"type": "stop"}), "finish_reason"),
    "index -1": ("chat", chat(delta={"content": "a"}, token_ids=[1], index=-1), "choice index"),
    "index string": ("chat", chat(delta={}, index="0"), "choice index"),
    "index float": ("chat", chat(delta={}, index=1.0), "choice index"),
    "index true": ("chat", chat(delta={}, index=True), "choice index"),
    "index null": ("chat", chat(delta={}, index=None), "choice index"),
    "index missing": ("chat", {"choices": [{"delta": {}, "finish_reason": "stop"}]}, "index"),
    "delta string": ("chat", chat(delta="hi"), "delta"),
    "delta list": ("chat", chat(delta=[{"content": "hi"}]), "delta"),
    "content number": ("chat", chat(delta={"content": 5}, token_ids=[1]), "delta.content"),
    "reasoning list": ("chat", chat(delta={"reasoning": ["r"]}, token_ids=[1]), "reasoning"),
    "refusal object": ("chat", chat(delta={"refusal": {"t": 1}}, token_ids=[1]), "refusal"),
    "reasoning_content true": (
        "chat",
        chat(delta={"reasoning_content": True}, token_ids=[1]),
        "reasoning_content",
    ),
    "role number": ("chat", chat(delta={"role": 1}), "delta.role"),
    "tool_calls object": ("chat", chat(delta={"tool_calls": {"index": 0}}, token_ids=[1]), "tool"),
    "tool_calls of strings": ("chat", chat(delta={"tool_calls": ["c"]}, token_ids=[1]), "tool"),
    "tool call index -1": ("chat", tool(index=-1, id="t"), "tool call index"),
    "tool call index missing": (
        "chat",
        chat(delta={"tool_calls": [{"id": "t"}]}, token_ids=[1]),
        "tool call index",
    ),
    "tool call id number": ("chat", tool(id=7), "tool call id"),
    "tool call function string": ("chat", tool(function="f"), "tool call function"),
    "tool call name list": ("chat", tool(function={"name": ["f"]}), "function name"),
    "tool call arguments object": ("chat", tool(function={"arguments": {"a": 1}}), "arguments"),
    "function_call string": (
        "chat",
        chat(delta={"function_call": "f"}, token_ids=[1]),
        "function_call",
    ),
    "function_call name": (
        "chat",
        chat(delta={"function_call": {"name": 1}}, token_ids=[1]),
        "function_call name",
    ),
    "stop_reason true": ("chat", chat(delta={}, stop_reason=True), "stop_reason"),
    "stop_reason float": ("chat", chat(delta={}, stop_reason=1.5), "stop_reason"),
    "stop_reason list": ("completion", completion(text="", stop_reason=["</s>"]), "stop_reason"),
    "logprobs string": ("chat", chat(delta={}, logprobs="a"), "logprobs"),
    "logprobs.content object": ("chat", chat(delta={}, logprobs={"content": {}}), "content"),
    "logprobs.content of strings": ("chat", chat(delta={}, logprobs={"content": ["a"]}), "content"),
    "logprobs.refusal string": ("chat", chat(delta={}, logprobs={"refusal": "no"}), "refusal"),
    "text number": ("completion", completion(text=3, token_ids=[1]), "text"),
    "text list": ("completion", completion(text=["a"], token_ids=[1]), "text"),
    "completion finish_reason 5": ("completion", completion(text="", finish_reason=5), "finish"),
    "completion index -1": ("completion", completion(text="", index=-1), "choice index"),
    "logprobs.tokens of numbers": (
        "completion",
        completion(text="", logprobs={"tokens": [1]}),
        "logprobs.tokens",
    ),
    "logprobs.text_offset of floats": (
        "completion",
        completion(text="", logprobs={"text_offset": [0.5]}),
        "text_offset",
    ),
    "logprobs.token_logprobs of strings": (
        "completion",
        completion(text="", logprobs={"token_logprobs": ["-1"]}),
        "token_logprobs",
    ),
    "logprobs.top_logprobs of lists": (
        "completion",
        completion(text="", logprobs={"top_logprobs": [["a", -1]]}),
        "top_logprobs",
    ),
    "choices object": ("chat", {"choices": {"index": 0}}, "choices"),
    "choices string": ("completion", {"choices": "x"}, "choices"),
    "choice string": ("chat", {"choices": ["x"]}, "choice"),
    "usage list": ("chat", {"choices": [], "usage": [3, 4]}, "usage"),
    "usage string": ("completion", {"choices": [], "usage": "7"}, "usage"),
    **{
        f"usage {key} {value!r}"[:60]: (
            "chat",
            {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, key: value}},
            f"usage.{key}",
        )
        for key, value in [
            ("prompt_tokens", 10**400),  # was an OverflowError in the token counters
            ("prompt_tokens", 2**70),
            ("prompt_tokens", MAX_TOKEN_COUNT + 1),
            ("completion_tokens", -1),
            ("completion_tokens", 1.0),
            ("completion_tokens", True),
            ("total_tokens", "4"),
            ("total_tokens", [4]),
            ("reasoning_tokens", -1),  # SGLang's, at the top level
            ("prompt_tokens_details", "none"),
            ("prompt_tokens_details", {"cached_tokens": -5}),
            ("completion_tokens_details", {"reasoning_tokens": 2.5}),
        ]
    },
}

# A plain event that comes first: the malformed one arrives mid-stream.
VALID = {
    "chat": chat(delta={"content": "Hi"}, finish_reason=None, token_ids=[1]),
    "completion": completion(text="Hi", finish_reason=None, token_ids=[1]),
}


def frame(event: dict[str, Any], name: str | None = None) -> bytes:
    data = json.dumps(event, separators=(",", ":")).encode()
    return (b"event: %b\n" % name.encode() if name else b"") + b"data: " + data + b"\n\n"


def reads(route: Route, event: dict[str, Any], way: str) -> list[bytes]:
    """The engine's bytes as the socket delivers them, the malformed event last."""
    valid = frame(VALID[route])
    if way == "alone":
        return [valid, frame(event)]
    if way == "after a plain event":
        return [valid + frame(event)]
    if way == "named":
        return [valid, frame(event, "chunk")]
    body = valid + frame(event)
    return [body[i : i + 1] for i in range(len(body))]  # byte by byte


WAYS = ["alone", "after a plain event", "named", "byte by byte"]


def collect(route: Route, token_ids: bool, chunks: list[bytes]) -> tuple[str, OutputTracker]:
    tracker = OutputTracker(route, token_ids=token_ids)
    sink = StreamCollector(tracker, Assembler(route, EXPOSURES[-1]))
    with pytest.raises(EngineOutputError) as info:
        for chunk in chunks:
            sink.feed(chunk, 0.0)
    return info.value.message, tracker


def forward(
    route: Route, token_ids: bool, exposure: Exposure, chunks: list[bytes]
) -> tuple[str, OutputTracker, bytes]:
    tracker = OutputTracker(route, token_ids=token_ids)
    sink = StreamForwarder(tracker, exposure)
    sent = b""
    with pytest.raises(EngineOutputError) as info:
        for chunk in chunks:
            sent += sink.feed(chunk, 0.0)
    return info.value.message, tracker, sent


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("token_ids", [True, False], ids=["ids", "no-ids"])
@pytest.mark.parametrize("name", list(MALFORMED))
def test_both_paths_refuse_a_malformed_event(name: str, token_ids: bool, way: str) -> None:
    route, event, says = MALFORMED[name]
    chunks = reads(route, event, way)
    assembled, collected = collect(route, token_ids, chunks)
    assert says in assembled
    valid = frame(VALID[route])
    for exposure in EXPOSURES:
        streamed, tracker, sent = forward(route, token_ids, exposure, chunks)
        assert streamed == assembled, exposure
        # The client got the valid event at most (maybe without its IDs), nothing after.
        assert b"data:" not in sent.replace(b"data:", b"", 1) and len(sent) <= len(valid)
        assert not tracker.finish_seen and not tracker.finished
    assert not collected.finish_seen and not collected.finished


@pytest.mark.parametrize("name", list(MALFORMED))
def test_the_fast_path_leaves_a_malformed_event_to_the_general_one(name: str) -> None:
    _, event, _ = MALFORMED[name]
    assert decode_plain(json.dumps(event).encode()) is None


@pytest.mark.parametrize("name", list(MALFORMED))
def test_the_assembler_alone_refuses_it_with_the_shared_check(name: str) -> None:
    route, event, says = MALFORMED[name]
    with pytest.raises(EngineOutputError) as shared:
        check_event(event, route)
    with pytest.raises(EngineOutputError) as assembled:
        Assembler(route, EXPOSURES[-1]).add(event)
    assert says in shared.value.message
    assert assembled.value.message == shared.value.message


def test_a_malformed_finish_does_not_finish_the_stream() -> None:
    """A generic server's stream may end without [DONE] once every choice finished: a
    finish_reason of 5 must not pass for that end."""
    tracker = OutputTracker("chat", token_ids=False)
    tracker.observe(chat(delta={"content": "a"}), 0.0)
    with pytest.raises(EngineOutputError, match="finish_reason"):
        tracker.observe(chat(delta={}, finish_reason=5), 0.0)
    assert not tracker.finish_seen and not tracker.finished


# --- In general -----------------------------------------------------------------------

anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 3),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "a", "stop", "function", "assistant"]),
    st.lists(st.integers(0, 3), max_size=2),
    st.just({}),
    st.just(["a"]),
)


def mostly(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Usually a valid value, now and then anything: most events are wrong in one place
    or none. (Not `one_of`, which flattens nested choices and so loses the weights.)"""
    return st.integers(0, 5).flatmap(lambda i: anything if i == 0 else valid)


def maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A valid value or, less often, null (which is always valid)."""
    return st.integers(0, 3).flatmap(lambda i: st.none() if i == 0 else valid)


texts = maybe(st.sampled_from(["", "a", "{"]))
functions = mostly(
    st.fixed_dictionaries(
        {}, optional={"name": mostly(texts), "arguments": mostly(texts), "x": anything}
    )
)
fragments = mostly(
    st.fixed_dictionaries(
        {"index": mostly(st.integers(0, 2))},
        optional={
            "id": mostly(texts),
            "type": st.sampled_from(["function", None, "custom"]),
            "function": maybe(functions),
        },
    )
)
deltas = mostly(
    st.fixed_dictionaries(
        {},
        optional={
            "role": mostly(st.sampled_from([None, "assistant"])),
            "content": mostly(texts),
            "reasoning": mostly(texts),
            "reasoning_content": mostly(texts),
            "refusal": mostly(texts),
            "tool_calls": mostly(maybe(st.lists(fragments, max_size=2))),
            "function_call": maybe(functions),
            "audio": maybe(anything),
        },
    )
)
entries = st.fixed_dictionaries({"token": st.just("t"), "logprob": st.floats(-5, 0)})
logprob_arrays = {
    "content": st.lists(mostly(entries), max_size=2),
    "refusal": st.lists(mostly(entries), max_size=2),
    "tokens": st.lists(mostly(st.just("t")), max_size=2),
    "text_offset": st.lists(mostly(st.integers(0, 9)), max_size=2),
    "token_logprobs": st.lists(mostly(maybe(st.floats(-5, 0))), max_size=2),
    "top_logprobs": st.lists(mostly(maybe(st.just({"t": -0.5}))), max_size=2),
}
logprobs = mostly(
    maybe(
        st.fixed_dictionaries(
            {}, optional={key: mostly(maybe(lists)) for key, lists in logprob_arrays.items()}
        )
    )
)
choices = mostly(
    st.fixed_dictionaries(
        {"index": mostly(st.integers(0, 2))},
        optional={
            "finish_reason": mostly(st.sampled_from([None, "stop", "length"])),
            "stop_reason": mostly(st.sampled_from([None, 0, "</s>"])),
            "logprobs": logprobs,
            "delta": deltas,
            "text": mostly(texts),
            "matched_stop": anything,
        },
    )
)
events = st.fixed_dictionaries(
    {"id": st.just("x")},
    optional={
        "choices": mostly(maybe(st.lists(choices, min_size=1, max_size=2))),
        "usage": mostly(maybe(st.just({"completion_tokens": 1}))),
    },
)


@settings(max_examples=2000, deadline=None)
@given(event=events, route=st.sampled_from(["chat", "completion"]))
def test_what_the_shared_check_passes_the_assembler_never_calls_malformed(
    event: dict[str, Any], route: Route
) -> None:
    try:
        check_event(event, route)
    except EngineOutputError:
        return
    try:
        Assembler(route, EXPOSURES[0]).add(event)
    except UpstreamError as exc:
        assert "malformed" not in exc.message and "not an object" not in exc.message, exc


@settings(max_examples=2000, deadline=None)
@given(event=events, route=st.sampled_from(["chat", "completion"]))
def test_what_the_fast_path_accepts_the_shared_check_passes(
    event: dict[str, Any], route: Route
) -> None:
    if decode_plain(json.dumps(event).encode()) is not None:
        check_event(event, route)
