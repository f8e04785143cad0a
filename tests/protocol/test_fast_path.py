"""The relay's fast path against the general one, which is the reference.

The general path: `SSEDecoder.feed`, then per event `events.decode_event`,
`OutputTracker.observe` and `exposure.apply_exposure` (UNCHANGED: the event's raw bytes;
CHANGED: `encode_sse_event(decoded, name)`; DROPPED: nothing, though a dropped usage-only
chunk's system_fingerprint goes onto the last chunk sent), `[DONE]` never forwarded.

The fast path (`SSEDecoder.feed_run`, `plain.decode_plain`, `OutputTracker.observe_plains`,
`plain.strip_token_ids`, put together by `StreamForwarder`) must be indistinguishable
from it: the same events, the same accounting, the same errors, and client bytes that
decode to the same JSON (the fast path keeps the engine's bytes where the reference
re-encodes), however the engine's bytes are split. Generated streams are cut at random
offsets, as h11 tests its parser.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import UNSET

from narwhal.errors import UpstreamError
from narwhal.protocol.assembly import Assembler
from narwhal.protocol.events import EngineError, EngineOutputError, Route, decode_event
from narwhal.protocol.events import encode_sse_event as encode_sse
from narwhal.protocol.exposure import Exposed, Exposure, apply_exposure
from narwhal.protocol.forward import StreamCollector, StreamForwarder
from narwhal.protocol.plain import (
    PlainEvent,
    decode_plain,
    decode_plains,
    id_list_keys,
    null_id_names,
    null_token_ids,
    strip_token_ids,
)
from narwhal.protocol.sse import SSEDecoder
from narwhal.protocol.tokens import TokenIdError
from narwhal.protocol.tracker import OutputTracker
from tests.protocol.streams import ALL, VLLM_CHAT, VLLM_COMPLETION, Stream

ALL_EXPOSURES = [
    Exposure(*flags, null_ids=null_ids)
    for flags in itertools.product((False, True), repeat=3)
    for null_ids in (False, True)
]
EVERYTHING = Exposure(token_ids=True, usage=True, continuous_usage=True)
NOTHING = Exposure(token_ids=False, usage=False, continuous_usage=False)
DONE_BLOCK = b"data: [DONE]\n\n"
ABSENT: Any = object()  # a key left out of a generated dict


def cut(body: bytes, offsets: list[int]) -> list[bytes]:
    points = sorted({min(o, len(body)) for o in offsets})
    return [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]


def cut_list(items: list[bytes], offsets: list[int]) -> list[list[bytes]]:
    points = sorted(set(offsets))
    return [items[a:b] for a, b in zip([0, *points], [*points, len(items)], strict=True)]


def frame(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def without_absent(items: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in items.items() if value is not ABSENT}


# --- 1. feed_run ≡ feed ---------------------------------------------------------------

payloads = st.one_of(
    st.sampled_from(
        [b'{"a":1}', b"[DONE]", b"", b"x", b"data: y", b": z", b' {"k":"v\\n"}', b"\xef\xbb\xbf"]
    ),
    st.binary(max_size=10).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
)
BLOCK_KINDS = ["one"] * 8 + ["done", "comment", "named", "multi", "id", "bare", "blank", "field"]


@st.composite
def sse_bodies(draw: st.DrawFn) -> bytes:
    """Mostly vLLM's `data: {...}\\n\\n`, with every other shape the decoder knows."""
    out = [b"\xef\xbb\xbf"] if draw(st.integers(0, 4)) == 0 else []
    for _ in range(draw(st.integers(0, 12))):
        end = draw(st.sampled_from([b"\n"] * 6 + [b"\r\n", b"\r"]))
        kind = draw(st.sampled_from(BLOCK_KINDS))
        data = draw(payloads)
        if kind == "one":
            out.append(b"data: " + data + end + end)
        elif kind == "done":
            out.append(b"data: [DONE]" + end + end)
        elif kind == "comment":
            out.append(b": keep-alive" + end + end)
        elif kind == "named":
            out.append(b"event: x" + end + b"data: " + data + end + end)
        elif kind == "multi":
            out.append(b"data: " + data + end + b"data: " + draw(payloads) + end + end)
        elif kind == "id":
            out.append(b"id: 7" + end + b"data: " + data + end + end)
        elif kind == "bare":
            out.append(b"data:" + data + end + end)
        elif kind == "blank":
            out.append(end)
        else:
            out.append(b"retry: 10" + end + b"data: " + data + end + b": c" + end + end)
    tail = draw(st.sampled_from([b"", b"", b"data: cut", b"data: cut\n", b"event: x\n", b"\n"]))
    return b"".join(out) + tail


def feed_all(body: bytes) -> tuple[list[tuple[bytes, str | None]], bool]:
    decoder = SSEDecoder()
    return [(e.data, e.event) for e in decoder.feed(body)], decoder.pending


def feed_run_all(chunks: list[bytes]) -> tuple[list[tuple[bytes, str | None]], bool]:
    decoder = SSEDecoder()
    got: list[tuple[bytes, str | None]] = []
    for chunk in chunks:
        events, run, datas = decoder.feed_run(chunk)
        # The run is exactly the one-line events of its datas, back to back.
        assert run == b"".join(frame(d) for d in datas)
        got += [(e.data, e.event) for e in events]
        got += [(d, None) for d in datas]
    return got, decoder.pending


@settings(max_examples=300, deadline=None)
@given(body=sse_bodies(), data=st.data())
def test_feed_run_decodes_like_feed_however_split(body: bytes, data: st.DataObject) -> None:
    offsets = data.draw(st.lists(st.integers(0, len(body)), max_size=10))
    assert feed_run_all(cut(body, offsets)) == feed_all(body)


def test_feed_run_every_split_and_byte_by_byte() -> None:
    body = (
        b'data: {"a":1}\n\n: keep-alive\n\ndata: {"b":2}\n\ndata: {"c":3}\n\n'
        b"event: e\ndata: x\n\ndata: y\ndata: z\n\n\ndata: [DONE]\n\n"
    )
    whole = feed_all(body)
    assert feed_run_all([body[i : i + 1] for i in range(len(body))]) == whole
    for i in range(len(body) + 1):
        for j in range(i, len(body) + 1, 7):
            assert feed_run_all([body[:i], body[i:j], body[j:]]) == whole, (i, j)


def test_feed_run_slices_runs_of_one_line_events() -> None:
    decoder = SSEDecoder()
    events, run, datas = decoder.feed_run(b"\xef\xbb\xbfdata: a\n\n")
    assert [e.data for e in events] + datas == [b"a"]
    assert decoder.feed_run(b"data: b\n\ndata: c\n\ndata: d") == (
        [],
        b"data: b\n\ndata: c\n\n",
        [b"b", b"c"],
    )
    assert decoder.pending
    events, run, datas = decoder.feed_run(b"\n\ndata: e\n\n")
    assert [e.data for e in events] == [b"d"]
    assert (run, datas) == (b"data: e\n\n", [b"e"])
    assert not decoder.pending
    # The blank line that ends the held event opens the next chunk: the rest is a run.
    assert decoder.feed_run(b"data: f\n") == ([], b"", [])
    events, run, datas = decoder.feed_run(b"\ndata: g\n\n")
    assert ([e.data for e in events], run, datas) == ([b"f"], b"data: g\n\n", [b"g"])
    # A CR anywhere, a comment or a multi-line event: no run, `feed`'s events.
    for chunk in (b"data: f\r\n\r\n", b": c\n\ndata: f\n\n", b"data: f\ndata: g\n\n"):
        events, run, datas = decoder.feed_run(chunk)
        assert (run, datas) == (b"", [])
        assert events[-1].data in (b"f", b"f\ng")


