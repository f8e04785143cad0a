"""Generated HTTP/1.1 responses, valid and deliberately broken, for the differential
tests against h11 (`tests/protocol/http1_differential.py`).

A case is a response (maybe after interim 1xx ones, maybe cut short by the EOF or followed
by more bytes) with the points to split it at. It may have a bad status line; bad,
repeated or conflicting Content-Length; Transfer-Encoding variants (gzip, "chunked,
chunked", mixed case, with a Content-Length); bad chunk sizes (non-hex, signed, huge,
zero-padded, with extensions, without their CRLF); obs-fold; bare LF and CR; NUL and other
control bytes in fields; whitespace before a colon; lines and heads past Narwhal's limits;
204 and 304 with framing headers and bodies; trailers. Each case is tagged with the
properties of it where Narwhal and h11 may disagree (`Case.features`), which is what lets
the comparison excuse a divergence only where the case really has its cause.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from hypothesis import strategies as st

from narwhal.protocol.http1 import _MAX_LINE as MAX_LINE  # chunk-size and trailer lines

MAX_HEAD = 2048  # the parser's head limit for these cases: small, so large heads are cheap


@dataclass(frozen=True)
class Case:
    raw: bytes
    method: bytes
    features: frozenset[str]
    cuts: tuple[int, ...]  # split points, sorted, within raw

    def pieces(self) -> list[bytes]:
        edges = [0, *self.cuts, len(self.raw)]
        return [self.raw[a:b] for a, b in itertools.pairwise(edges)]


TCHAR = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-!#$%&'*+.^_`|~"
FRAMING = {b"content-length", b"transfer-encoding", b"connection"}
_names = st.text(TCHAR, min_size=1, max_size=10).map(str.encode)
_plain = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=16)


class _Draw:
    """A case under construction: draws bytes and keeps the tags of what went in."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.features: set[str] = set()

    def rare(self, percent: int) -> bool:
        # Drawn so that hypothesis shrinks towards "no": a failure shrinks to fewer oddities.
        # (Nothing drawn for 0%: the draws are most of the cost of a case.)
        return percent > 0 and self.draw(st.integers(0, 99)) >= 100 - percent

    def pick(self, options: list[bytes]) -> bytes:
        return self.draw(st.sampled_from(options))

    def eol(self, odd: int) -> bytes:
        """A line end: CRLF, or with `odd` percent chance a bare LF or CR."""
        if not self.rare(odd):
            return b"\r\n"
        end = self.pick([b"\n", b"\r", b"\r\r\n", b"\n\r"])
        if b"\n" in end.replace(b"\r\n", b""):
            self.features.add("bare-lf")
        return end

    def value(self, odd: int) -> bytes:
        """A field value (or reason phrase), maybe with odd bytes in it."""
        text = self.draw(_plain).strip(" \t").encode()
        if not self.rare(odd):
            return self.pick([b"", b" ", b"\t "]) + text if self.rare(20) else text
        kind = self.draw(st.integers(0, 6))
        at = self.draw(st.integers(0, len(text)))
        if kind == 0:  # obs-text: both take it
            odd_bytes = self.draw(st.binary(min_size=1, max_size=4)).translate(_HIGH)
        elif kind == 1:  # CTLs both keep
            odd_bytes = self.pick([b"\x01", b"\x1f", b"\x7f", b"a\x08b"])
        elif kind == 2:
            odd_bytes = self.pick([b"\x0b", b"\x0c"])
            self.features.add("vt-ff")
        elif kind == 3:
            odd_bytes = b"\x00"
        elif kind == 4:
            odd_bytes = b"\r"
        elif kind == 5:
            odd_bytes = b"\n"
            self.features.add("bare-lf")
        else:
            odd_bytes = b"\r\n"  # ends the line early: what follows is a line of its own
            if text[at : at + 1] in (b" ", b"\t"):
                self.features.add("obs-fold")
        return text[:at] + odd_bytes + text[at:]

    def field_line(self, odd: int, *, first: bool) -> bytes:
        """One header (or trailer) line with its end, maybe broken."""
        name = self.draw(_names)
        if name.lower() in FRAMING:
            name = b"x-" + name
        if not self.rare(odd):
            return name + b":" + self.pick([b" ", b"", b"  "]) + self.value(odd) + self.eol(odd)
        kind = self.draw(st.integers(0, 5))
        if kind == 0:  # whitespace before the colon
            line = name + self.pick([b" ", b"\t"]) + b": " + self.value(0)
        elif kind == 1:
            line = name + self.value(0)  # (a colon may still come with the value)
        elif kind == 2:
            line = b": " + self.value(0)
        elif kind == 3:
            bad = self.pick([b" ", b"@", b"(", b"\x00", b"\x80", b"\x7f", b'"', b"/"])
            line = name + bad + name + b": " + self.value(0)
        elif kind == 4 and not first:
            self.features.add("obs-fold")
            line = self.pick([b" ", b"\t", b"  "]) + self.value(0)
        else:
            line = name + b": " + self.value(100)
        return line + self.eol(odd)


