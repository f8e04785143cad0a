"""Incremental HTTP/1.1 response parser: bytes in, status, headers and body out, no I/O.

The engine client (`narwhal.engines.upstream`) feeds it whatever each socket read
brought; it answers with the response head and the de-framed body. Framing follows
RFC 9112:

- the status line is `HTTP/1.x NNN reason`; the reason may be empty, and even its space
  may be missing, as some servers send `HTTP/1.1 200` (§4);
- header lines are `name: value`, the name a token; a line without a colon, whitespace
  before the colon, and obs-fold continuation lines are errors (§5.1, §5.2: a client may
  reject obs-fold, and engines never send it); lines end in CRLF, a bare CR or LF is an
  error rather than a guess (§2.2);
- interim 1xx responses (`100 Continue`, `103 Early Hints`) are skipped whole (RFC 9110
  §15.2); a 101 is an error, since Narwhal never asks to upgrade;
- the body length (§6.3): none for 204 and 304; `Transfer-Encoding: chunked` wins over
  `Content-Length`, but a message with both is suspect, so its connection is not
  reused; no other transfer coding is accepted, since Narwhal never sends `TE` and could
  not decode one (§7.4); a `Content-Length` must be digits (18 at most, leading zeros
  included), and repeated values must agree (§6.3 item 5); in both headers only SP and
  HTAB around a list element are whitespace (RFC 9110 §5.6.1); with neither header the
  body runs until the server closes;
- chunk-size lines are hex, optionally followed by extensions (`1a;foo=bar`), which are
  ignored (§7.1.1); trailers after the last chunk are checked and dropped (§7.1.2); a
  chunk-size or trailer line is at most 8 KiB, and the trailers at most `max_head`.

Where this parser and h11 differ (the stricter rules above, and where h11 is stricter
than the RFC), `tests/protocol/http1_differential.py` lists each divergence with its
reason, and a differential fuzz test holds the parser to that list.

Persistence (§9.3): HTTP/1.1 keeps the connection unless `Connection: close`; HTTP/1.0
only with `Connection: keep-alive`. A read-until-close body, a message with both
`Transfer-Encoding` and `Content-Length`, and any bytes after the end of the message
(engines do not pipeline; such bytes mean a confused server) make `keep_alive` False.

Speed: this runs for every read of every engine stream. vLLM (uvicorn) sends one SSE
event per chunk, 60-300 bytes, and a read often holds dozens; the chunked loop costs a
`find`, two slices and a dict lookup per chunk (~0.5 µs for 250-byte chunks on the dev
machine), and the body pieces are joined once, in `take_body`.

Input split anywhere is fine and stays linear when it arrives a byte at a time. An
unfinished head waits in a `bytearray` (appends are amortised O(1)) with a scan
position, so `find` never rereads it. In a chunked body only an unfinished line (or the
CRLF after a chunk's data) ever waits, since chunk data is handed on as it comes;
bytes without an LF cannot finish a line, so they are only appended, and the line is
copied again only when an LF arrives, at most `_MAX_LINE` bytes each time.
"""

from __future__ import annotations

import re
from typing import Final

_HEX: Final = b"0123456789abcdefABCDEF"
_CRLF: Final = b"\r\n"
_NOTHING: Final = b""  # the empty buffer (a bytearray only while bytes are pending)

# The parser's states. The chunked ones are contiguous so one range test finds them.
_HEAD: Final = 0  # reading a response head (interim 1xx heads included)
_LENGTH: Final = 1  # a Content-Length body: `_remaining` bytes to go
_CHUNK_SIZE: Final = 2  # expecting a chunk-size line
_CHUNK_DATA: Final = 3  # inside a chunk: `_remaining` bytes to go
_CHUNK_END: Final = 4  # expecting the CRLF after a chunk's data
_TRAILERS: Final = 5  # after the last chunk: trailer lines up to a blank line
_UNTIL_CLOSE: Final = 6  # the body ends when the connection does
_DONE: Final = 7
_BROKEN: Final = 8  # an error was raised: every later call raises it again