# --- 2. decode_plain: what it refuses and accepts ------------------------------------

CONTENT = b'{"id":"c","choices":[{"index":0,"delta":{"content":"Hi"},"token_ids":[%s]}]}'
CHOICE = b'{"id":"c","choices":[%s]}'


@pytest.mark.parametrize(
    "data",
    [
        CONTENT % b"true",
        CONTENT % b"false",
        CONTENT % b"1.0",
        CONTENT % b"-1",
        CONTENT % b'"1"',
        CONTENT % b"null",
        CONTENT % b"[1]",
        b'{"choices":[{"index":0,"delta":{"content":"Hi"},"token_ids":"1"}]}',
        b'{"choices":[{"index":0,"delta":{"content":"Hi"},"token_ids":7}]}',
        b'{"choices":[{"index":0,"delta":{"content":"Hi"},"token_ids":{"a":1}}]}',
        b'{"choices":[{"index":0,"delta":{},"token_ids":[1]}],"usage":null}',
        b'{"choices":[{"index":0,"delta":{},"token_ids":[1]}],"usage":{"completion_tokens":1}}',
        b'{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}',
        b'{"error":{"message":"boom","type":"x","code":500}}',
        b'{"error":null,"choices":[]}',
        b'{"error":"boom"}',
        b'{"object":"error","message":"boom","code":400}',
        b'{"choices":[{"index":0,"delta":{"role":"assistant"}}],"prompt_token_ids":[1,2]}',
        b'{"choices":[{"index":0,"delta":{"role":"assistant"}}],"prompt_token_ids":null}',
        b'{"choices":[],"sglext":{"input_ids":[1],"output_ids":[[2]]}}',
        b'{"choices":[],"sglext":null}',
        CHOICE % b'{"index":0,"text":"a","prompt_token_ids":[1],"token_ids":[2]}',
        CHOICE % b'{"index":0,"text":"a","response_token_ids":[2]}',
        CHOICE % b"1",
        CHOICE % b"null",
        CHOICE % b'"a"',
        CHOICE % b'{"index":0,"delta":{"content":"a"}},[]',
        b'{"choices":{"index":0}}',
        b'{"choices":"x"}',
        CHOICE % b'{"index":0,"delta":"Hi"}',
        CHOICE % b'{"index":0,"delta":["Hi"]}',
        CHOICE % b'{"index":0,"delta":{"content":1}}',
        CHOICE % b'{"index":0,"delta":{"content":["Hi"]}}',
        CHOICE % b'{"index":0,"delta":{"reasoning":true}}',
        CHOICE % b'{"index":0,"delta":{"refusal":{}}}',
        CHOICE % b'{"index":0,"delta":{"tool_calls":"x"}}',
        CHOICE % b'{"index":0,"delta":{"function_call":[1]}}',
        CHOICE % b'{"index":0,"text":1}',
        CHOICE % b'{"index":"0","text":"a"}',
        CHOICE % b'{"index":null,"text":"a"}',
        CHOICE % b'{"index":true,"text":"a"}',
        CHOICE % b'{"index":0,"finish_reason":1}',
        b'{"choices":[{"index":0,"delta":{"content":"Hi"},"token_ids":[1]}]',
        b'{"choices":[{"index":0,"delta":{"content":"Hi"},"token_ids":[1,]}]}',
        b'{"choices":[],"x":NaN}',
        b'{"choices":[],"x":"\\ud800"}',
        b"",
        b"null",
        b"[]",
        b'"x"',
        b"[DONE]",
    ],
)
def test_decode_plain_refuses_what_the_general_path_must_judge(data: bytes) -> None:
    assert decode_plain(data) is None


@pytest.mark.parametrize(
    "data",
    [
        # vLLM chat: content, an empty delta carrying IDs, null IDs, no IDs, the finish.
        b'{"id":"chatcmpl-a","object":"chat.completion.chunk","created":1,"model":"m",'
        b'"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null,'
        b'"token_ids":[13048]}],"kv_transfer_params":null}',
        b'{"id":"c","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null,'
        b'"token_ids":[11]}]}',
        b'{"id":"c","choices":[{"index":0,"delta":{"content":"Hi"},"token_ids":null}]}',
        b'{"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"r"},"logprobs":'
        b'{"content":[{"token":"r","logprob":-0.25,"bytes":[114],"top_logprobs":[]}]}}]}',
        b'{"id":"c","choices":[{"index":1,"delta":{"content":"!"},"finish_reason":"stop",'
        b'"stop_reason":null,"token_ids":[0],"weight_versions":null}],'
        b'"kv_transfer_params":{"do_remote_prefill":false}}',
        b'{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
        b'{"arguments":"{\\"a\\":"}}]},"token_ids":[5,6]}]}',
        # The chat role chunk of a choice after the first (n>1) without prompt IDs.
        b'{"id":"c","choices":[{"index":1,"delta":{"role":"assistant","content":""},'
        b'"logprobs":null,"finish_reason":null}]}',
        # vLLM completions after the first chunk, once `prompt_token_ids` is left out.
        b'{"id":"cmpl","object":"text_completion","choices":[{"index":0,"text":" Paris",'
        b'"logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[12366]}]}',
        b'{"id":"cmpl","choices":[{"index":0,"text":"","finish_reason":"length","token_ids":[]}]}',
        # ... and as vLLM really sends them: with a null `prompt_token_ids` (PROTOCOL.md 1.3).
        b'{"id":"cmpl","choices":[{"index":0,"text":" Paris","logprobs":null,'
        b'"finish_reason":null,"stop_reason":null,"token_ids":[12366],'
        b'"prompt_token_ids":null}]}',
        b'{"id":"c","choices":[]}',
        b'{"id":"c"}',
        b'{"id":"c","object":"chat.completion.chunk","choices":null}',
    ],
)
def test_decode_plain_accepts_typical_vllm_chunks(data: bytes) -> None:
    plain = decode_plain(data)
    assert plain is not None
    decoded = decode_event(data)
    choices = decoded.get("choices") or []
    plain_ids = [choice.token_ids for choice in plain.choices or []]
    assert [choice.get("token_ids", UNSET) for choice in choices] == plain_ids


# --- 3. observe_plains ≡ observe -------------------------------------------------------

short_texts = st.sampled_from(["", "Hi", 'é"\\', "token_ids"])
delta_values = st.fixed_dictionaries(
    {},
    optional={
        "role": st.just("assistant"),
        "content": st.none() | short_texts,
        "reasoning": st.none() | short_texts,
        "reasoning_content": st.none() | short_texts,
        "refusal": st.none() | short_texts,
        "tool_calls": st.sampled_from([None, [], [{"index": 0, "function": {"arguments": "{"}}]]),
        # (A legacy call that is not null takes the general path: GENERAL_EVENTS.)
        "function_call": st.none(),
    },
)
id_lists = st.lists(st.integers(0, 2**31), max_size=3)


