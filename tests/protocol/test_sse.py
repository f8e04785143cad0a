"""The SSE decoder, tested like h11: whole, byte by byte, split at every offset."""

from __future__ import annotations

import time

import pytest

from narwhal.protocol.sse import EventTooLarge, SSEDecoder, SSEEvent, format_event, is_done
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