_STATUS_LINE: Final = re.compile(rb"HTTP/1\.([0-9]) ([0-9]{3})(?: ([^\r\n\x00]*))?")
_TOKEN: Final = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
# One header line, whole, then its name and its value after the optional whitespace (the
# value's trailing whitespace is stripped after): what `_field` reads, with no CR, LF or
# NUL in the value.
_HEADER_LINE: Final = re.compile(rb"(([-!#$%&'*+.^_`|~0-9A-Za-z]+):[ \t]*([^\r\n\x00]*)\r\n)")
_MAX_LENGTH_DIGITS: Final = 18  # past int64; also keeps `int()` off its digit limit
# A chunk-size line (with its extensions) or one trailer line may not be longer, CRLF not
# counted; like aiohttp's 8190-byte line limit, this bounds what one unfinished line can
# hold. The same line is refused whether it arrives whole or in pieces: an unfinished one
# only once it cannot fit (one byte more may be the CR of its CRLF), a whole one when its
# end is found.
_MAX_LINE: Final = 8192
# Chunk sizes as servers write them (lower-case hex, no leading zeros: uvicorn, aiohttp,
# Go), looked up instead of validated and converted: a third of the per-chunk cost. Other
# spellings, extensions and errors go through `_chunk_size`. ~400 kB of memory.
_SIZES: Final = {b"%x" % i: i for i in range(4096)}


class HTTPProtocolError(Exception):
    """The peer's bytes are not a valid HTTP/1.1 response; the connection is unusable."""