@st.composite
def plain_choices(draw: st.DrawFn, route: Route) -> dict[str, Any]:
    choice = {
        # (A missing or negative index is malformed: GENERAL_EVENTS.)
        "index": draw(st.integers(0, 3)),
        "finish_reason": draw(st.sampled_from([ABSENT, None, "stop", "length"])),
        # Mostly present, so that trackers expecting IDs get past the first events.
        "token_ids": draw(st.one_of(*[id_lists] * 10, st.just(ABSENT), st.none())),
        "logprobs": draw(st.sampled_from([ABSENT, None, {"content": [{"logprob": -0.5}]}])),
    }
    # The other route's output field now and then: each route must ignore it.
    if route == "chat" or draw(st.integers(0, 4)) == 0:
        choice["delta"] = draw(st.none() | delta_values)
    if route == "completion" or draw(st.integers(0, 4)) == 0:
        choice["text"] = draw(st.sampled_from([ABSENT, None, "", " Paris", "é"]))
    items = draw(st.permutations(list(without_absent(choice).items())))
    return dict(items)


# Events the fast path leaves to the general one (both trackers `observe` them).
GENERAL_EVENTS = [
    {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}},
    {"choices": [{"index": 0, "delta": {"role": "assistant"}}], "prompt_token_ids": [1, 2]},
    {"choices": [{"index": 0, "text": "a", "prompt_token_ids": [1], "token_ids": [3]}]},
    {"choices": [{"index": 0, "delta": {"content": "a"}, "text": "a", "token_ids": [True]}]},
    {"choices": [{"index": 0, "delta": {"content": "a"}, "text": "a", "token_ids": [-1]}]},
    {"choices": [{"index": 0, "delta": {"content": "a"}, "text": "a"}], "usage": None},
    {"choices": [{"index": 0, "delta": {"function_call": {"name": "f"}}, "token_ids": [4]}]},
    {"choices": [{"index": 0, "delta": {"function_call": {}}, "finish_reason": "stop"}]},
    {"choices": [{"index": -1, "delta": {"content": "a"}, "text": "a", "token_ids": [1]}]},
    {"choices": [{"delta": {"content": "a"}, "text": "a", "token_ids": [1]}]},
    {"choices": [{"index": 0, "finish_reason": 5, "token_ids": []}]},
]


@st.composite
def tracked_events(draw: st.DrawFn, route: Route) -> tuple[bytes, bool]:
    """One event's data, and whether it has the plain shape."""
    if draw(st.integers(0, 9)) == 0:
        return msgspec.json.encode(draw(st.sampled_from(GENERAL_EVENTS))), False
    event: dict[str, Any] = {"id": "x", "object": "chunk"}
    shape = draw(st.sampled_from(["list"] * 6 + ["empty", "null", "absent"]))
    if shape == "list":
        event["choices"] = draw(st.lists(plain_choices(route), max_size=3))
    elif shape == "empty":
        event["choices"] = []
    elif shape == "null":
        event["choices"] = None
    return msgspec.json.encode(event), True


Snapshot = tuple[Any, ...]


def snapshot(tracker: OutputTracker) -> Snapshot:
    return (
        tracker.tokens,
        tracker.first_output_at,
        list(tracker.event_times),
        list(tracker.event_counts),
        tracker.finished,
        tracker.output_tokens(),
        tracker.usage,
        tracker.time_per_output_token(),
    )


def keys_of(data: bytes) -> int:
    """How many choices of the event have a `token_ids` key (null included)."""
    return sum("token_ids" in choice for choice in decode_event(data).get("choices") or [])


def account(route: Route, token_ids: bool, reads: list[list[bytes]], fast: bool) -> Snapshot:
    """Events read together share a `now`. The fast way hands each stretch of plain
    events of a read to `observe_plains` at once, as the forwarder does."""
    tracker = OutputTracker(route, token_ids=token_ids)
    for now, read in enumerate(reads):
        try:
            if not fast:
                for data in read:
                    tracker.observe(decode_event(data), float(now))
                continue
            batch: list[PlainEvent] = []
            keys = 0
            for data in read:
                plain = decode_plain(data)
                if plain is not None:
                    batch.append(plain)
                    continue
                keys += tracker.observe_plains(batch, float(now))
                batch = []
                tracker.observe(decode_event(data), float(now))
            keys += tracker.observe_plains(batch, float(now))
            assert keys == sum(keys_of(data) for data in read if decode_plain(data) is not None)
        except UpstreamError as exc:
            # What was validated before the failing event stays counted (the relay's
            # metrics read it); `finished` may differ, the attempt is over.
            state = snapshot(tracker)
            return ("raised", type(exc), now, state[:4] + state[5:])
    return snapshot(tracker)


@settings(max_examples=300, deadline=None)
@given(
    route=st.sampled_from(["chat", "completion"]),
    token_ids=st.booleans(),
    data=st.data(),
)
def test_observe_plains_accounts_like_observe(
    route: Route, token_ids: bool, data: st.DataObject
) -> None:
    drawn = data.draw(st.lists(tracked_events(route), min_size=1, max_size=10))
    for event, plain_shape in drawn:
        if plain_shape:
            assert decode_plain(event) is not None, event
    events = [event for event, _ in drawn]
    reads = cut_list(events, data.draw(st.lists(st.integers(0, len(events)), max_size=4)))
    assert account(route, token_ids, reads, fast=True) == account(
        route, token_ids, reads, fast=False
    )


@pytest.mark.parametrize("route", ["chat", "completion"])
def test_observe_plains_raises_for_output_without_ids(route: Route) -> None:
    output = {"delta": {"content": "Hi"}} if route == "chat" else {"text": "Hi"}
    for ids in ("", ',"token_ids":null'):
        data = b'{"choices":[{"index":0,%s%s}]}' % (json.dumps(output)[1:-1].encode(), ids.encode())
        plain = decode_plain(data)
        assert plain is not None
        with pytest.raises(TokenIdError, match="omits token_ids"):
            OutputTracker(route, token_ids=True).observe_plains([plain], 0.0)
        with pytest.raises(TokenIdError, match="omits token_ids"):
            OutputTracker(route, token_ids=True).observe(decode_event(data), 0.0)
        # An engine without IDs: one token per output event.
        tracker = OutputTracker(route, token_ids=False)
        assert tracker.observe_plains([plain, plain], 5.0) == (2 if ids else 0)
        assert (tracker.tokens, tracker.first_output_at) == (2, 5.0)
        assert (list(tracker.event_times), list(tracker.event_counts)) == ([5.0], [2])


OUTPUT_FIELDS = [
    ("content", "Hi"),
    ("reasoning", "r"),
    ("reasoning_content", "r"),
    ("refusal", "no"),
    ("tool_calls", [{"index": 0, "function": {"arguments": "{"}}]),
    ("function_call", {"name": "f"}),
]


