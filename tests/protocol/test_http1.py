"""The HTTP/1.1 response parser, tested like h11: whole, byte by byte, split anywhere."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.protocol.http1 import HTTPProtocolError, ResponseParser


@dataclass
class Parsed:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool
    body_done: bool


def parse(*pieces: bytes, eof: bool = False, max_head: int = 64 * 1024) -> Parsed:
    """Feed the pieces in order, taking the body after each, then maybe the EOF."""
    parser = ResponseParser(max_head=max_head)
    body = []
    for piece in pieces:
        parser.feed(piece)
        body.append(parser.take_body())
    if eof:
        parser.feed_eof()
        body.append(parser.take_body())
    assert parser.head_done
    return Parsed(
        parser.status,
        parser.reason,
        parser.headers,
        b"".join(body),
        parser.keep_alive,
        parser.body_done,
    )


def byte_by_byte(message: bytes) -> list[bytes]:
    return [message[i : i + 1] for i in range(len(message))]


def refused(*pieces: bytes, eof: bool = False, max_head: int = 64 * 1024) -> str:
    """The error message the parser raises for these pieces."""
    with pytest.raises(HTTPProtocolError) as raised:
        parse(*pieces, eof=eof, max_head=max_head)
    return str(raised.value)


def chunked(*chunks: bytes, trailers: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n" + trailers + b"\r\n"


CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
SSE = chunked(b'data: {"a":1}\n\n', b'data: {"b":"\r\n"}\n\n', b"data: [DONE]\n\n")
SSE_BODY = b'data: {"a":1}\n\ndata: {"b":"\r\n"}\n\ndata: [DONE]\n\n'

SAMPLES = {
    "length": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\nhello",
    "chunked": CHUNKED_HEAD + SSE,
    "extensions-and-trailers": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'5;name=value\r\nhello\r\n06 ; a="b;c"\r\n world\r\nA\r\n0123456789\r\n'
        b"0;last\r\nX-Checksum: abc\r\nX-Other:\r\n\r\n"
    ),
    "interim": (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nContent-Length: 3\r\n\r\nabc"
    ),
    "no-content": b"HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n",
}


@pytest.mark.parametrize("name", SAMPLES)
def test_samples_byte_by_byte_and_at_every_split(name: str) -> None:
    message = SAMPLES[name]
    whole = parse(message)
    assert whole.body_done
    assert parse(*byte_by_byte(message)) == whole
    for offset in range(len(message) + 1):
        assert parse(message[:offset], message[offset:]) == whole, offset


def test_three_way_splits_of_a_chunked_message() -> None:
    message = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(b"ab", b"c")
    whole = parse(message)
    for i in range(len(message) + 1):
        for j in range(i, len(message) + 1):
            assert parse(message[:i], message[i:j], message[j:]) == whole, (i, j)


def test_a_content_length_response() -> None:
    parsed = parse(SAMPLES["length"])
    assert parsed == Parsed(200, "OK", {"content-length": "5", "x-a": "1, 2"}, b"hello", True, True)


def test_a_chunked_sse_stream() -> None:
    parsed = parse(CHUNKED_HEAD + SSE)
    assert parsed.body == SSE_BODY
    assert parsed.headers == {"content-type": "text/event-stream", "transfer-encoding": "chunked"}
    assert parsed.keep_alive and parsed.body_done


def test_extensions_and_trailers_are_dropped() -> None:
    parsed = parse(SAMPLES["extensions-and-trailers"])
    assert parsed.body == b"hello world0123456789"
    assert "x-checksum" not in parsed.headers
    assert parsed.keep_alive and parsed.body_done


def test_upper_case_and_zero_padded_chunk_sizes() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    big = bytes(range(256)) * 20  # 5120 bytes: a size past the fast lookup table
    message = head + b"0A\r\n0123456789\r\n%X\r\n%s\r\n0000\r\n\r\n" % (len(big), big)
    assert parse(message).body == b"0123456789" + big
    assert parse(*byte_by_byte(message)).body == b"0123456789" + big


def test_the_body_comes_in_pieces_as_it_arrives() -> None:
    parser = ResponseParser()
    parser.feed(CHUNKED_HEAD + b"a\r\n01234")
    assert parser.head_done and not parser.body_done
    assert parser.take_body() == b"01234"
    assert parser.take_body() == b""
    parser.feed(b"56789\r")
    parser.feed(b"\n3\r\nabc\r\n")
    assert parser.take_body() == b"56789abc"
    parser.feed(b"0\r\n\r\n")
    assert parser.body_done
    assert parser.take_body() == b""


def test_reasons() -> None:
    end = b"\r\nContent-Length: 0\r\n\r\n"
    assert parse(b"HTTP/1.1 200 OK" + end).reason == "OK"
    assert parse(b"HTTP/1.1 404 Not Found" + end).reason == "Not Found"
    assert parse(b"HTTP/1.1 200 " + end).reason == ""
    assert parse(b"HTTP/1.1 200" + end).reason == ""
    assert parse(b"HTTP/1.1 200 Caf\xe9" + end).reason == "Café"


@pytest.mark.parametrize(
    ("head", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n", True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: Upgrade, CLOSE\r\n", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: keep-alive\r\n", True),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\nConnection: Keep-Alive\r\n", True),
        (b"HTTP/1.1 204 No Content\r\n", True),
        (b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n", True),
        # Both framings: chunked is used, but the connection is not trusted again.
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n", False),
        (b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n", False),
    ],
)
def test_keep_alive(head: bytes, keep_alive: bool) -> None:
    body = b"0\r\n\r\n" if b"chunked" in head and b" 304 " not in head else b""
    parsed = parse(head + b"\r\n" + body)
    assert parsed.body_done
    assert parsed.body == b""
    assert parsed.keep_alive is keep_alive


def test_chunked_wins_over_content_length() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n"
    parsed = parse(head + chunked(b"abc"))
    assert (parsed.body, parsed.body_done, parsed.keep_alive) == (b"abc", True, False)


def test_a_body_read_until_close() -> None:
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\n\r\nsome")
    parser.feed(b" bytes")
    assert parser.head_done and not parser.body_done
    assert not parser.keep_alive  # the close is what ends the body
    parser.feed_eof()
    assert parser.body_done
    assert parser.take_body() == b"some bytes"
    assert parse(b"HTTP/1.0 200 OK\r\n\r\nx", eof=True).body == b"x"


def test_no_body_for_204_and_304_whatever_the_headers_say() -> None:
    for status in (b"204 No Content", b"304 Not Modified"):
        parsed = parse(b"HTTP/1.1 " + status + b"\r\nContent-Length: 5\r\n\r\n")
        assert (parsed.body, parsed.body_done, parsed.keep_alive) == (b"", True, True)


def test_a_zero_content_length_is_done_with_the_head() -> None:
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert parser.body_done and parser.keep_alive and parser.take_body() == b""


def test_interim_responses_are_skipped() -> None:
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\n")
    assert not parser.head_done
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    assert parser.status == 200
    assert parser.headers == {"content-length": "2"}
    assert parser.take_body() == b"ok"


def test_identical_repeated_content_lengths_are_one() -> None:
    message = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"
    assert parse(message).body == b"abc"
    assert parse(b"HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\nabc").body == b"abc"


@pytest.mark.parametrize(
    "value",
    [
        *(b"abc", b"-1", b"+5", b"0x10", b"1_0", b"", b"5 5", b"\xb2", b"9" * 19),
        # Whitespace, but not OWS (SP, HTAB): NBSP, NEL, a separator, VT, FF.
        *(b"5\xa0", b"\x855", b"5\x1c", b"5\x0b", b"\x0c5"),
    ],
)
def test_invalid_content_length(value: bytes) -> None:
    message = b"HTTP/1.1 200 OK\r\nContent-Length: " + value + b"\r\n\r\n"
    assert "Content-Length" in refused(message)


def test_conflicting_content_lengths() -> None:
    message = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"
    assert "conflicting Content-Length" in refused(message)


@pytest.mark.parametrize(
    "coding",
    [b"gzip", b"gzip, chunked", b"chunked, chunked", b"identity", b"chunked\xa0", b"\x85chunked"],
)
def test_only_the_chunked_transfer_coding(coding: bytes) -> None:
    message = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: " + coding + b"\r\n\r\n"
    assert "unsupported Transfer-Encoding" in refused(message)


def test_transfer_coding_names_are_case_insensitive() -> None:
    parsed = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding:  Chunked \r\n\r\n" + chunked(b"x"))
    assert parsed.body == b"x"


@pytest.mark.parametrize(
    "size_line", [b"zz", b"0x1a", b" 1a", b"1a ", b"+1a", b"-1", b"1_a", b"", b";ext", b"1\n;x"]
)
def test_invalid_chunk_size_lines(size_line: bytes) -> None:
    message = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size_line + b"\r\n"
    assert "invalid chunk-size line" in refused(message + b"x" * 40)


def test_whitespace_before_chunk_extensions_is_allowed() -> None:
    message = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3 \t;a=b\r\nabc\r\n0\r\n\r\n"
    assert parse(message).body == b"abc"


@pytest.mark.parametrize("after", [b"xx", b"\rx", b"\n\r"])
def test_chunk_data_must_end_with_crlf(after: bytes) -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    message = head + b"3\r\nabc" + after + b"0\r\n\r\n"
    assert "not followed by CRLF" in refused(message)
    assert "not followed by CRLF" in refused(*byte_by_byte(message))


def test_an_overlong_chunk_size_line() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert "chunk-size line longer" in refused(head + b"1;" + b"x" * 9000)
    assert "chunk-size line longer" in refused(head, b"1;", *[b"x" * 100] * 90)


@pytest.mark.parametrize(("length", "too_long"), [(8192, False), (8193, True)])
def test_the_line_limit_does_not_depend_on_the_reads(length: int, too_long: bool) -> None:
    """A chunk-size or trailer line of `length` bytes (CRLF not counted), whole, cut
    between its CR and LF, and byte by byte: the same verdict. (A line of 8192 used to be
    refused when its bytes and the CR waited for the LF, and a longer one accepted when it
    arrived whole.)"""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    size_line = b"1;" + b"x" * (length - 2) + b"\r\n"
    trailer = b"X: " + b"y" * (length - 3) + b"\r\n"
    for before, body in ((b"", size_line + b"a\r\n0\r\n\r\n"), (b"0\r\n", trailer + b"\r\n")):
        message = head + before + body
        cut = len(head) + len(before) + length + 1
        for pieces in ([message], [message[:cut], message[cut:]], byte_by_byte(message)):
            if too_long:
                assert "longer than 8192 bytes" in refused(*pieces, max_head=1 << 20)
            else:
                assert parse(*pieces, max_head=1 << 20).body_done


def test_trailers_are_checked_and_bounded() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"
    assert "without a colon" in refused(head + b"no colon here\r\n\r\n")
    assert "trailer line longer" in refused(head + b"X: " + b"y" * 9000)
    many = b"".join(b"X-%d: %s\r\n" % (i, b"v" * 1000) for i in range(10))
    assert "trailers larger than 4096" in refused(head + many + b"\r\n", max_head=4096)


@pytest.mark.parametrize(
    "status_line",
    [
        b"HTTP/2 200 OK",
        b"HTTP/2.0 200 OK",
        b"HTTP/1.1 20 OK",
        b"HTTP/1.1 2000 OK",
        b"HTTP/1.1 abc OK",
        b"ICY 200 OK",
        b"HTTP/1.1  200 OK",
        b"http/1.1 200 OK",
        b"HTTP/1.1 200 O\nK",
        b"HTTP/1.1 099 Odd",
    ],
)
def test_invalid_status_lines(status_line: bytes) -> None:
    message = status_line + b"\r\nContent-Length: 0\r\n\r\n"
    error = refused(message)
    assert "status" in error


def test_101_is_refused() -> None:
    message = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"
    assert "101" in refused(message)


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b"No-Colon", "without a colon"),
        (b" folded: value", "obs-fold"),
        (b"\tfolded", "obs-fold"),
        (b"Name : value", "invalid header name"),
        (b": value", "invalid header name"),
        (b"Na\x00me: value", "invalid header name"),
        (b"X: a\nb", "invalid character"),
        (b"X: a\rb", "invalid character"),
        (b"X: a\x00b", "invalid character"),
    ],
)
def test_invalid_header_lines(line: bytes, error: str) -> None:
    message = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + line + b"\r\n\r\n"
    assert error in refused(message)


def test_header_values_are_trimmed_and_may_be_empty() -> None:
    message = b"HTTP/1.1 200 OK\r\nX-A:  \t spaced out \t\r\nX-Empty:\r\nContent-Length: 0\r\n\r\n"
    assert parse(message).headers == {"x-a": "spaced out", "x-empty": "", "content-length": "0"}


def test_a_head_larger_than_max_head() -> None:
    head = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"p" * 200 + b"\r\n"
    assert "head larger than 100 bytes" in refused(head + b"\r\n", max_head=100)
    # Refused as soon as it is too large, before its end arrives.
    assert "head larger than 100 bytes" in refused(head, max_head=100)
    assert parse(head + b"Content-Length: 0\r\n\r\n", max_head=300).status == 200


def test_eof_in_the_head_or_a_framed_body_is_an_error() -> None:
    assert "before the response head" in refused(b"", eof=True)
    assert "before the response head" in refused(b"HTTP/1.1 200 OK\r\n", eof=True)
    assert "before the response head" in refused(b"HTTP/1.1 100 Continue\r\n\r\n", eof=True)
    message = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"
    assert "7 body bytes still to come" in refused(message, eof=True)
    assert "last chunk" in refused(CHUNKED_HEAD + b"3\r\nabc\r\n", eof=True)
    assert "last chunk" in refused(CHUNKED_HEAD + b"0\r\n", eof=True)  # trailers unfinished


def test_eof_after_a_complete_message_is_fine() -> None:
    assert parse(SAMPLES["length"], eof=True).body == b"hello"
    assert parse(CHUNKED_HEAD + SSE, eof=True).body == SSE_BODY


def test_after_an_error_every_call_raises() -> None:
    parser = ResponseParser()
    with pytest.raises(HTTPProtocolError, match="status line"):
        parser.feed(b"nonsense\r\n\r\n")
    with pytest.raises(HTTPProtocolError, match="status line"):
        parser.feed(b"HTTP/1.1 200 OK\r\n\r\n")
    with pytest.raises(HTTPProtocolError, match="status line"):
        parser.feed_eof()


@pytest.mark.parametrize(
    "message",
    [SAMPLES["length"], CHUNKED_HEAD + SSE, SAMPLES["no-content"]],
    ids=["length", "chunked", "no-content"],
)
def test_bytes_after_the_message_are_ignored_and_end_keep_alive(message: bytes) -> None:
    whole = parse(message)
    assert whole.keep_alive
    extra = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    for pieces in ([message + extra], [message, extra], [*byte_by_byte(message + extra)]):
        parsed = parse(*pieces)
        assert parsed.body == whole.body and parsed.body_done
        assert not parsed.keep_alive


def test_a_large_chunked_body_byte_by_byte_is_linear() -> None:
    """A 390 kB body in one-byte reads: a 300 kB chunk, short chunks, long extension and
    trailer lines. A parser that recopies what it holds for each byte copies ~45 GB
    here (minutes); a linear one takes about a second, so the bound is generous."""
    pieces = [b"%x\r\n%s\r\n" % (300_000, b"d" * 300_000)]
    for i in range(200):
        data = bytes([i]) * (i * 7 % 1000 + 1)
        ext = b";x=" + b"e" * 2000 if i % 50 == 0 else b""
        pieces.append(b"%x%s\r\n%s\r\n" % (len(data), ext, data))
    body = b"".join(pieces) + b"0\r\n" + b"X-T: " + b"t" * 4000 + b"\r\n\r\n"
    message = CHUNKED_HEAD + body
    assert len(message) > 390_000
    expected = parse(message).body
    started = time.process_time()
    assert parse(*byte_by_byte(message)).body == expected
    assert time.process_time() - started < 8.0


def test_a_large_head_byte_by_byte_is_linear() -> None:
    """A 380 kB head in one-byte reads: recopying it per byte takes ~20 s here, a linear
    parser about 0.2 s."""
    head = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: 0123456789\r\n" * 20_000 + b"\r\n"
    assert len(head) > 380_000
    started = time.process_time()
    parser = ResponseParser(max_head=1 << 20)
    for i in range(len(head)):
        parser.feed(head[i : i + 1])
    assert parser.head_done
    assert time.process_time() - started < 4.0


# -- The property: any valid response, split anywhere, parses like the whole. ----------

tokens = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_!#", min_size=1)
values = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=20
).map(lambda v: v.strip(" \t"))
FRAMING_HEADERS = {"content-length", "transfer-encoding", "connection"}


@dataclass
class Message:
    raw: bytes
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes
    until_close: bool


@st.composite
def chunk_sizes(draw: st.DrawFn, size: int) -> bytes:
    spelling = draw(st.sampled_from(["%x", "%X", "%04x"]))
    return (spelling % size).encode()


@st.composite
def extensions(draw: st.DrawFn) -> bytes:
    if not draw(st.booleans()):
        return b""
    name = draw(tokens).encode()
    value = draw(st.sampled_from([b"", b"=v", b'="a;b c"', b"=123"]))
    return draw(st.sampled_from([b";", b" ;", b"\t; "])) + name + value


@st.composite
def messages(draw: st.DrawFn) -> Message:
    status = draw(st.sampled_from([200, 201, 204, 304, 400, 404, 429, 500, 503, 599]))
    reason = draw(st.text("abcdefgh XYZ-", max_size=12))
    headers: dict[str, str] = {}
    lines = []
    for name, value in draw(st.lists(st.tuples(tokens, values), max_size=6)):
        if name.lower() in FRAMING_HEADERS:
            continue
        lines.append(f"{name}: {value}".encode("latin-1"))
        key = name.lower()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    body = draw(st.binary(max_size=600))
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    if status in (204, 304):
        body = b""
        framing = "none"
    if framing == "length":
        lines.append(b"Content-Length: %d" % len(body))
        headers["content-length"] = str(len(body))
        payload = body
    elif framing == "chunked":
        lines.append(b"Transfer-Encoding: chunked")
        headers["transfer-encoding"] = "chunked"
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=8)))
        parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        payload = b""
        for part in parts:
            if part:
                size = draw(chunk_sizes(len(part)))
                payload += size + draw(extensions()) + b"\r\n" + part + b"\r\n"
        payload += b"0" + draw(extensions()) + b"\r\n"
        for name, value in draw(st.lists(st.tuples(tokens, values), max_size=3)):
            payload += f"{name}: {value}\r\n".encode("latin-1")
        payload += b"\r\n"
    else:
        payload = body
    interim = draw(st.sampled_from([b"", b"HTTP/1.1 100 Continue\r\n\r\n"]))
    head = b"HTTP/1.1 %d %s\r\n" % (status, reason.encode()) + b"".join(
        line + b"\r\n" for line in lines
    )
    raw = interim + head + b"\r\n" + payload
    return Message(raw, status, reason, headers, body, until_close=framing == "close")


@settings(max_examples=400, deadline=None)
@given(message=messages(), data=st.data())
def test_any_valid_response_split_anywhere_parses_like_the_whole(
    message: Message, data: st.DataObject
) -> None:
    raw = message.raw
    offsets = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=12)))
    pieces = [raw[a:b] for a, b in zip([0, *offsets], [*offsets, len(raw)], strict=True)]
    whole = parse(raw, eof=message.until_close)
    assert parse(*pieces, eof=message.until_close) == whole
    assert whole.status == message.status
    assert whole.reason == message.reason
    assert whole.headers == message.headers
    assert whole.body == message.body
    assert whole.body_done
    assert whole.keep_alive is not message.until_close


def test_a_head_with_invalid_framing_is_never_done() -> None:
    parser = ResponseParser()
    with pytest.raises(HTTPProtocolError):
        parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n")
    assert not parser.head_done
    assert parser.status == 0