class ResponseParser:
    """Feed one response's bytes, split anywhere; read its head and take its body."""

    __slots__ = (
        "_broken",
        "_buf",
        "_max_head",
        "_pieces",
        "_pos",
        "_remaining",
        "_scan",
        "_state",
        "_trailer_bytes",
        "body_done",
        "head_done",
        "headers",
        "keep_alive",
        "reason",
        "status",
    )

    def __init__(self, *, max_head: int = 64 * 1024) -> None:
        self._max_head = max_head
        self.head_done = False
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}
        """Lower-cased names; a repeated header's values joined with ", "."""
        self.keep_alive = False
        self.body_done = False
        self._state = _HEAD
        self._broken = ""
        # Bytes received but not parsed yet: an unfinished head or line. A line end is
        # searched for from `_scan`, so bytes arriving one at a time are not rescanned.
        self._buf: bytes | bytearray = _NOTHING
        self._scan = 0
        self._pos = 0  # the parse position, within one `feed`
        self._remaining = 0
        self._trailer_bytes = 0
        self._pieces: list[bytes] = []

    def feed(self, data: bytes) -> None:
        """Take the next bytes from the connection."""
        state = self._state
        if state >= _DONE:
            if state == _BROKEN:
                raise HTTPProtocolError(self._broken)
            if data:
                self.keep_alive = False  # bytes after the message: see the module doc
            return
        if not data:
            return
        try:
            if state == _HEAD:
                data = self._feed_head(data)
                state = self._state
                if not data:
                    return
                if state == _DONE:
                    self.keep_alive = False
                    return
            if state == _LENGTH:
                self._feed_length(data)
            elif state == _UNTIL_CLOSE:
                self._pieces.append(data)
            else:
                self._feed_chunked(data)
        except HTTPProtocolError as e:
            self._state = _BROKEN
            self._broken = str(e)
            self._buf = _NOTHING
            raise

    def feed_eof(self) -> None:
        """The peer closed the connection. Ends a read-until-close body; anything else
        unfinished is an error."""
        state = self._state
        if state == _DONE:
            return
        if state == _UNTIL_CLOSE:
            self._state = _DONE
            self.body_done = True
            return
        if state == _BROKEN:
            raise HTTPProtocolError(self._broken)
        if state == _HEAD:
            message = "connection closed before the response head was complete"
        elif state == _LENGTH:
            message = f"connection closed with {self._remaining} body bytes still to come"
        else:
            message = "connection closed before the last chunk of the body"
        self._state = _BROKEN
        self._broken = message
        raise HTTPProtocolError(message)

    def take_body(self) -> bytes:
        """The body bytes parsed so far and not yet taken, in one object (b"" if none)."""
        pieces = self._pieces
        if not pieces:
            return b""
        body = b"".join(pieces)
        pieces.clear()
        return body

    def _feed_head(self, data: bytes) -> bytes:
        """Parse heads; return the bytes after the final one (b"" while it is incomplete)."""
        buf = self._buf
        if buf:
            buf += data  # the bytearray of pending bytes, in place
        else:
            buf = data
        while self._state == _HEAD:
            pos = self._pos
            end = buf.find(b"\r\n\r\n", self._scan)
            if end < 0:
                if len(buf) - pos > self._max_head:
                    raise HTTPProtocolError(f"response head larger than {self._max_head} bytes")
                # Keep the unparsed bytes; the end of the buffer may hold the first three
                # bytes of the CRLFCRLF.
                self._buf = bytearray(buf[pos:]) if pos or buf is data else buf
                self._scan = max(0, len(buf) - 3 - pos)
                self._pos = 0
                return b""
            if end + 4 - pos > self._max_head:
                raise HTTPProtocolError(f"response head larger than {self._max_head} bytes")
            self._pos = self._scan = end + 4
            self._head(bytes(buf[pos:end]))
        rest = bytes(buf[self._pos :])
        self._buf = _NOTHING
        self._pos = self._scan = 0
        return rest

    def _head(self, head: bytes) -> None:
        status_line, crlf, block = head.partition(_CRLF)
        match = _STATUS_LINE.fullmatch(status_line)
        if match is None:
            raise HTTPProtocolError(f"invalid status line {status_line[:200]!r}")
        minor, code, reason = match.groups()
        status = int(code)
        headers: dict[str, str] = {}
        if crlf:
            block += _CRLF
            lines = _HEADER_LINE.findall(block)
            if sum(len(line) for line, _, _ in lines) == len(block):
                # Every line is a valid field: one C pass took them all.
                fields = [
                    (name.decode("ascii").lower(), value.rstrip(b" \t").decode("latin-1"))
                    for _, name, value in lines
                ]
            else:
                fields = [_field(line) for line in block[:-2].split(_CRLF)]  # names the error
            for name, value in fields:
                previous = headers.get(name)
                headers[name] = value if previous is None else f"{previous}, {value}"
        if status < 200:
            if status == 101:
                raise HTTPProtocolError("101 Switching Protocols, but no upgrade was asked for")
            if status < 100:
                raise HTTPProtocolError(f"invalid status code {status}")
            return  # interim: the final response follows on the same connection
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        keep_alive = "close" not in tokens if minor != b"0" else "keep-alive" in tokens
        state = _framing(status, headers)
        if state == _LENGTH:
            self._remaining = _content_length(headers["content-length"])
            if not self._remaining:
                state = _DONE
        elif state == _UNTIL_CLOSE:
            keep_alive = False  # the close is what ends the body
        elif state == _CHUNK_SIZE and ("content-length" in headers or minor == b"0"):
            # §6.1: both headers may be a smuggling attempt, and chunked from HTTP/1.0
            # means a confused server: read the message, then drop the connection.
            keep_alive = False
        # Only a head whose framing is valid is done: a caller never sees a broken one.
        self.status = status
        self.reason = reason.decode("latin-1") if reason else ""
        self.headers = headers
        self.keep_alive = keep_alive
        self.head_done = True
        self._state = state
        self.body_done = state == _DONE

    def _feed_length(self, data: bytes) -> None:
        remaining = self._remaining
        if len(data) < remaining:
            self._pieces.append(data)
            self._remaining = remaining - len(data)
            return
        self._pieces.append(data[:remaining])
        self._remaining = 0
        self._state = _DONE
        self.body_done = True
        if len(data) > remaining:
            self.keep_alive = False

    def _feed_chunked(self, data: bytes) -> None:
        pending = self._buf
        if pending:
            # Pending bytes are an unfinished line (or the CR of a CRLF): only an LF can
            # end it, so without one just keep the bytes, and stay linear byte by byte.
            if data.find(b"\n") == -1 and len(pending) + len(data) <= _MAX_LINE:
                pending += data
                return
            buf = b"".join((pending, data))
            self._buf = _NOTHING  # all of it is in `buf` now
        else:
            buf = data
        if pending or self._state != _CHUNK_SIZE:
            # A read that starts inside a chunk: the loop finishes that chunk, and the
            # fast path takes the rest (reads split anywhere cost no more than whole ones).
            self._pos = 0
            self._parse_chunked(buf, to_boundary=True)
            pos = self._pos
            # (A scan position past `pos` means it stopped inside a size line.)
            if self._state != _CHUNK_SIZE or pos >= len(buf) or self._scan > pos:
                self._keep_rest(buf)
                return
            buf = buf[pos:]
            self._scan = 0
        buf = self._split_chunks(buf)
        if not buf:
            return
        self._pos = 0
        self._parse_chunked(buf)
        self._keep_rest(buf)

    def _keep_rest(self, buf: bytes) -> None:
        """After `_parse_chunked(buf)`: keep the unparsed tail for the next read."""
        pos = self._pos
        if self._state == _DONE:
            if pos < len(buf):
                self.keep_alive = False
            self._buf = _NOTHING
        else:
            self._buf = bytearray(buf[pos:]) if pos < len(buf) else _NOTHING
            self._scan = max(0, self._scan - pos)  # (only meaningful inside a line)
        self._pos = 0

    def _split_chunks(self, buf: bytes) -> bytes:
        """The fast path for a read that starts at a chunk-size line: de-frame all its
        whole chunks with C-level passes; return the bytes left for `_parse_chunked` (an
        unfinished chunk, or all of `buf` when the shortcut does not apply).

        Split at every CRLF, a chunked body alternates size lines and data, and each
        data piece's length must equal its size. That check proves the framing: a size
        line cannot hold a CRLF, so the first piece is the size line; a data piece
        ending at the first CRLF after it is exactly `size` bytes only when the chunk's
        data holds no CRLF and the CRLF after it is where it must be; and so on, chunk
        by chunk. Data with a CRLF of its own makes a piece too short, and the loop
        parses it. A zero size is taken only as the very end (`0`, blank line).
        """
        eol = buf.find(_CRLF)
        size = _SIZES.get(buf[:eol])
        if size and eol + size + 4 == len(buf) and buf.endswith(_CRLF):
            # Exactly one whole chunk, a live stream's usual read: its size line, then
            # `size` bytes, then the CRLF that ends the read.
            self._pieces.append(buf[eol + 2 : -2])
            return _NOTHING
        parts = buf.split(_CRLF)
        rest = parts.pop()  # after the last CRLF: the start of a line still arriving
        if len(parts) % 2:
            # The last whole line is a size line whose data is still arriving.
            rest = parts.pop() + _CRLF + rest
        if not parts:
            return buf
        datas = parts[1::2]
        sizes = list(map(_SIZES.get, parts[0::2]))
        if None in sizes:
            return buf  # extensions, upper case, over 4 KiB: the loop checks and converts
        if sizes != list(map(len, datas)):
            return buf
        if not sizes[-1]:
            # `0` and a blank line end the body; anything after it: the loop judges.
            if rest or 0 in sizes[:-1]:
                return buf
            datas.pop()
            self._pieces.extend(datas)
            self._state = _DONE
            self.body_done = True
            return _NOTHING
        if 0 in sizes:
            return buf
        self._pieces.extend(datas)
        return rest

    def _parse_chunked(self, buf: bytes, *, to_boundary: bool = False) -> None:
        """The exact chunked loop; with `to_boundary`, it stops at the first chunk
        boundary it reaches (the start of the next size line)."""
        # Locals, not attributes, inside the loop: this is the per-chunk hot path.
        n = len(buf)
        pos = self._pos
        scan = self._scan
        state = self._state
        remaining = self._remaining
        append = self._pieces.append
        find = buf.find
        sizes = _SIZES
        while pos < n:
            if state == _CHUNK_SIZE:
                eol = find(_CRLF, scan)
                if eol < 0:
                    if n - pos > _MAX_LINE + 1:
                        raise HTTPProtocolError(f"chunk-size line longer than {_MAX_LINE} bytes")
                    scan = n - 1  # the last byte may be the CR of the line end
                    break
                line = buf[pos:eol]
                size = sizes.get(line)
                if size is None:
                    size = _chunk_size(line)
                pos = eol + 2
                if not size:
                    state = _TRAILERS
                    scan = pos
                    continue
                end = pos + size
                if end + 2 <= n:
                    # The common case: the whole chunk and its CRLF are here.
                    if buf[end] != 13 or buf[end + 1] != 10:
                        raise HTTPProtocolError("chunk data not followed by CRLF")
                    append(buf[pos:end])
                    pos = scan = end + 2
                    if to_boundary:
                        break
                    continue
                if pos < n:
                    append(buf[pos:end])
                if end <= n:
                    pos = end
                    state = _CHUNK_END
                else:
                    remaining = end - n
                    pos = n
                    state = _CHUNK_DATA
            elif state == _CHUNK_DATA:
                end = pos + remaining
                if end > n:
                    append(buf[pos:])
                    remaining = end - n
                    pos = n
                    break
                append(buf[pos:end])
                remaining = 0
                pos = end
                state = _CHUNK_END
            elif state == _CHUNK_END:
                if n - pos < 2:
                    if buf[pos] != 13:
                        raise HTTPProtocolError("chunk data not followed by CRLF")
                    break
                if buf[pos] != 13 or buf[pos + 1] != 10:
                    raise HTTPProtocolError("chunk data not followed by CRLF")
                pos = scan = pos + 2
                state = _CHUNK_SIZE
                if to_boundary:
                    break
            else:  # _TRAILERS
                eol = find(_CRLF, scan)
                if eol < 0:
                    if n - pos > _MAX_LINE + 1:
                        raise HTTPProtocolError(f"trailer line longer than {_MAX_LINE} bytes")
                    scan = n - 1
                    break
                if eol - pos > _MAX_LINE:
                    raise HTTPProtocolError(f"trailer line longer than {_MAX_LINE} bytes")
                if eol == pos:
                    pos += 2
                    state = _DONE
                    self.body_done = True
                    break
                _field(buf[pos:eol])  # checked, then dropped (RFC 9112 §7.1.2)
                self._trailer_bytes += eol + 2 - pos
                if self._trailer_bytes > self._max_head:
                    raise HTTPProtocolError(f"trailers larger than {self._max_head} bytes")
                pos = scan = eol + 2
        self._pos = pos
        self._scan = scan
        self._state = state
        self._remaining = remaining