@pytest.mark.parametrize("token_ids", [True, False])
@pytest.mark.parametrize(("field", "value"), OUTPUT_FIELDS, ids=[f for f, _ in OUTPUT_FIELDS])
def test_observe_plains_sees_each_output_field_like_observe(
    field: str, value: Any, token_ids: bool
) -> None:
    empty = type(value)()
    for delta, ids in itertools.product(
        ({field: value}, {field: empty}, {field: None, "role": "assistant"}),
        ({}, {"token_ids": None}, {"token_ids": [5, 6]}),
    ):
        data = msgspec.json.encode({"choices": [{"index": 0, "delta": delta, **ids}]})
        reads = [[data], [data, data]]
        assert account("chat", token_ids, reads, fast=True) == account(
            "chat", token_ids, reads, fast=False
        ), data


def test_observe_plains_counts_what_came_before_a_bad_event_of_the_read() -> None:
    good = decode_plain(b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[1,2]}]}')
    bad = decode_plain(b'{"choices":[{"index":0,"delta":{"content":"b"}}]}')
    assert good is not None and bad is not None
    tracker = OutputTracker("chat", token_ids=True)
    tracker.observe_plains([good], 1.0)
    with pytest.raises(TokenIdError):
        tracker.observe_plains([good, good, bad, good], 2.0)
    assert (tracker.tokens, list(tracker.event_times), list(tracker.event_counts)) == (
        6,
        [1.0, 2.0],
        [2, 4],
    )
    assert tracker.time_per_output_token() == 1.0 / 4


def test_decode_plains_is_decode_plain_for_each() -> None:
    datas = [
        b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[1]}]}',
        b'{"choices":[],"usage":{"completion_tokens":1}}',
        b'{"choices":[{"index":0,"delta":{"content":"\xc3\xa9"},"token_ids":[1]}]}',
        b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[1],"x":"\xff"}]}',
        b'{"object":"error","message":"boom"}',
        b"[DONE]",
        b"",
    ]
    expected = [decode_plain(data) for data in datas]
    assert [e is None for e in expected] == [False, True, False, True, True, True, True]
    others = [i for i, event in enumerate(expected) if event is None]
    assert decode_plains(datas, ascii=False) == (expected, others)
    ascii_datas = [data for data in datas if data.isascii()]
    ascii_expected = [decode_plain(data) for data in ascii_datas]
    ascii_others = [i for i, event in enumerate(ascii_expected) if event is None]
    assert decode_plains(ascii_datas, ascii=True) == (ascii_expected, ascii_others)


# --- 4. strip_token_ids ---------------------------------------------------------------


def test_strip_token_ids_cuts_the_choice_members() -> None:
    one = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"},"token_ids":[1,2]}]}\n\n'
    assert strip_token_ids(one, 1) == (
        b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    )
    null = b'{"choices":[{"index":0,"text":"a","token_ids":null,"finish_reason":null}]}'
    assert strip_token_ids(null, 1) == b'{"choices":[{"index":0,"text":"a","finish_reason":null}]}'
    empty = b'{"choices":[{"index":0,"delta":{},"token_ids":[]}]}'
    assert strip_token_ids(empty, 1) == b'{"choices":[{"index":0,"delta":{}}]}'
    many = (
        frame(b'{"choices":[{"index":0,"delta":{},"token_ids":[11]}]}')
        + frame(b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[7]},'
                b'{"index":1,"delta":{"content":"b"},"token_ids":null}]}')
        + frame(b'{"choices":[{"index":0,"delta":{"content":"c"}}]}')
    )  # fmt: skip
    assert strip_token_ids(many, 3) == (
        frame(b'{"choices":[{"index":0,"delta":{}}]}')
        + frame(b'{"choices":[{"index":0,"delta":{"content":"a"}},'
                b'{"index":1,"delta":{"content":"b"}}]}')
        + frame(b'{"choices":[{"index":0,"delta":{"content":"c"}}]}')
    )  # fmt: skip
    nothing = frame(b'{"choices":[{"index":0,"delta":{"content":"c"}}]}')
    assert strip_token_ids(nothing, 0) == nothing


def test_strip_token_ids_never_touches_prompt_token_ids() -> None:
    raw = b'{"choices":[{"index":0,"text":"a","prompt_token_ids":[1,2],"token_ids":[3]}],' \
          b'"prompt_token_ids":[4]}'  # fmt: skip
    assert strip_token_ids(raw, 1) == (
        b'{"choices":[{"index":0,"text":"a","prompt_token_ids":[1,2]}],"prompt_token_ids":[4]}'
    )
    assert strip_token_ids(b'{"prompt_token_ids":[4]}', 0) == b'{"prompt_token_ids":[4]}'


UNSAFE_ID_BYTES = [
    # A `token_ids` key nested below the choice: in the delta, in logprobs.
    (b'{"choices":[{"index":0,"delta":{"content":"a","token_ids":[9]},"token_ids":[1]}]}', 1),
    (b'{"choices":[{"index":0,"delta":{"content":"a","token_ids":[9]}}]}', 0),
    (b'{"choices":[{"index":0,"logprobs":{"x":1,"token_ids":[9]},"token_ids":[1]}]}', 1),
    # The key first in its object (no comma before it).
    (b'{"choices":[{"token_ids":[1],"index":0,"delta":{"content":"a"}}]}', 1),
    # Spaced JSON.
    (b'{"choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": [1]}]}', 1),
    (b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids": [1]}]}', 1),
    (b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[1, 2]}]}', 1),
    # The text as a string value, alone or beside a real key.
    (b'{"choices":[{"index":0,"delta":{"content":"token_ids"}}]}', 0),
    (b'{"choices":[{"index":0,"delta":{"content":"token_ids"},"token_ids":[1]}]}', 1),
    (b'{"choices":[{"index":0,"delta":{"content":"token_ids"},"token_ids":[1]}]}', 2),
    # A count that does not match the keys present.
    (b'{"choices":[{"index":0,"delta":{},"token_ids":[1]}]}', 0),
    (b'{"choices":[{"index":0,"delta":{},"token_ids":[1]}]}', 2),
    # A value this cannot cut whole.
    (b'{"choices":[{"index":0,"delta":{},"token_ids":[[1]]}]}', 1),
    (b'{"choices":[{"index":0,"delta":{},"token_ids":"1"}]}', 1),
]


@pytest.mark.parametrize(("raw", "expected"), UNSAFE_ID_BYTES)
def test_strip_token_ids_refuses_what_it_cannot_cut_safely(raw: bytes, expected: int) -> None:
    assert strip_token_ids(raw, expected) is None
    assert strip_token_ids(frame(raw) * 2, 2 * expected) is None


def test_null_token_ids_writes_the_choice_lists_as_null() -> None:
    many = (
        frame(b'{"choices":[{"index":0,"delta":{},"token_ids":[11]}]}')
        + frame(b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[7,8]},'
                b'{"index":1,"delta":{"content":"b"},"token_ids":null}]}')
        + frame(b'{"choices":[{"index":0,"delta":{"content":"c"}}],"prompt_token_ids":null}')
    )  # fmt: skip
    assert null_token_ids(many, 3) == (
        frame(b'{"choices":[{"index":0,"delta":{},"token_ids":null}]}')
        + frame(b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":null},'
                b'{"index":1,"delta":{"content":"b"},"token_ids":null}]}')
        + frame(b'{"choices":[{"index":0,"delta":{"content":"c"}}],"prompt_token_ids":null}')
    )  # fmt: skip
    # Completion choices: their null prompt lists are counted and stay as they are.
    completion = b'{"choices":[{"index":0,"text":"a","prompt_token_ids":null,"token_ids":[3]}]}'
    assert null_token_ids(completion, 2, prompt_names=True) == completion.replace(b"[3]", b"null")
    assert null_token_ids(completion, 1, prompt_names=True) is None


