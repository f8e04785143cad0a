"""The SSE decoder, tested like h11: whole, byte by byte, split at every offset."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.protocol.sse import (
    EventTooLarge,
    NoEventInLimit,
    SSEDecoder,
    SSEEvent,
    format_event,
    is_done,
)
from tests.protocol.streams import ALL, VLLM_CHAT, Stream, with_line_ends


def decode(*chunks: bytes) -> tuple[list[SSEEvent], bool]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    events.extend(decoder.close())
    return events, decoder.pending


def fields(events: list[SSEEvent]) -> list[tuple[bytes, str | None, str | None]]:
    return [(e.data, e.event, e.id) for e in events]


def byte_by_byte(body: bytes) -> list[bytes]:
    return [body[i : i + 1] for i in range(len(body))]


def without_comments(body: bytes) -> bytes:
    return body.replace(b": keep-alive\n\n", b"")


@pytest.mark.parametrize("stream", ALL, ids=lambda s: s.name)
def test_recorded_stream_whole(stream: Stream) -> None:
    events, pending = decode(stream.body)
    assert len(events) == stream.events
    assert not pending
    assert is_done(events[-1]) is stream.done
    # Every byte of the stream except comment blocks is in exactly one event's raw.
    assert b"".join(e.raw for e in events) == without_comments(stream.body)


@pytest.mark.parametrize("stream", ALL, ids=lambda s: s.name)
def test_recorded_stream_byte_by_byte_and_every_split(stream: Stream) -> None:
    whole, _ = decode(stream.body)
    assert decode(*byte_by_byte(stream.body)) == (whole, False)
    body = stream.body
    for offset in range(len(body) + 1):
        assert decode(body[:offset], body[offset:]) == (whole, False), offset


def test_three_way_splits_of_a_small_stream() -> None:
    body = b'data: {"a":1}\n\n: c\n\nevent: e\ndata: x\ndata: y\n\ndata: [DONE]\n\n'
    whole, _ = decode(body)
    for i in range(len(body) + 1):
        for j in range(i, len(body) + 1):
            assert decode(body[:i], body[i:j], body[j:]) == (whole, False), (i, j)


@pytest.mark.parametrize("end", [b"\r\n", b"\r"], ids=["crlf", "cr"])
@pytest.mark.parametrize("stream", ALL, ids=lambda s: s.name)
def test_crlf_and_cr_line_ends(stream: Stream, end: bytes) -> None:
    lf_events, _ = decode(stream.body)
    body = with_line_ends(stream.body, end)
    whole, pending = decode(body)
    assert fields(whole) == fields(lf_events)
    assert not pending
    for chunks in ([body], byte_by_byte(body)):
        events, _ = decode(*chunks)
        assert fields(events) == fields(whole)
    for offset in range(len(body) + 1):
        events, pending = decode(body[:offset], body[offset:])
        assert fields(events) == fields(whole), offset
        assert not pending
        for event in events:
            # Each raw is the event's own bytes: it decodes alone to the same event.
            assert fields(decode(event.raw)[0]) == [(event.data, event.event, None)]


def test_crlf_raw_is_exact_unless_a_cr_ending_an_event_closes_a_chunk() -> None:
    body = b"data: a\r\n\r\ndata: b\r\n\r\n"
    events, _ = decode(body)
    assert [e.raw for e in events] == [b"data: a\r\n\r\n", b"data: b\r\n\r\n"]
    # The CR of the blank line ends the event at once (no waiting for more bytes);
    # the LF that follows in the next chunk belongs to no event.
    events, _ = decode(body[:10], body[10:])
    assert [e.raw for e in events] == [b"data: a\r\n\r", b"data: b\r\n\r\n"]


def test_cr_at_chunk_end_then_lf_is_one_line_end() -> None:
    # Were "\r" and "\n" two line ends, the blank line would end the event early.
    events, _ = decode(b"data: a\r", b"\ndata: b\r", b"\n\r\n")
    assert fields(events) == [(b"a\nb", None, None)]
    assert events[0].raw == b"data: a\r\ndata: b\r\n\r\n"


def test_mixed_line_ends() -> None:
    events, _ = decode(b"data: a\rdata: b\ndata: c\r\n\ndata: d\n\r\n")
    assert fields(events) == [(b"a\nb\nc", None, None), (b"d", None, None)]


def test_comments_are_skipped() -> None:
    events, pending = decode(b": keep-alive\n\n:\n\ndata: x\n: inside\ndata: y\n\n: tail\n\n")
    assert fields(events) == [(b"x\ny", None, None)]
    assert events[0].raw == b"data: x\n: inside\ndata: y\n\n"
    assert not pending


def test_multi_line_data_joins_with_lf() -> None:
    events, _ = decode(b'data: {\ndata:  "a": 1\ndata: }\n\n')
    assert events[0].data == b'{\n "a": 1\n}'


def test_field_without_space_and_without_colon() -> None:
    events, _ = decode(b"data:x\n\ndata\n\ndata:\ndata\n\n")
    assert [e.data for e in events] == [b"x", b"", b"\n"]


def test_only_one_leading_space_is_removed() -> None:
    events, _ = decode(b"data:  x \n\n")
    assert events[0].data == b" x "


def test_named_event_as_sglang_frames_its_ids() -> None:
    body = b'event: sglext_ids\ndata: {"sglext":{}}\n\ndata: {"a":1}\n\n'
    events, _ = decode(body)
    assert [(e.event, e.data) for e in events] == [
        ("sglext_ids", b'{"sglext":{}}'),
        (None, b'{"a":1}'),
    ]
    assert events[0].raw == b'event: sglext_ids\ndata: {"sglext":{}}\n\n'


def test_event_name_resets_after_each_block() -> None:
    events, _ = decode(b"event: a\n\ndata: x\n\nevent:\ndata: y\n\n")
    assert [(e.event, e.data) for e in events] == [(None, b"x"), (None, b"y")]


def test_block_without_data_dispatches_nothing() -> None:
    events, pending = decode(b"event: e\nretry: 10\nfoo: bar\n\n\n\n")
    assert events == []
    assert not pending


def test_id_persists_and_null_ids_are_ignored() -> None:
    events, _ = decode(b"id: 1\ndata: a\n\ndata: b\n\nid: x\0y\ndata: c\n\nid\ndata: d\n\n")
    assert [(e.data, e.id) for e in events] == [(b"a", "1"), (b"b", "1"), (b"c", "1"), (b"d", "")]


@pytest.mark.parametrize("split", range(4))
def test_leading_bom_is_dropped_even_when_split(split: int) -> None:
    body = b"\xef\xbb\xbfdata: x\n\n"
    events, pending = decode(body[:split], body[split:])
    assert fields(events) == [(b"x", None, None)]
    assert events[0].raw == b"data: x\n\n"
    assert not pending


def test_bom_only_at_the_start() -> None:
    events, _ = decode(b"data: a\n\n\xef\xbb\xbfdata: b\n\n")
    # Not a BOM any more: the field name is "\ufeffdata", an unknown field.
    assert [e.data for e in events] == [b"a"]


def test_partial_bom_then_eof_is_pending() -> None:
    _, pending = decode(b"\xef\xbb")
    assert pending


def test_unterminated_event_is_dropped_and_pending() -> None:
    for tail in (b'data: {"trunc', b"data: x\n", b"data: x\r", b"data: x\r\n"):
        events, pending = decode(b"data: a\n\n" + tail)
        assert [e.data for e in events] == [b"a"]
        assert pending, tail


def test_empty_feeds_are_harmless() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"") == []
    assert decoder.feed(b"data: a") == []
    assert decoder.feed(b"") == []
    assert [e.data for e in decoder.feed(b"\n\n")] == [b"a"]
    assert not decoder.pending


def test_several_events_in_one_read_and_a_partial_one() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(b"data: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4")
    assert [e.data for e in events] == [b"1", b"2", b"3"]
    assert decoder.pending
    assert [e.data for e in decoder.feed(b"\n\n")] == [b"4"]


def test_is_done() -> None:
    events, _ = decode(b"data: [DONE]\n\ndata:[DONE]\n\ndata: [DONE] \n\n")
    assert [is_done(e) for e in events] == [True, True, False]


def test_format_event_round_trips() -> None:
    for data, event in ((b'{"a":1}', None), (b"x\ny", "sglext_ids"), (b"", None)):
        events, _ = decode(format_event(data, event))
        assert fields(events) == [(data, event, None)]
    assert format_event(b'{"a":1}') == b'data: {"a":1}\n\n'


def test_raw_of_the_fast_path_is_the_input() -> None:
    events, _ = decode(VLLM_CHAT.body)
    assert events[1].raw.startswith(b"data: {") and events[1].raw.endswith(b"}\n\n")


# --- the event size limit -------------------------------------------------------------------


def decode_within(limit: int, *chunks: bytes) -> list[SSEEvent] | None:
    """The events, or None when the decoder refused an event as too large."""
    decoder = SSEDecoder(max_event_bytes=limit)
    events: list[SSEEvent] = []
    try:
        for chunk in chunks:
            events.extend(decoder.feed(chunk))
    except EventTooLarge as error:
        assert error.limit == limit
        assert "fleet.max_event_bytes" in error.message
        return None
    return events


def every_split(body: bytes) -> list[list[bytes]]:
    return [[body], byte_by_byte(body)] + [[body[:i], body[i:]] for i in range(len(body) + 1)]


@pytest.mark.parametrize(
    "block",
    [
        b"data: " + b"x" * 50 + b"\n\n",  # the fast path's shape
        b"event: e\nid: 7\ndata: a\ndata: " + b"x" * 30 + b"\n\n",
        b": a comment\ndata: " + b"x" * 40 + b"\n\n",
    ],
    ids=["one-line", "fields", "comment"],
)
def test_an_event_at_the_limit_passes_and_one_byte_more_fails_however_split(block: bytes) -> None:
    body = b"data: 1\n\n" + block + b"data: 2\n\n"
    limit = len(block)  # the event's raw, blank line included
    for chunks in every_split(body):
        events = decode_within(limit, *chunks)
        assert events is not None and [e.raw for e in events][1] == block, chunks
        assert decode_within(limit - 1, *chunks) is None, chunks


def test_crlf_events_are_limited_too() -> None:
    body = b"data: a\r\ndata: " + b"x" * 40 + b"\r\n\r\n"
    for chunks in every_split(body):
        assert decode_within(len(body), *chunks) is not None
        assert decode_within(len(body) - 2, *chunks) is None


@pytest.mark.parametrize("piece", [b"x", b"x" * 7, b"data: x\n", b": ping\n"], ids=repr)
def test_an_unfinished_event_is_refused_as_soon_as_it_passes_the_limit(piece: bytes) -> None:
    """A line that never ends, or a block whose blank line never comes: the decoder holds
    at most `limit` bytes of it, whatever the read size."""
    limit = 1000
    decoder = SSEDecoder(max_event_bytes=limit)
    assert [e.data for e in decoder.feed(b"data: before\n\n")] == [b"before"]
    held = 0
    with pytest.raises(EventTooLarge):
        while True:
            decoder.feed(piece)
            held += len(piece)
            assert held <= limit
    assert held + len(piece) > limit


def test_the_fast_paths_keep_the_limit() -> None:
    big = b"data: " + b"x" * 100 + b"\n\n"
    decoder = SSEDecoder(max_event_bytes=len(big) - 1)
    assert decoder.single(big) is None
    with pytest.raises(EventTooLarge):
        decoder.feed_run(big)
    decoder = SSEDecoder(max_event_bytes=len(big) - 1)
    with pytest.raises(EventTooLarge):
        decoder.feed_run(b"data: 1\n\n" * 20 + big + b"data: 2\n\n")
    decoder = SSEDecoder(max_event_bytes=len(big))
    _, _, datas = decoder.feed_run(b"data: 1\n\n" * 20 + big)
    assert len(datas) == 21 and datas[-1] == big[6:-2]


def test_a_slowly_growing_event_costs_linear_time() -> None:
    """Each read that ends a line is parsed from that line on, never from the block's
    start: 2 MiB of lines that come 16 bytes at a time, or a line that comes a byte at a
    time, take well under a second (re-reading the block on each read took minutes)."""
    decoder = SSEDecoder(max_event_bytes=4 << 20)
    line = b"data: " + b"x" * 9 + b"\n"
    started = time.monotonic()
    for _ in range((2 << 20) // len(line)):
        assert decoder.feed(line) == []
    events = decoder.feed(b"\n")
    assert len(events) == 1 and len(events[0].raw) > 2 << 20
    assert events[0].data == b"\n".join([b"x" * 9] * ((2 << 20) // len(line)))
    decoder.feed(b"data: ")
    for _ in range(1 << 19):
        decoder.feed(b"y")
    assert [e.data for e in decoder.feed(b"\n\n")] == [b"y" * (1 << 19)]
    assert time.monotonic() - started < 5


# --- lines that are no event: bounded, counted, skipped at data speed --------------------


def reference(body: bytes) -> list[tuple[bytes, str | None, str | None]]:
    """The SSE rules, a line at a time, on a whole stream: what the decoder must match."""
    body = body.removeprefix(b"\xef\xbb\xbf")
    data: list[bytes] | None = None
    event: str | None = None
    last_id: str | None = None
    out = []
    for line in re.split(rb"\r\n|\r|\n", body)[:-1]:  # (the last piece is unterminated)
        if not line:
            if data is not None:
                out.append((b"\n".join(data), event, last_id))
            data, event = None, None
            continue
        if line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        value = value.removeprefix(b" ")
        if name == b"data":
            data = [*(data or []), value]
        elif name == b"event":
            event = value.decode("utf-8", "replace") or None
        elif name == b"id" and b"\0" not in value:
            last_id = value.decode("utf-8", "replace")
    return out


# Lines of every kind (blank ones most often) and every line end, in any order.
LINES = [
    b"", b"", b"", b"data: x", b"data", b"data:y", b"data:  z", b"datax: q", b":", b": c",
    b": data: no", b"event: e", b"event", b"event:", b"eventy: f", b"event: g", b"id: 1",
    b"id", b"id: \0", b"id:2", b"retry: 3", b"x",
]  # fmt: skip
ENDS = [b"\n", b"\n", b"\r", b"\r\n"]


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(LINES), st.sampled_from(ENDS)), max_size=30),
    st.lists(st.integers(min_value=0, max_value=300), max_size=4),
)
def test_any_mix_of_lines_decodes_as_the_rules_say_however_split(
    lines: list[tuple[bytes, bytes]], cuts: list[int]
) -> None:
    body = b"".join(line + end for line, end in lines)
    expected = reference(body)
    offsets = sorted({min(c, len(body)) for c in cuts})
    chunks = [body[i:j] for i, j in zip([0, *offsets], [*offsets, len(body)], strict=True)]
    events, _ = decode(*chunks)
    assert fields(events) == expected
    # The relay's path (`single`, then `feed_run`) gives the same data.
    decoder = SSEDecoder()
    datas: list[bytes] = []
    for chunk in chunks:
        one = decoder.single(chunk)
        if one is not None:
            datas.append(one)
            continue
        dispatched, _, run = decoder.feed_run(chunk)
        datas += [e.data for e in dispatched] + run
    assert datas == [data for data, _, _ in expected]
    # Every event's raw is its own block: alone, it decodes to the same event.
    for sse in decode(body)[0]:
        assert [(e.data, e.event) for e in decode(sse.raw)[0]] == [(sse.data, sse.event)]


FLOODS = [
    b":\n\n", b"\n", b"\r", b"\r\n", b": keep-alive\n\n", b":\r\n\r\n", b"event: x\n\n",
    b"id: 1\n\n", b"retry: 5\r\r", b"foo\n\n", b"datax: 1\n\n",
]  # fmt: skip


@pytest.mark.parametrize("flood", FLOODS, ids=repr)
@pytest.mark.parametrize("read", [1, 7, 4096, 1 << 16])
def test_a_flood_of_lines_without_an_event_is_refused_past_the_limit(
    flood: bytes, read: int
) -> None:
    """Comments, blank lines, blocks with no data: they count toward the limit until an
    event comes, and past it the engine is refused (it was unbounded, and each such line
    cost a Python loop turn)."""
    limit = 4096
    body = flood * (2 * limit // len(flood))
    decoder = SSEDecoder(max_event_bytes=limit)
    assert [e.data for e in decoder.feed(b"data: before\n\n")] == [b"before"]
    fed = 0
    with pytest.raises(NoEventInLimit) as refused:
        for i in range(0, len(body), read):
            decoder.feed(body[i : i + read])
            fed += read
    assert fed <= limit
    assert refused.value.limit == limit and "without an event" in refused.value.message
    assert isinstance(refused.value, EventTooLarge)  # (one framing fault, as for events)


def test_lines_without_an_event_count_toward_the_next_event_however_split() -> None:
    gap = b": keep-alive\n\n" * 3 + b"\n\r\nevent: gone\n\nid: 9\n\n"
    event = b"data: x\n\n"
    body = b"data: 1\n\n" + gap + event + b"data: 2\n\n"
    limit = len(gap) + len(event)
    for chunks in every_split(body):
        events = decode_within(limit, *chunks)
        assert events is not None, chunks
        assert [(e.data, e.event, e.id) for e in events] == [
            (b"1", None, None),
            (b"x", None, "9"),
            (b"2", None, "9"),
        ]
        assert decode_within(limit - 1, *chunks) is None, chunks


def test_each_event_starts_a_new_count_and_the_total_is_kept() -> None:
    """A keep-alive between every two events, for far more than the limit in all."""
    limit = 4096
    decoder = SSEDecoder(max_event_bytes=limit)
    gap = b":" * 100 + b"\n\n"
    body = (gap * 30 + b"data: x\n\n") * 10
    events = [e for i in range(0, len(body), 1000) for e in decoder.feed(body[i : i + 1000])]
    assert [e.data for e in events] == [b"x"] * 10
    assert decoder.ignored == 10 * 30 * len(gap) > limit


@pytest.mark.parametrize(
    "flood", [b":\n\n", b"\n", b"event: x\n", b": keep-alive\r\n\r\n", b"datax\n\n"], ids=repr
)
def test_lines_without_an_event_are_parsed_at_data_speed(flood: bytes) -> None:
    """16 MiB of them in 64 KiB reads: well under a second (a line at a time, they took
    2 to 10 s; whole data events go at about 1 GB/s)."""
    decoder = SSEDecoder(max_event_bytes=32 << 20)
    read = flood * ((1 << 16) // len(flood))
    started = time.perf_counter()
    for _ in range((16 << 20) // len(read)):
        assert decoder.feed(read) == []
    assert time.perf_counter() - started < 1.0
    assert [e.data for e in decoder.feed(b"\n\ndata: x\n\n")] == [b"x"]