def _framing(status: int, headers: dict[str, str]) -> int:
    """The body state for a final response's head (RFC 9112 §6.3)."""
    if status == 204 or status == 304:
        return _DONE
    coding = headers.get("transfer-encoding")
    if coding is not None:
        # Only OWS (SP, HTAB) around list elements (RFC 9110 §5.6.1): `str.strip()` would
        # also take NBSP and NEL, which a Latin-1 value can hold, and make "chunked\xa0"
        # chunked.
        codings = [c.strip(" \t").lower() for c in coding.split(",")]
        if codings != ["chunked"]:
            raise HTTPProtocolError(f"unsupported Transfer-Encoding {coding!r}")
        return _CHUNK_SIZE
    if "content-length" in headers:
        return _LENGTH
    return _UNTIL_CLOSE


def _content_length(value: str) -> int:
    # A repeated header arrives joined with ", "; identical copies are allowed (§6.3).
    values = {v.strip(" \t") for v in value.split(",")}  # OWS only, as for the codings
    if len(values) != 1:
        raise HTTPProtocolError(f"conflicting Content-Length values {value!r}")
    digits = values.pop()
    if not (digits.isascii() and digits.isdigit()) or len(digits) > _MAX_LENGTH_DIGITS:
        raise HTTPProtocolError(f"invalid Content-Length {value!r}")
    return int(digits)