def test_null_id_names_counts_the_exposed_events_nulls_or_refuses_a_list() -> None:
    role = frame(b'{"choices":[{"index":0,"delta":{"role":"assistant"},"token_ids":null}],'
                 b'"prompt_token_ids":null}')  # fmt: skip
    first = frame(b'{"choices":[{"index":0,"text":"a","prompt_token_ids":null,"token_ids":null}]}')
    assert null_id_names([role, b""]) == 1
    assert null_id_names([first], prompt_names=True) == 2
    nested = frame(b'{"choices":[{"index":0,"logprobs":{"token_ids":[9]},"token_ids":null}]}')
    assert null_id_names([role, nested]) < 0


@pytest.mark.parametrize(("raw", "expected"), UNSAFE_ID_BYTES)
def test_null_token_ids_refuses_what_it_cannot_rewrite_safely(raw: bytes, expected: int) -> None:
    assert null_token_ids(raw, expected) is None
    assert null_token_ids(frame(raw) * 2, 2 * expected) is None


# --- 5. StreamForwarder ≡ reference ---------------------------------------------------

texts = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=6),
    st.sampled_from(['"token_ids"', ',"token_ids":[1]', 'é"\\\n', "token_ids", "👋"]),
)
ids = st.lists(st.integers(0, 200_000), min_size=1, max_size=3)
logprob = st.floats(-1e4, 0, allow_nan=False)


@dataclass(frozen=True)
class EngineStream:
    route: Route
    body: bytes
    tracker_ids: bool  # the tracker expects the engine to send token IDs
    lf: bool  # LF line ends and no comments: the raw events are the body


@st.composite
def vllm_streams(draw: st.DrawFn) -> EngineStream:
    """A vLLM-shaped stream (PROTOCOL.md §1.2, §1.3, §2.2, §2.3): chat role chunks with
    top-level prompt IDs, content, reasoning, tool-call and empty-delta chunks with their
    IDs, n=2 interleaved, logprobs, finishing chunks, continuous and final usage."""
    route: Route = draw(st.sampled_from(["chat", "completion"]))
    n = draw(st.sampled_from([1, 1, 2]))
    engine_ids = draw(st.integers(0, 3)) > 0
    # A tracker that expects IDs from an engine without them fails the same way on both.
    tracker_ids = engine_ids if draw(st.integers(0, 5)) else not engine_ids
    null_ids = draw(st.booleans())  # without IDs: `"token_ids": null` (vLLM) or left out
    continuous = draw(st.integers(0, 4)) == 0
    with_logprobs = draw(st.booleans())
    head = {"id": "x-1", "object": f"{route}.chunk", "created": 1700000000, "model": "m"}
    events: list[dict[str, Any]] = []
    generated = [0] * n

    def emit(choice: dict[str, Any], **top: Any) -> None:
        index = choice["index"]
        new = draw(ids)
        if engine_ids:
            choice["token_ids"] = new
        elif null_ids:
            choice["token_ids"] = None
        generated[index] += len(new)
        event = {**head, "choices": [choice], **top}
        if continuous and draw(st.integers(0, 3)):  # on most chunks: plain and not, mixed
            total = sum(generated)
            event["usage"] = {"prompt_tokens": 3, "completion_tokens": total,
                              "total_tokens": 3 + total}  # fmt: skip
        events.append(event)

    if route == "chat":
        for index in range(n):
            role = {"index": index, "delta": {"role": "assistant", "content": ""},
                    "logprobs": None, "finish_reason": None}  # fmt: skip
            prompt = [1, 2, 3] if engine_ids else None
            events.append({**head, "choices": [role], "prompt_token_ids": prompt,
                           "prompt_text": None})  # fmt: skip
    first = set(range(n))  # choices whose first completion chunk is still to come
    calling: set[int] = set()  # choices whose tool call has started
    for _ in range(draw(st.integers(0, 8))):
        index = draw(st.integers(0, n - 1))
        kind = draw(st.sampled_from(["text", "text", "empty", "reasoning", "tool"]))
        text = draw(texts)
        choice: dict[str, Any] = {"index": index}
        if route == "completion":
            choice["text"] = "" if kind == "empty" else text
        elif kind == "empty":
            choice["delta"] = {}
        elif kind == "tool":
            call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
            if index not in calling:  # the first fragment names the call
                calling.add(index)
                call.update(id=f"call-{index}", type="function")
                call["function"]["name"] = "f"
            choice["delta"] = {"tool_calls": [call]}
        else:
            choice["delta"] = {"content" if kind == "text" else "reasoning_content": text}
        if with_logprobs and kind != "empty":
            entry = {"token": text, "logprob": draw(logprob), "bytes": list(text.encode()),
                     "top_logprobs": []}  # fmt: skip
            choice["logprobs"] = {"content": [entry]}
        else:
            choice["logprobs"] = None
        choice["finish_reason"] = None
        if route == "completion":
            choice["stop_reason"] = None
            if index in first:
                first.discard(index)
                choice["prompt_token_ids"] = [7, 8] if engine_ids else None
            elif draw(st.booleans()):
                choice["prompt_token_ids"] = None  # exclude_unset keeps the null
        emit(choice, kv_transfer_params=None)
    for index in draw(st.permutations(range(n))):
        last: dict[str, Any] = {"index": index}
        last["delta" if route == "chat" else "text"] = {} if route == "chat" else ""
        last["logprobs"] = None
        last["finish_reason"] = draw(st.sampled_from(["stop", "length"]))
        last["stop_reason"] = draw(st.sampled_from([None, "\n\n"]))
        emit(last, kv_transfer_params={"remote_block_ids": [[1]]})
    if draw(st.booleans()):
        total = sum(generated)
        usage = {"prompt_tokens": 3, "completion_tokens": total, "total_tokens": 3 + total}
        events.append({**head, "choices": [], "usage": usage})
        if draw(st.booleans()):  # vLLM 0.33 moves it here from the last chunk
            events[-1]["system_fingerprint"] = "vllm-0.33.0-x"

    end = draw(st.sampled_from([b"\n"] * 4 + [b"\r\n"]))
    keep_alive = draw(st.integers(0, 3)) == 0
    out = []
    for event in events:
        style = draw(st.sampled_from(["compact"] * 5 + ["spaced", "ids_first"]))
        if style == "ids_first":
            for choice in event["choices"]:
                if "token_ids" in choice:
                    choice_ids = choice.pop("token_ids")
                    items = list(choice.items())
                    choice.clear()
                    choice.update([("token_ids", choice_ids), *items])
        data = json.dumps(event).encode() if style == "spaced" else msgspec.json.encode(event)
        out.append(b"data: " + data + end + end)
        if keep_alive and draw(st.booleans()):
            out.append(b": keep-alive" + end + end)
    out.append(b"data: [DONE]" + end + end)
    return EngineStream(route, b"".join(out), tracker_ids, lf=end == b"\n" and not keep_alive)


