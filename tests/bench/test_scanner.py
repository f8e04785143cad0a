"""The stream scanner: counts from raw bytes, identical however the stream is split."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.bench.scanner import StreamScanner, count_text_events, count_token_ids


def event(obj: Any, *, spaced: bool = False) -> bytes:
    text = json.dumps(obj) if spaced else json.dumps(obj, separators=(",", ":"))
    return b"data: " + text.encode() + b"\n\n"


def chat_chunk(content: str | None, ids: list[int] | None, finish: str | None = None) -> bytes:
    delta: dict[str, Any] = {} if content is None else {"content": content}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    choice["token_ids"] = ids
    return event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice]})


ROLE = event(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        "prompt_token_ids": [151644, 872, 198],
    }
)
USAGE = event(
    {
        "id": "chatcmpl-1",
        "choices": [],
        "usage": {"prompt_tokens": 3, "total_tokens": 12, "completion_tokens": 9},
    }
)
DONE = b"data: [DONE]\n\n"

# vLLM-shaped chat stream: 9 tokens in 6 events, one of them an empty delta with ids
# (a parser holding text back), one carrying 3 ids (stream_interval > 1).
VLLM_CHAT = (
    ROLE
    + chat_chunk("Hi", [13048])
    + chat_chunk(" there, friend", [1052, 11, 4333])
    + chat_chunk(None, [27])
    + chat_chunk(" [1,2]", [508, 16])
    + chat_chunk(" ok", [5])
    + chat_chunk("!", [0], finish="length")
    + USAGE
    + DONE
)
FIRST_OUTPUT_END = len(ROLE + chat_chunk("Hi", [13048]))  # the blank line that ends it


def scan(pieces: list[bytes], times: list[float] | None = None) -> StreamScanner:
    s = StreamScanner(keep_marks=True)
    for i, piece in enumerate(pieces):
        s.feed(piece, times[i] if times else float(i))
    s.close(99.0)
    return s


def summary(s: StreamScanner) -> tuple[Any, ...]:
    return (s.tokens, s.ids, s.events, s.usage_tokens, s.text_events, s.done, s.error_event)


def test_vllm_chat_stream_whole() -> None:
    s = scan([VLLM_CHAT])
    assert s.tokens == 9 and s.ids == 9
    assert s.events == 8  # role + 6 token chunks + usage; [DONE] is not an event
    assert s.usage_tokens == 9
    assert s.done and s.complete and not s.error_event
    assert s.first_output == 0.0 and s.last_output == 0.0


def test_split_at_every_offset_gives_identical_counts_and_first_output_time() -> None:
    whole = summary(scan([VLLM_CHAT]))
    for cut in range(len(VLLM_CHAT) + 1):
        s = scan([VLLM_CHAT[:cut], VLLM_CHAT[cut:]], [1.0, 2.0])
        assert summary(s) == whole, cut
        # The first output event is complete with the read that holds its blank line.
        assert s.first_output == (1.0 if cut >= FIRST_OUTPUT_END else 2.0), cut


def test_byte_by_byte_times_each_token_at_the_byte_that_completed_its_event() -> None:
    s = scan([VLLM_CHAT[i : i + 1] for i in range(len(VLLM_CHAT))])
    assert summary(s) == summary(scan([VLLM_CHAT]))
    assert s.first_output == FIRST_OUTPUT_END - 1
    assert s.marks is not None
    counts = [int(k) for k in s.marks[1::2]]
    assert counts == [1, 3, 1, 2, 1, 1]  # tokens per event, at that event's time
    assert list(s.marks[0::2]) == sorted(s.marks[0::2])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(VLLM_CHAT)), max_size=8))
def test_any_split_gives_identical_counts(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(VLLM_CHAT)]
    pieces = [VLLM_CHAT[a:b] for a, b in itertools.pairwise(points)]
    assert summary(scan(pieces)) == summary(scan([VLLM_CHAT]))


def test_crlf_comments_and_keepalives_split_anywhere() -> None:
    stream = (
        b": keep-alive\r\n\r\n"
        + ROLE.replace(b"\n", b"\r\n")
        + b": ping\n\n"
        + chat_chunk("a", [1]).replace(b"\n", b"\r")
        + b"event: message\ndata: "
        + chat_chunk("b", [2, 3])[6:]
        + USAGE.replace(b"\n", b"\r\n")
        + b"data: [DONE]\r\n\r\n"
    )
    whole = scan([stream])
    assert (whole.tokens, whole.events, whole.done) == (3, 4, True)
    for cut in range(len(stream) + 1):
        assert summary(scan([stream[:cut], stream[cut:]])) == summary(whole), cut


def test_completions_stream_with_ids() -> None:
    def chunk(text: str, ids: list[int], prompt: list[int] | None = None) -> bytes:
        choice = {"index": 0, "text": text, "finish_reason": None, "token_ids": ids}
        choice["prompt_token_ids"] = prompt
        return event({"id": "cmpl-1", "object": "text_completion", "choices": [choice]})

    stream = chunk(" Paris", [12366], prompt=[791, 6864, 315]) + chunk(".", [13]) + DONE
    s = scan([stream])
    assert (s.tokens, s.events, s.done) == (2, 2, True)


def test_without_ids_one_token_per_content_event_then_usage_wins() -> None:
    stream = ROLE + chat_chunk("a", None) + chat_chunk("bc", None) + chat_chunk(None, None)
    s = scan([stream + DONE])
    assert s.ids == -1 and s.text_events == 2 and s.tokens == 2
    s = scan([stream + USAGE + DONE])
    assert s.text_events == 2 and s.tokens == 9  # usage is exact, events are not


def test_reasoning_under_both_names_counts_once_and_tool_calls_count() -> None:
    both = {"reasoning": "hm", "reasoning_content": "hm"}
    tool = {"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}
    region = event({"choices": [{"delta": both}]}) + event({"choices": [{"delta": tool}]})
    assert count_text_events(region) == 2
    assert count_text_events(event({"choices": [{"delta": {"reasoning_content": None}}]})) == 0


def test_token_id_arrays_null_empty_spaced_and_prompt_ids() -> None:
    assert count_token_ids(b'{"token_ids":null}') == -1
    assert count_token_ids(b'{"token_ids":[]}') == 0
    assert count_token_ids(b'{"prompt_token_ids":[1,2,3]}') == -1
    assert count_token_ids(b'{"token_ids": [1, 2, 3]} {"token_ids": []} {"token_ids":[7]}') == 4
    # text that looks like the key is escaped inside JSON strings
    assert count_token_ids(b'{"content":"\\"token_ids\\":[1,2]","token_ids":[5]}') == 1


def test_spaced_json_stream() -> None:
    stream = (
        event({"choices": [{"delta": {"content": "x"}, "token_ids": [1, 2]}]}, spaced=True)
        + event({"choices": [], "usage": {"completion_tokens": 2}}, spaced=True)
        + DONE
    )
    s = scan([stream])
    assert (s.tokens, s.usage_tokens, s.events) == (2, 2, 2)


def test_error_event_is_flagged() -> None:
    stream = ROLE + chat_chunk("a", [1]) + event({"error": {"message": "x", "code": 500}}) + DONE
    for cut in range(len(stream) + 1):
        s = scan([stream[:cut], stream[cut:]])
        assert s.error_event and s.done and s.tokens == 1, cut


def test_completeness_without_done() -> None:
    truncated = scan([ROLE + chat_chunk("a", [1])])
    assert not truncated.done and not truncated.complete
    finished = scan([ROLE + chat_chunk("a", [1], finish="stop")])
    assert finished.complete
    with_usage = scan([ROLE + chat_chunk("a", [1], finish="stop") + USAGE])
    assert with_usage.complete
    # a final event without its blank line still counts at close()
    unterminated = scan([ROLE + chat_chunk("a", [1]) + b"data: [DONE]"])
    assert unterminated.done and unterminated.events == 2


def test_nothing_arrived() -> None:
    s = scan([])
    assert summary(s) == (0, -1, 0, -1, 0, False, False)
    assert s.first_output == -1.0 and not s.complete


def test_non_streaming_body() -> None:
    body = json.dumps(
        {
            "choices": [{"message": {"content": "hello world"}, "token_ids": [1, 2, 3]}],
            "usage": {"completion_tokens": 3},
            "prompt_token_ids": [9, 9],
        }
    ).encode()
    s = StreamScanner()
    s.scan_body(body, 0.5)
    assert (s.tokens, s.events, s.first_output) == (3, 1, 0.5)
    s = StreamScanner()
    s.scan_body(b'{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":7}}', 1.0)
    assert s.tokens == 7 and not math.isnan(s.first_output)


def test_done_followed_by_comments() -> None:
    stream = chat_chunk("a", [1]) + DONE + b": bye\n\n" + b": " + b"x" * 200 + b"\n\n"
    for cut in range(len(stream) + 1):
        s = scan([stream[:cut], stream[cut:]])
        assert (s.done, s.events, s.tokens) == (True, 1, 1), cut


def test_usage_prompt_and_cached_tokens() -> None:
    s = scan([VLLM_CHAT])
    assert (s.prompt_tokens, s.cached_tokens) == (3, -1)  # no prompt_tokens_details
    usage = {
        "prompt_tokens": 2048,
        "total_tokens": 2057,
        "completion_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 1536},
    }
    detailed = VLLM_CHAT.replace(USAGE, event({"id": "chatcmpl-1", "choices": [], "usage": usage}))
    for cut in range(0, len(detailed), 7):
        s = scan([detailed[:cut], detailed[cut:]])
        assert (s.prompt_tokens, s.cached_tokens, s.usage_tokens) == (2048, 1536, 9), cut


def test_a_whole_body_usage_before_a_long_prompt_token_ids_list() -> None:
    # vLLM puts prompt_token_ids after usage: with a long prompt, far past the tail.
    body = json.dumps(
        {
            "choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 5000, "completion_tokens": 1, "total_tokens": 5001},
            "prompt_token_ids": list(range(100000, 105000)),
        }
    ).encode()
    s = StreamScanner()
    s.scan_body(body, 0.5)
    assert (s.prompt_tokens, s.usage_tokens, s.cached_tokens) == (5000, 1, -1)


def test_usage_keys_inside_generated_text_do_not_count() -> None:
    fake = chat_chunk('"prompt_tokens": 77, "cached_tokens": 5', [1])
    s = scan([ROLE + fake + DONE])
    assert (s.prompt_tokens, s.cached_tokens) == (-1, -1)


def test_inter_token_gaps_from_known_read_times() -> None:
    reads = [
        (ROLE + chat_chunk("Hi", [1]), 0.10),
        (chat_chunk(" a", [2, 3]) + chat_chunk(" b", [4]), 0.13),  # two events in one read
        (b": keep-alive\n\n", 0.15),  # no output: no gap
        (chat_chunk(" c", [5], finish="length"), 0.19),
        (USAGE + DONE, 0.20),
    ]
    for ids in (True, False):  # token ids, or one token per content delta
        s = StreamScanner()
        for data, now in reads:
            s.feed(data if ids else data.replace(b',"token_ids":[', b',"x":['), now)
        s.close(0.21)
        assert s.gap_count == 3  # four output events
        assert list(s.gaps) == pytest.approx([0.03, 0.06]) and s.zero_gaps == 1, ids
        assert math.fsum(s.gaps) == pytest.approx(s.last_output - s.first_output)


def test_inter_token_gaps_byte_by_byte_and_whole() -> None:
    s = scan([VLLM_CHAT[i : i + 1] for i in range(len(VLLM_CHAT))])
    assert s.marks is not None
    times = list(s.marks[0::2])  # each of the 6 output events at the byte that ended it
    assert list(s.gaps) == [b - a for a, b in itertools.pairwise(times)] and s.zero_gaps == 0
    whole = scan([VLLM_CHAT])
    assert len(whole.gaps) == 0 and whole.zero_gaps == 5  # one read: every gap 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(VLLM_CHAT)), max_size=8))
def test_any_split_gives_one_gap_per_output_event_after_the_first(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(VLLM_CHAT)]
    s = scan([VLLM_CHAT[a:b] for a, b in itertools.pairwise(points)])
    assert s.gap_count == 5
    assert math.fsum(s.gaps) == pytest.approx(s.last_output - s.first_output)


def test_a_whole_body_has_no_inter_token_gaps() -> None:
    body = b'{"choices":[{"message":{"content":"a b c"},"token_ids":[1,2,3]}]}'
    s = StreamScanner()
    s.scan_body(body, 0.5)
    assert s.tokens == 3 and s.gap_count == 0
