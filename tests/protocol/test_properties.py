"""Property tests: generated engine streams, split anywhere, give the same response.

A strategy builds a valid vLLM-shaped stream (PROTOCOL.md §1.2, §1.3, §2.2, §2.3):
content, reasoning, tool-call fragments of several calls interleaved, empty deltas
that carry held-back IDs, logprobs, the finishing chunk (possibly with the last
argument fragment), continuous and final usage. It is serialised to SSE with LF,
CRLF or CR line ends and keep-alive comments, cut at random byte offsets, and run
through decode → validate → assemble. The result must equal the result of the
unsplit stream and what the generated script says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.protocol.assembly import Assembler
from narwhal.protocol.events import Route, decode_event
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.sse import SSEDecoder, is_done
from narwhal.protocol.tokens import count_event_token_ids

IDS = Exposure(token_ids=True, usage=True, continuous_usage=False)
PROMPT_IDS = [1, 2, 3, 4, 5]
PROMPT_TOKENS = len(PROMPT_IDS)

texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=6)
nonempty = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=6)
token_ids = st.lists(st.integers(0, 2**31), min_size=1, max_size=3)


@dataclass
class Script:
    route: Route
    events: list[dict[str, Any]] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    text: dict[str, str] = field(default_factory=dict)
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    logprobs: list[Any] | None = None
    finish_reason: str = "stop"
    usage: dict[str, int] | None = None


@st.composite
def scripts(draw: st.DrawFn) -> Script:
    route: Route = draw(st.sampled_from(["chat", "completion"]))
    script = Script(route)
    with_logprobs = draw(st.booleans())
    continuous = draw(st.booleans())
    script.logprobs = [] if with_logprobs else None
    head = {"id": "x-1", "object": "chunk", "created": 1, "model": "m"}
    kinds = ["text", "empty"] + (["reasoning", "reasoning_content", "refusal"] * (route == "chat"))

    # Sources of pieces: text pieces in order, and each tool call's fragments in order.
    sources: list[list[tuple[str, Any]]] = [
        [(draw(st.sampled_from(kinds)), draw(texts)) for _ in range(draw(st.integers(0, 8)))]
    ]
    if route == "chat":
        for index in draw(st.lists(st.integers(0, 4), unique=True, max_size=3)):
            call_id, name = draw(nonempty), draw(nonempty)
            args = draw(st.lists(texts, max_size=4))
            script.calls[index] = {"id": call_id, "name": name, "arguments": "".join(args)}
            cut_id, cut_name = draw(st.integers(0, len(call_id))), draw(st.integers(0, len(name)))
            frags: list[tuple[str, Any]] = [
                ("call", {"index": index, "id": call_id[:cut_id], "type": "function",
                          "function": {"name": name[:cut_name]}}),
                ("call", {"index": index, "id": call_id[cut_id:],
                          "function": {"name": name[cut_name:]}}),
            ]  # fmt: skip
            frags += [("call", {"index": index, "function": {"arguments": a}}) for a in args]
            sources.append(frags)

    def emit(choice: dict[str, Any], ids: list[int], **top: Any) -> None:
        choice.setdefault("logprobs", None)
        choice["token_ids"] = ids
        script.output_ids.extend(ids)
        event = {**head, "choices": [choice], **top}
        if continuous:
            event["usage"] = {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": len(script.output_ids),
                "total_tokens": PROMPT_TOKENS + len(script.output_ids),
            }
        script.events.append(event)

    if route == "chat":
        role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
        script.events.append({**head, "choices": [role], "prompt_token_ids": PROMPT_IDS})
        script.text["content"] = ""
    while any(sources):
        source = draw(st.sampled_from([s for s in sources if s]))
        kind, payload = source.pop(0)
        ids = draw(token_ids)
        if kind == "call":
            emit({"index": 0, "delta": {"tool_calls": [payload]}, "finish_reason": None}, ids)
            continue
        choice: dict[str, Any] = {"index": 0, "finish_reason": None}
        if kind == "empty":
            choice["delta" if route == "chat" else "text"] = {} if route == "chat" else ""
        elif route == "completion":
            choice["text"] = payload
            script.text["text"] = script.text.get("text", "") + payload
        else:
            name = "content" if kind == "text" else kind
            # vLLM 0.11.1 to 0.15.1 style: reasoning_content: null rides every delta.
            choice["delta"] = {"reasoning_content": None}
            choice["delta"][name] = payload
            script.text[name] = script.text.get(name, "") + payload
        if script.logprobs is not None and kind != "empty":
            entries = [{"token": payload, "logprob": -0.5, "bytes": None, "top_logprobs": []}]
            if route == "chat":
                choice["logprobs"] = {"content": entries}
                script.logprobs.extend(entries)
            else:
                offset = len(script.logprobs)
                choice["logprobs"] = {"text_offset": [offset], "token_logprobs": [-0.5],
                                      "tokens": [payload], "top_logprobs": [None]}  # fmt: skip
                script.logprobs.append(offset)
        emit(choice, ids)

    script.finish_reason = draw(st.sampled_from(["stop", "length", "tool_calls"]))
    last: dict[str, Any] = {"index": 0, "finish_reason": script.finish_reason, "stop_reason": None}
    last["delta" if route == "chat" else "text"] = {} if route == "chat" else ""
    if script.calls and draw(st.booleans()):
        index = max(script.calls)
        tail = draw(nonempty)
        script.calls[index]["arguments"] += tail
        last["delta"] = {"tool_calls": [{"index": index, "function": {"arguments": tail}}]}
    emit(last, draw(token_ids), kv_transfer_params={"remote_block_ids": [[1]]})
    if draw(st.booleans()):
        script.usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": len(script.output_ids),
            "total_tokens": PROMPT_TOKENS + len(script.output_ids),
        }
        script.events.append({**head, "choices": [], "usage": script.usage})
    elif continuous:
        script.usage = script.events[-1]["usage"]
    return script


@st.composite
def framings(draw: st.DrawFn, events: list[dict[str, Any]]) -> bytes:
    end = draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    out = []
    for event in events:
        if draw(st.integers(0, 4)) == 0:
            out.append(b": keep-alive" + end + end)
        out.append(b"data: " + msgspec.json.encode(event) + end + end)
    out.append(b"data: [DONE]" + end + end)
    return b"".join(out)


def cut(body: bytes, offsets: list[int]) -> list[bytes]:
    points = sorted({min(o, len(body)) for o in offsets})
    return [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]


def run(route: Route, chunks: list[bytes]) -> tuple[dict[str, Any], int]:
    decoder = SSEDecoder()
    assembler = Assembler(route, IDS)
    count = 0
    done = 0
    for chunk in chunks:
        for sse in decoder.feed(chunk):
            if is_done(sse):
                done += 1
                continue
            event = decode_event(sse.data)
            count += count_event_token_ids(event, route)
            assembler.add(event)
    assert done == 1 and not decoder.pending
    return assembler.result(prompt_tokens=PROMPT_TOKENS, completion_tokens=count), count


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_split_stream_assembles_like_the_whole_and_like_the_script(data: st.DataObject) -> None:
    script = data.draw(scripts())
    body = data.draw(framings(script.events))
    offsets = data.draw(st.lists(st.integers(0, len(body)), max_size=12))
    whole, whole_count = run(script.route, [body])
    split, split_count = run(script.route, cut(body, offsets))
    assert (split, split_count) == (whole, whole_count)

    # ... and it is what the script generated.
    assert whole_count == len(script.output_ids)
    choice = whole["choices"][0]
    assert choice["token_ids"] == script.output_ids
    assert choice["finish_reason"] == script.finish_reason
    assert whole["kv_transfer_params"] == {"remote_block_ids": [[1]]}
    expected_usage = script.usage or {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": len(script.output_ids),
        "total_tokens": PROMPT_TOKENS + len(script.output_ids),
    }
    assert whole["usage"] == expected_usage
    if script.route == "completion":
        assert choice["text"] == script.text.get("text", "")
        assert choice["prompt_token_ids"] is None
        if not script.logprobs:  # off, or no chunk carried any
            assert choice["logprobs"] is None
        else:
            assert choice["logprobs"]["text_offset"] == script.logprobs
        return
    assert whole["prompt_token_ids"] == PROMPT_IDS
    message = choice["message"]
    expected_text = dict(script.text)
    if script.calls and expected_text.get("content") == "":
        expected_text["content"] = None  # a call and no text: null, as vLLM answers
    for name in ("content", "reasoning", "reasoning_content", "refusal"):
        assert message.get(name) == expected_text.get(name)
    expected_calls = [
        {"id": c["id"], "type": "function",
         "function": {"name": c["name"], "arguments": c["arguments"]}}
        for _, c in sorted(script.calls.items())
    ]  # fmt: skip
    assert message.get("tool_calls", []) == expected_calls
    if not script.logprobs:
        assert choice["logprobs"] is None
    else:
        assert choice["logprobs"] == {"content": script.logprobs}


lines = st.lists(
    st.one_of(
        st.binary(max_size=8).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
        st.sampled_from([b"data: x", b"data:", b"data", b": c", b"event: e", b"id: 1", b""]),
    ),
    max_size=20,
)


@settings(max_examples=300, deadline=None)
@given(
    parts=lines,
    ends=st.lists(st.sampled_from([b"\n", b"\r\n", b"\r"]), min_size=20, max_size=20),
    data=st.data(),
)
def test_any_event_stream_decodes_the_same_however_split(
    parts: list[bytes], ends: list[bytes], data: st.DataObject
) -> None:
    body = b"".join(line + end for line, end in zip(parts, ends, strict=False))
    offsets = data.draw(st.lists(st.integers(0, len(body)), max_size=10))

    def decode(chunks: list[bytes]) -> tuple[list[tuple[bytes, str | None, str | None]], bool]:
        decoder = SSEDecoder()
        events = [e for c in chunks for e in decoder.feed(c)] + decoder.close()
        for event in events:
            again = SSEDecoder().feed(event.raw)
            assert [(e.data, e.event) for e in again] == [(event.data, event.event)]
        return [(e.data, e.event, e.id) for e in events], decoder.pending

    whole = decode([body])
    assert decode(cut(body, offsets)) == whole
    assert decode([body[i : i + 1] for i in range(len(body))]) == whole