@dataclass
class Outcome:
    error: tuple[type[BaseException], int] | None  # the exception, the chunk it came at
    client: list[tuple[str | None, Any]]  # the client's events, decoded
    done: bool
    events: int
    pending: bool
    tracker: Snapshot

    def same_as(self, other: Outcome) -> None:
        assert self.error == other.error
        if self.error is None:
            assert self.client == other.client  # first: the clearest diff
            assert self == other


def client_events(written: bytes) -> list[tuple[str | None, Any]]:
    decoder = SSEDecoder()
    events = decoder.feed(written)
    assert not decoder.pending
    return [(e.event, msgspec.json.decode(e.data)) for e in events]


def reference(
    chunks: list[bytes], route: Route, tracker_ids: bool, exposure: Exposure
) -> tuple[Outcome, bytes]:
    """The general path, fed the same chunks (so each event has the same `now`)."""
    tracker = OutputTracker(route, token_ids=tracker_ids)
    decoder = SSEDecoder()
    out: list[bytes] = []
    done, count = False, 0
    for now, chunk in enumerate(chunks):
        for sse in decoder.feed(chunk):
            count += 1
            if sse.data == b"[DONE]":
                done = True
                continue
            try:
                decoded = decode_event(sse.data)
                tracker.observe(decoded, float(now))
            except UpstreamError as exc:
                return Outcome((type(exc), now), [], done, count, True, ()), b""
            usage_only = "usage" in decoded and not decoded.get("choices")
            verdict = apply_exposure(decoded, exposure)
            if verdict is Exposed.UNCHANGED:
                out.append(sse.raw)
            elif verdict is Exposed.CHANGED:
                out.append(encode_sse(decoded, sse.event))
            elif usage_only and "system_fingerprint" in decoded and out:
                # Dropped for this client: its fingerprint goes on the last chunk sent.
                (last,) = SSEDecoder().feed(out[-1])
                chunk = msgspec.json.decode(last.data)
                chunk.setdefault("system_fingerprint", decoded["system_fingerprint"])
                out[-1] = encode_sse(chunk, last.event)
    written = b"".join(out)
    outcome = Outcome(None, client_events(written), done, count, decoder.pending, snapshot(tracker))
    return outcome, written


def forward(
    chunks: list[bytes], route: Route, tracker_ids: bool, exposure: Exposure
) -> tuple[Outcome, bytes]:
    forwarder = StreamForwarder(OutputTracker(route, token_ids=tracker_ids), exposure)
    out: list[bytes] = []
    for now, chunk in enumerate(chunks):
        try:
            out.append(forwarder.feed(chunk, float(now)))
        except UpstreamError as exc:
            return Outcome((type(exc), now), [], False, 0, True, ()), b""
    out.append(forwarder.flush())  # as the relay does at the end
    written = b"".join(out)
    outcome = Outcome(
        None,
        client_events(written),
        forwarder.done,
        forwarder.events,
        forwarder.pending,
        snapshot(forwarder.tracker),
    )
    return outcome, written


@settings(max_examples=150, deadline=None)
@given(stream=vllm_streams(), data=st.data())
def test_forwarder_matches_the_general_path_however_split(
    stream: EngineStream, data: st.DataObject
) -> None:
    offsets = data.draw(st.lists(st.integers(0, len(stream.body)), max_size=12))
    chunks = cut(stream.body, offsets)
    for exposure in ALL_EXPOSURES:
        expected, _ = reference(chunks, stream.route, stream.tracker_ids, exposure)
        got, written = forward(chunks, stream.route, stream.tracker_ids, exposure)
        got.same_as(expected)
        if exposure == EVERYTHING and stream.lf and got.error is None:
            # Nothing to remove: the engine's own bytes, less [DONE].
            assert written == stream.body.replace(DONE_BLOCK, b"")


@pytest.mark.parametrize("exposure", ALL_EXPOSURES, ids=str)
@pytest.mark.parametrize("stream", ALL, ids=lambda s: s.name)
def test_forwarder_on_recorded_streams_whole_and_byte_by_byte(
    stream: Stream, exposure: Exposure
) -> None:
    body = stream.body
    expected, _ = reference([body], stream.route, stream.token_ids, exposure)
    assert expected.error is None
    assert (expected.done, expected.events) == (stream.done, stream.events)
    for chunks in ([body], [body[i : i + 1] for i in range(len(body))]):
        got, _ = forward(chunks, stream.route, stream.token_ids, exposure)
        got.same_as(reference(chunks, stream.route, stream.token_ids, exposure)[0])


@pytest.mark.parametrize("stream", [VLLM_CHAT, VLLM_COMPLETION], ids=lambda s: s.name)
def test_forwarder_on_recorded_streams_split_at_every_offset(stream: Stream) -> None:
    body = stream.body
    for offset in range(len(body) + 1):
        chunks = [body[:offset], body[offset:]]
        for exposure in (NOTHING, EVERYTHING):
            expected, _ = reference(chunks, stream.route, stream.token_ids, exposure)
            assert expected.error is None
            got, written = forward(chunks, stream.route, stream.token_ids, exposure)
            got.same_as(expected)
            if exposure == EVERYTHING:
                assert written == body.replace(b": keep-alive\n\n", b"").replace(DONE_BLOCK, b"")


def test_forwarder_strips_ids_from_a_run_of_plain_events() -> None:
    """The whole second read is one run: it goes out as the engine's bytes less the IDs,
    and less the event that only carried IDs (an empty delta), which is still counted."""
    role = VLLM_CHAT.body.split(b"\n\n")[0] + b"\n\n"
    content = [
        b'{"id":"c","choices":[{"index":0,"delta":{"content":"a"},"token_ids":[1]}]}',
        b'{"id":"c","choices":[{"index":0,"delta":{},"token_ids":[2,3]}]}',
        b'{"id":"c","choices":[{"index":0,"delta":{"content":""},"token_ids":null}]}',
    ]
    forwarder = StreamForwarder(OutputTracker("chat", token_ids=True), NOTHING)
    forwarder.feed(role, 0.0)
    written = forwarder.feed(b"".join(map(frame, content)), 1.0)
    members = (b',"token_ids":[1]', b',"token_ids":[2,3]', b',"token_ids":null')
    stripped = [c.replace(m, b"") for c, m in zip(content, members, strict=True)]
    assert written == frame(stripped[0]) + frame(stripped[2])
    tracker = forwarder.tracker  # one read, one time: one entry
    assert (tracker.tokens, list(tracker.event_times), list(tracker.event_counts)) == (
        3,
        [1.0],
        [3],
    )


def test_forwarder_on_odd_framings_of_plain_events() -> None:
    """Plain data in blocks that are not one `data:` line: named, with an ID, split over
    several lines, CRLF, with a comment inside; compact and spaced."""
    compact = b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[1]}]}'
    spaced = b'{"choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": [1]}]}'
    blocks = []
    for data in (compact, spaced):
        at = data.index(b'"delta"')  # a line break between JSON tokens
        blocks += [
            b"event: delta\ndata: " + data + b"\n\n",
            b"id: 7\ndata: " + data + b"\n\n",
            b"data: " + data[:at] + b"\ndata: " + data[at:] + b"\n\n",
            b"data: " + data + b"\r\n\r\n",
            b"data: " + data + b"\n: inside\n\n",
            frame(data),
        ]
    body = b"".join(blocks) + DONE_BLOCK
    for exposure in ALL_EXPOSURES:
        for offset in range(0, len(body) + 1, 3):
            chunks = [body[:offset], body[offset:]]
            expected, _ = reference(chunks, "chat", True, exposure)
            assert expected.error is None and len(expected.client) == len(blocks)
            got, _ = forward(chunks, "chat", True, exposure)
            got.same_as(expected)