_HIGH = bytes(0x80 | (b & 0x7F) for b in range(256))  # any byte, moved into 0x80-0xFF


@st.composite
def responses(draw: st.DrawFn) -> Case:
    """One response (maybe after interim ones, maybe broken, cut short or followed by
    more bytes) and the points to split it at."""
    d = _Draw(draw)
    odd = d.draw(st.sampled_from([0, 0, 5, 20]))  # how broken this case is, in percent
    raw = b""
    for _ in range(d.draw(st.integers(0, 2)) if d.rare(25) else 0):
        raw += _interim(d, odd)
    version, status, head = _status_line(d, odd)
    lines = [d.field_line(odd, first=i == 0) for i in range(d.draw(st.integers(0, 5)))]
    framing, payload = _framing(d, odd, version, status)
    lines[d.draw(st.integers(0, len(lines))) : 0] = framing  # framing headers anywhere
    if d.rare(4):  # a large header, about the size of the head limit
        lines.append(b"X-Pad: " + b"p" * d.draw(st.integers(MAX_HEAD - 200, MAX_HEAD + 50)))
        lines[-1] += b"\r\n"
    head += b"".join(lines)
    head += d.eol(odd // 4)
    if len(head) > MAX_HEAD:
        d.features.add("oversized")
    raw += head + payload
    if d.rare(10):  # bytes after the end: garbage, or a whole second response
        raw += d.pick([b"x", b"\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nz"])
    if d.rare(10):  # cut short: the EOF comes early
        raw = raw[: d.draw(st.integers(0, len(raw)))]
    cuts = tuple(sorted(d.draw(st.lists(st.integers(0, len(raw)), max_size=8))))
    method = d.draw(st.sampled_from([b"POST", b"GET"]))
    return Case(raw, method, frozenset(d.features), cuts)


def _interim(d: _Draw, odd: int) -> bytes:
    head = d.pick([b"HTTP/1.1 100 Continue", b"HTTP/1.1 103 Early Hints", b"HTTP/1.1 102 P"])
    head += b"\r\n"
    if d.rare(10):
        head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n"
    for i in range(d.draw(st.integers(0, 2))):
        head += d.field_line(odd, first=i == 0)
    if d.rare(10):
        head += d.pick([b"Content-Length: x\r\n", b"Transfer-Encoding: gzip\r\n"])
        d.features.add("no-body-framing-headers")
    head += d.eol(odd // 4)
    if len(head) > MAX_HEAD:
        d.features.add("oversized")
    return head


def _status_line(d: _Draw, odd: int) -> tuple[bytes, int, bytes]:
    """(version, status, the status line with its end)."""
    version = d.pick([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0"])
    if d.rare(odd):
        version = d.pick([b"HTTP/1.2", b"HTTP/2.0", b"HTTP/0.9", b"HTTP/3.1", b"HTTP/1"])
        version = d.pick([version, b"HTTP/11", b"http/1.1", b"HTTP/1.x", b"HTTP/1.1 "])
        if re.fullmatch(rb"HTTP/[02-9]\.[0-9]", version):
            d.features.add("other-major-version")
    codes = [200, 200, 201, 204, 206, 304, 400, 404, 429, 500, 503, 599, 600, 999]
    status = d.draw(st.sampled_from(codes))
    code = b"%d" % status
    if d.rare(odd):
        code = d.pick([b"20", b"2000", b"abc", b"099", b"000", b"2 0", b"+20", b"\x00"])
        status = 0
    if d.rare(odd // 2 + 5):
        line = version + b" " + code + d.pick([b"", b" "])  # no reason, or an empty one
    else:
        line = version + b" " + code + b" " + d.value(odd)
    return version, status, line + d.eol(odd // 2)


_TE_NAMES = [b"Transfer-Encoding", b"transfer-encoding", b"TRANSFER-ENCODING"]
_CL_NAMES = [b"Content-Length", b"content-length", b"CONTENT-LENGTH"]
# Bodies: any bytes; pieces that look like chunk framing (data that a sloppy de-framer
# would cut at); or large, for chunk sizes past Narwhal's lookup table of sizes.
_framing_like = [b"\r\n", b"0\r\n\r\n", b"5\r\n", b"a", b"data: {}\n\n", b"\r"]
_bodies = st.one_of(
    st.binary(max_size=300),
    st.lists(st.sampled_from(_framing_like), max_size=12).map(b"".join),
    st.integers(4000, 6000).map(lambda n: b"d" * n),
)


def _framing(d: _Draw, odd: int, version: bytes, status: int) -> tuple[list[bytes], bytes]:
    """The framing header lines and the payload after the head."""
    body = d.draw(_bodies)
    lines: list[bytes] = []
    te_values = _transfer_encoding(d, odd)
    cl_values, cl_valid = _content_length(d, odd, len(body))
    for value in te_values:
        lines.append(d.pick(_TE_NAMES) + b": " + value + b"\r\n")
    for value in cl_values:
        lines.append(d.pick(_CL_NAMES) + b": " + value + b"\r\n")
    if te_values and cl_values:
        d.features.add("te-and-cl")
    connection = d.pick([b"", b"", b"close", b"keep-alive", b"Keep-Alive", b"upgrade, close"])
    if connection:
        lines.append(b"Connection: " + connection + b"\r\n")
    tokens = {t.strip().lower() for t in connection.split(b",")}
    if version == b"HTTP/1.0" and b"keep-alive" in tokens:
        d.features.add("http10-keep-alive")
    if status in (204, 304):
        if te_values or cl_values:
            d.features.add("no-body-framing-headers")
        return lines, body if d.rare(15) else b""  # (a body anyway: bytes after the end)
    if te_values:
        if cl_values and not cl_valid:
            d.features.add("te-with-bad-cl")
        return lines, _chunked(d, odd, body)
    return lines, body  # framed by the Content-Length, or read until the close


def _transfer_encoding(d: _Draw, odd: int) -> list[bytes]:
    """The values of the Transfer-Encoding headers (none, one, or two)."""
    if not d.rare(35):
        return []
    plain = [b"chunked", b"Chunked", b"CHUNKED", b" chunked\t"]
    if not d.rare(odd + 10):
        return [d.pick(plain)]
    odd_values = [
        b"gzip",
        b"gzip, chunked",
        b"chunked, gzip",
        b"chunked, chunked",
        b"identity",
        b"chunked;q=1",
        b"chunked,",
        b", chunked",
        b"",
        b"chunked\xa0",
        b"\x85chunked",
        b"chunked\x1c",
        b"chunk ed",
    ]
    values = [d.pick(odd_values)]
    if d.rare(30):
        values.append(d.pick(plain))  # a second header
    return values


def _content_length(d: _Draw, odd: int, n: int) -> tuple[list[bytes], bool]:
    """The values of the Content-Length headers for an `n`-byte body (which is sent whole
    whatever they say), and whether h11 takes them."""
    if not d.rare(60):
        return [], True
    kind = d.draw(st.integers(0, 9)) if d.rare(odd + 20) else 0
    valid = True
    if kind == 0:
        values = [b"%d" % n]
    elif kind == 1:  # shorter than the body: the rest are bytes after the end
        values = [b"%d" % d.draw(st.integers(0, n))]
    elif kind == 2:  # longer than the body: the EOF cuts it short
        values = [b"%d" % (n + d.draw(st.integers(1, 10**6)))]
    elif kind == 3:
        values = [b"%d" % n, b"%d" % n] if d.rare(50) else [b"%d, %d" % (n, n)]
    elif kind == 4:
        values = [b"%d" % n, b"%d" % (n + 1)] if d.rare(50) else [b"%d,%d" % (n, n + 1)]
        valid = False
    elif kind == 5:
        values = [d.pick([b"abc", b"-1", b"+5", b"0x5", b"5 5", b"", b"5,", b"1_0", b"\xb2"])]
        valid = False
    elif kind == 6:
        values = [b" %d\t" % n]
    elif kind == 7:
        values = [b"%0*d" % (d.draw(st.integers(1, 24)), n)]
        if len(values[0]) > 18:
            d.features.add("long-content-length")
            valid = len(values[0]) <= 20
    elif kind == 8:  # whitespace that is not OWS: not a Content-Length
        values = [d.pick([b"%d\xa0", b"\x85%d", b"%d\x1c", b"%d\x0b", b"\x0c%d"]) % n]
        valid = False
        if re.search(b"[\x0b\x0c]", values[0]):
            d.features.add("vt-ff")  # (where Narwhal ignores the value, h11 still refuses)
    else:  # huge: refused at once, or when the EOF comes
        values = [b"9" * d.draw(st.integers(17, 21))]
        valid = len(values[0]) <= 20
    return values, valid


def _chunked(d: _Draw, odd: int, body: bytes) -> bytes:
    cuts = sorted(d.draw(st.lists(st.integers(0, len(body)), max_size=5)))
    edges = [0, *cuts, len(body)]
    out = b""
    for a, b in itertools.pairwise(edges):
        if a < b:
            out += _chunk_line(d, odd, b - a) + body[a:b] + _chunk_end(d, odd)
    out += _chunk_line(d, odd, 0)
    trailer_bytes = 0
    for _ in range(d.draw(st.integers(0, 3)) if d.rare(20) else 0):
        line = d.field_line(odd, first=False)
        if d.rare(15):
            line = d.pick([b"Content-Length: abc\r\n", b"Transfer-Encoding: gzip\r\n"])
            d.features.add("framing-in-trailers")
        if d.rare(3):
            line = b"X-Pad: " + b"t" * d.draw(st.integers(MAX_HEAD - 100, MAX_HEAD + 50)) + b"\r\n"
        trailer_bytes += len(line)
        out += line
    if trailer_bytes > MAX_HEAD:
        d.features.add("oversized")
    return out + d.eol(odd // 2)


def _chunk_line(d: _Draw, odd: int, size: int) -> bytes:
    digits = b"%x" % size
    if d.rare(20):
        digits = d.pick([b"%X" % size, b"%0*x" % (d.draw(st.integers(1, 24)), size)])
        if len(digits) > 20:
            d.features.add("chunk-size-over-20-digits")
    trailing_ws = False
    if d.rare(odd):
        kind = d.draw(st.integers(0, 4))
        if kind == 0:
            digits = b"%x" % max(0, size + d.draw(st.sampled_from([-1, 1])))
        elif kind == 1:
            digits = d.pick([b"zz", b"0x" + digits, b"-" + digits, b"", b" " + digits])
        elif kind == 2:
            digits = d.pick([b"+" + digits, b"1_" + digits, digits + b"g"])
        else:
            digits += d.pick([b" ", b"\t", b"  "])
            trailing_ws = True
    ext = _extension(d, odd) if d.rare(20) else b""
    if ext[:1] in (b" ", b"\t") or (ext and trailing_ws):
        d.features.add("chunk-ext-bws")  # whitespace before the `;`
    elif trailing_ws:
        d.features.add("chunk-size-trailing-ws")
    line = digits + ext
    if len(line) > MAX_LINE:
        d.features.add("oversized")
    return line + d.eol(odd // 2)


def _extension(d: _Draw, odd: int) -> bytes:
    ext = d.pick([b";a=b", b";a", b';a="x;y z"', b";", b";a=b ", b";a\x01b", b";a=b;c"])
    if d.rare(odd + 10):
        kind = d.draw(st.integers(0, 2))
        if kind == 0:
            ext = d.pick([b" ", b"\t", b" \t"]) + ext
        elif kind == 1:
            ext += d.pick([b"\x00", b"\r", b"x\rb"])
            d.features.add("chunk-ext-ctl")
        else:
            ext += b"p" * d.draw(st.integers(MAX_LINE - 100, MAX_LINE + 20))
    return ext


def _chunk_end(d: _Draw, odd: int) -> bytes:
    if not d.rare(odd // 2):
        return b"\r\n"
    end = d.pick([b"", b"\n", b"\r", b"xx", b"\r\r\n"])
    if end == b"\n":
        d.features.add("bare-lf")
    return end