def _chunk_size(line: bytes) -> int:
    """A chunk-size line the fast path did not take: extensions, or an error."""
    if len(line) > _MAX_LINE:  # (here, not in the loop: `_SIZES` holds only short lines)
        raise HTTPProtocolError(f"chunk-size line longer than {_MAX_LINE} bytes")
    size, semicolon, _ = line.partition(b";")
    if semicolon:
        size = size.rstrip(b" \t")  # BWS before the extensions (§7.1.1)
    if (
        not size
        or size.strip(_HEX)
        or line.find(b"\r") != -1
        or line.find(b"\n") != -1
        or line.find(b"\x00") != -1
    ):
        raise HTTPProtocolError(f"invalid chunk-size line {line[:200]!r}")
    return int(size, 16)


def _field(line: bytes) -> tuple[str, str]:
    """One header or trailer line as (lower-cased name, value)."""
    colon = line.find(b":")
    if colon <= 0 or _TOKEN.fullmatch(line, 0, colon) is None:
        if line[:1] in (b" ", b"\t"):
            raise HTTPProtocolError(f"obs-fold continuation line {line[:200]!r} not supported")
        if colon < 0:
            raise HTTPProtocolError(f"header line without a colon {line[:200]!r}")
        raise HTTPProtocolError(f"invalid header name in {line[:200]!r}")
    value = line[colon + 1 :].strip(b" \t")
    if value.find(b"\r") != -1 or value.find(b"\n") != -1 or value.find(b"\x00") != -1:
        raise HTTPProtocolError(f"invalid character in header value {line[:200]!r}")
    # Header bytes are Latin-1 by HTTP's history (RFC 9110 §5.5): decoding so loses nothing.
    return line[:colon].decode("ascii").lower(), value.decode("latin-1")