def test_forwarder_keeps_stream_order_within_a_read() -> None:
    """Plain and general events of one read are accounted in stream order: the first
    bad event decides the error, and the first output event's count stays the first."""
    plain_bad = b'{"choices":[{"index":0,"delta":{"content":"a"}}]}'
    engine_bad = b'{"error":{"message":"boom","type":"InternalServerError","code":500}}'
    plain = b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[1]}]}'
    general = b'{"choices":[{"index":0,"delta":{"content":"b"},"token_ids":[2,3,4]}],"usage":null}'
    role = b'{"choices":[{"index":0,"delta":{"role":"assistant"}}],"prompt_token_ids":[1]}'
    reads = [
        [[role], [plain_bad, engine_bad]],
        [[role], [engine_bad, plain_bad]],
        [[role], [plain, general, plain], [general, plain]],
        [[role], [general, plain, general], [plain]],
    ]
    for read_datas in reads:
        chunks = [b"".join(map(frame, datas)) for datas in read_datas]
        for exposure in (NOTHING, EVERYTHING):
            expected, _ = reference(chunks, "chat", True, exposure)
            got, _ = forward(chunks, "chat", True, exposure)
            got.same_as(expected)


FINISHING = (
    b'{"choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"stop","token_ids":[9]}]}'
)
USAGE_ONLY = (
    b'{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3},'
    b'"system_fingerprint":"vllm-0.33.0-x"}'
)
RUNNING = b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[1]}]}'


def test_the_fingerprint_goes_back_on_the_last_chunk_for_clients_without_usage() -> None:
    """vLLM 0.33 moves system_fingerprint from its last chunk to the usage-only chunk
    when it sends one (PROTOCOL.md §2.2): a client that did not ask for usage gets it on
    the last chunk, as from the engine directly, whichever read the usage chunk is in."""
    forwarder = StreamForwarder(OutputTracker("chat", token_ids=True), NOTHING)
    assert forwarder.feed(frame(RUNNING), 0.0)  # output still running: nothing held
    assert forwarder.feed(frame(FINISHING), 1.0) == b""  # held for what may follow
    written = forwarder.feed(frame(USAGE_ONLY) + DONE_BLOCK, 2.0)
    assert written == (
        b'data: {"choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"stop"}],'
        b'"system_fingerprint":"vllm-0.33.0-x"}\n\n'
    )
    assert forwarder.done and forwarder.flush() == b""
    # Everything in one read, and the engine's bytes kept as they were written.
    spaced = b'{"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "a": 1}'
    forwarder = StreamForwarder(OutputTracker("chat", token_ids=False), NOTHING)
    written = forwarder.feed(frame(spaced) + frame(USAGE_ONLY) + DONE_BLOCK, 0.0)
    assert written == b"data: " + spaced[:-1] + b',"system_fingerprint":"vllm-0.33.0-x"}\n\n'
    # A client that asked for usage gets the usage chunk, the fingerprint on it.
    forwarder = StreamForwarder(OutputTracker("chat", token_ids=True), EVERYTHING)
    body = frame(FINISHING) + frame(USAGE_ONLY)
    assert forwarder.feed(body + DONE_BLOCK, 0.0) == body


def test_a_held_last_chunk_is_released_by_whatever_comes_next() -> None:
    """The last chunk is never lost or reordered: a usage chunk without a fingerprint, a
    choice that starts after another finished, [DONE], or the end of the stream (flush)
    each let it go, unchanged."""
    usage_plain = b'{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}'
    second = b'{"choices":[{"index":1,"delta":{"content":"b"},"token_ids":[2]}]}'
    for then in (frame(usage_plain), frame(second), DONE_BLOCK, None):
        forwarder = StreamForwarder(OutputTracker("chat", token_ids=True), NOTHING)
        assert forwarder.feed(frame(FINISHING), 0.0) == b""
        written = forwarder.feed(then, 1.0) if then is not None else forwarder.flush()
        assert written.startswith(frame(FINISHING).replace(b',"token_ids":[9]', b""))
        assert b"system_fingerprint" not in written and forwarder.flush() == b""


ERRORS = [
    (b'{"error":{"message":"boom","type":"InternalServerError","code":500}}', EngineError),
    (b'{"object":"error","message":"boom","type":"BadRequestError","code":400}', EngineError),
    (b'{"error":"boom"}', EngineError),
    (b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[true]}]}', TokenIdError),
    (b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[1.0]}]}', TokenIdError),
    (b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[-1]}]}', TokenIdError),
    (b'{"choices":[{"index":0,"delta":{"content":"a"}}]}', TokenIdError),
    (b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":null}]}', TokenIdError),
    (b'{"choices":[1]}', EngineOutputError),
    (b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[1]}', EngineOutputError),
]


@pytest.mark.parametrize(("bad", "error"), ERRORS)
def test_an_error_event_mid_stream_raises_like_the_general_path(
    bad: bytes, error: type[UpstreamError]
) -> None:
    events = VLLM_CHAT.body.replace(b": keep-alive\n\n", b"").split(b"\n\n")
    body = b"\n\n".join([*events[:2], b"data: " + bad, *events[2:]])
    for exposure in (NOTHING, EVERYTHING):
        # Inside a run (all but the first event), and as the event a chunk finishes.
        start = body.index(bad)
        for chunks in ([body[:10], body[10:]], [body[:start], body[start:]]):
            expected, _ = reference(chunks, "chat", True, exposure)
            got, _ = forward(chunks, "chat", True, exposure)
            assert expected.error is not None and expected.error[0] is error
            got.same_as(expected)


# --- 6. StreamCollector ---------------------------------------------------------------


def collect(
    chunks: list[bytes], route: Route, tracker_ids: bool, exposure: Exposure
) -> tuple[str, Any]:
    tracker = OutputTracker(route, token_ids=tracker_ids)
    assembler = Assembler(route, exposure)
    collector = StreamCollector(tracker, assembler)
    try:
        for now, chunk in enumerate(chunks):
            assert collector.feed(chunk, float(now)) == b""
        tokens, _ = tracker.output_tokens()
        result = assembler.result(prompt_tokens=3, completion_tokens=tokens)
    except UpstreamError as exc:
        return "raised", type(exc)
    return "result", (result, collector.done, collector.events, collector.pending)


@settings(max_examples=100, deadline=None)
@given(stream=vllm_streams(), exposure=st.sampled_from(ALL_EXPOSURES), data=st.data())
def test_collector_assembles_the_same_however_split(
    stream: EngineStream, exposure: Exposure, data: st.DataObject
) -> None:
    offsets = data.draw(st.lists(st.integers(0, len(stream.body)), max_size=12))
    whole = collect([stream.body], stream.route, stream.tracker_ids, exposure)
    assert collect(cut(stream.body, offsets), stream.route, stream.tracker_ids, exposure) == whole


@pytest.mark.parametrize("stream", ALL, ids=lambda s: s.name)
def test_collector_on_recorded_streams_byte_by_byte(stream: Stream) -> None:
    body = stream.body
    whole = collect([body], stream.route, stream.token_ids, EVERYTHING)
    assert whole[0] == "result"
    by_byte = [body[i : i + 1] for i in range(len(body))]
    assert collect(by_byte, stream.route, stream.token_ids, EVERYTHING) == whole


# --- Undeclared fields, escaped keys ------------------------------------------------

FIRST = frame(b'{"id":"c","choices":[{"index":0,"delta":{"content":"x"},"token_ids":[1]}]}')
UNDECLARED = (
    b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[1],"weight_versions":%s}]}'
)


def splits(bad: bytes) -> list[list[bytes]]:
    """`bad` inside a run, and as the held event a chunk finishes (`feed`'s events)."""
    return [[FIRST, FIRST + frame(bad)], [FIRST + frame(bad)[:-1], b"\n"]]


def refused_like_the_general_path(bad: bytes) -> None:
    with pytest.raises(EngineOutputError):
        decode_event(bad)
    assert decode_plain(bad) is None
    for chunks in splits(bad):
        expected, _ = reference(chunks, "chat", True, EVERYTHING)
        assert expected.error == (EngineOutputError, 1)
        got, _ = forward(chunks, "chat", True, EVERYTHING)
        assert got.error == expected.error


@pytest.mark.parametrize("value", [b'"\xff"', b'"\xed\xa0\x80"', b'{"\xc3":1}'])
def test_invalid_utf8_in_an_undeclared_field_is_refused(value: bytes) -> None:
    # msgspec skips a field the struct does not declare without checking its UTF-8.
    refused_like_the_general_path(UNDECLARED % value)


def test_a_valid_json_number_beyond_double_range_in_an_unread_field_is_forwarded() -> None:
    """A documented difference: `1e400` is valid JSON, which msgspec's dict decoder
    refuses (the general path's 502) and the fast path, which never reads that field,
    forwards as the engine wrote it. Forwarded bytes are always valid JSON in valid UTF-8;
    only values Narwhal reads are checked beyond that."""
    event = UNDECLARED % b"1e400"
    with pytest.raises(EngineOutputError):
        decode_event(event)
    assert decode_plain(event) is not None
    tracker = OutputTracker("chat", token_ids=True)
    raw = b"data: " + event + b"\n\n"
    assert StreamForwarder(tracker, EVERYTHING).feed(raw, 0.0) == raw
    assert tracker.tokens == 1


@pytest.mark.parametrize(
    "bad",
    [
        # The choice's key spelled with an escape, and a literal nested one to cut.
        b'{"choices":[{"index":0,"delta":{"content":"a","token_ids":[9]},"token\\u005fids":[1]}]}',
        # The same key twice: the last wins on both paths.
        b'{"choices":[{"index":0,"delta":{"content":"a"},"token\\u005fids":[1],"token_ids":[2]}]}',
    ],
)
def test_an_escaped_token_ids_key_is_stripped_like_the_general_path(bad: bytes) -> None:
    for chunks in splits(bad):
        for exposure in (NOTHING, EVERYTHING):
            expected, _ = reference(chunks, "chat", True, exposure)
            assert expected.error is None
            got, _ = forward(chunks, "chat", True, exposure)
            got.same_as(expected)


def test_vllm_completion_chunks_take_the_fast_path_and_lose_both_id_lists() -> None:
    """vLLM's completion chunks after the first carry `"prompt_token_ids": null`: they are
    plain, and a client that did not ask for IDs gets them without either key."""
    event = (
        b'{"id":"cmpl","object":"text_completion","choices":[{"index":0,"text":" Paris",'
        b'"logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[12366],'
        b'"prompt_token_ids":null}]}'
    )
    plain = decode_plain(event)
    assert plain is not None and id_list_keys(plain) == 2
    raw = b"data: " + event + b"\n\n"
    out = strip_token_ids(raw * 3, 6, prompt_nulls=True)
    assert out is not None
    assert out.count(b"token_ids") == 0
    assert json.loads(out.split(b"\n\n")[0][6:]) == {
        "id": "cmpl",
        "object": "text_completion",
        "choices": [
            {
                "index": 0,
                "text": " Paris",
                "logprobs": None,
                "finish_reason": None,
                "stop_reason": None,
            }
        ],
    }
    # A nested `prompt_token_ids` would be cut too: the counts refuse it.
    nested = raw.replace(b'"logprobs":null', b'"logprobs":{"prompt_token_ids":null}')
    assert strip_token_ids(nested, 2, prompt_nulls=True) is None


@pytest.mark.parametrize("sink", ["forwarder", "collector"])
def test_an_event_nested_too_deeply_fails_the_attempt(sink: str) -> None:
    deep = b'data: {"choices":[],"x":' + b"[" * 5000 + b"]" * 5000 + b"}\n\n"
    tracker = OutputTracker("chat", token_ids=True)
    target = (
        StreamForwarder(tracker, NOTHING)
        if sink == "forwarder"
        else StreamCollector(tracker, Assembler("chat", NOTHING))
    )
    with pytest.raises(EngineOutputError):
        target.feed(deep, 0.0)


def test_single_takes_exactly_one_whole_data_event() -> None:
    decoder = SSEDecoder()
    assert decoder.single(b"data: {}\n\n") is None  # the stream's first bytes: BOM check
    assert [e.data for e in decoder.feed(b"data: {}\n\n")] == [b"{}"]
    assert decoder.single(b'data: {"a":1}\n\n') == b'{"a":1}'
    for other in (
        b"data: 1\n\ndata: 2\n\n",  # two events
        b"data: 1\n",  # unfinished
        b"data: 1\r\n\r\n",  # CR line ends
        b": keep-alive\n\n",  # a comment
        b"event: x\ndata: 1\n\n",  # a named event
        b"data:1\n\n",  # no space after the colon
        b"data: 1\ndata: 2\n\n",  # two data lines
    ):
        assert decoder.single(other) is None, other
    assert decoder.feed(b"data: 3") == []
    assert decoder.single(b"data: 4\n\n") is None  # an event is pending
    assert [e.data for e in decoder.feed(b"\n\n")] == [b"3"]


def test_forwarder_single_event_reads_equal_whole_stream_reads() -> None:
    """A live stream arrives an event per read: the single-event path must give the same
    client bytes and accounting as reading the whole stream at once."""
    for stream in (VLLM_CHAT, VLLM_COMPLETION):
        for exposure in (NOTHING, EVERYTHING):
            raw = stream.body
            blocks = [b + b"\n\n" for b in raw.split(b"\n\n") if b]
            route = stream.route
            whole = StreamForwarder(OutputTracker(route, token_ids=True), exposure)
            expected = whole.feed(raw, 1.0)
            one_by_one = StreamForwarder(OutputTracker(route, token_ids=True), exposure)
            got = b"".join(one_by_one.feed(block, 1.0) for block in blocks)
            assert got == expected
            assert one_by_one.tracker.tokens == whole.tracker.tokens
            assert one_by_one.done and one_by_one.events == whole.events
