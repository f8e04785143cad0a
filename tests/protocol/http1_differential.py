"""Differential testing of Narwhal's HTTP/1.1 response parser against h11.

`check()` takes a generated response (`tests/protocol/http1_responses.py`), feeds it to
Narwhal's `ResponseParser` (whole, split and byte by byte) and to an
`h11.Connection(h11.CLIENT)` that sent a request first (split), then compares the verdicts:

- both accept: same status, reason, headers (as Narwhal represents them), de-framed body,
  and the same answer to "may the connection be reused";
- both refuse: fine, whatever the reasons;
- they disagree: allowed only where `ALLOWED` lists the divergence, with the RFC reason,
  and only when the case really has that property (the generator tags each case with the
  properties it put in) and the refusing side says so.

Anything else raises `Divergence`. The test module runs this with a few hundred examples;
`scripts/fuzz/http1_differential.py` runs it for minutes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import h11

from narwhal.protocol.http1 import HTTPProtocolError, ResponseParser
from tests.protocol.http1_responses import MAX_HEAD, Case


class Divergence(AssertionError):
    """Narwhal and h11 disagree in a way `ALLOWED` does not list, or Narwhal's verdict
    depends on how the bytes were split. `kind` names which, for grouping."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


# -- Verdicts ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Accepted:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes
    reuse: bool  # the connection may carry the next request


@dataclass(frozen=True)
class Refused:
    why: str


Verdict = Accepted | Refused


def narwhal_verdict(pieces: list[bytes]) -> Verdict:
    """Feed the pieces, then the EOF. Only `HTTPProtocolError` counts as a refusal: any
    other exception escapes, and fails the check."""
    parser = ResponseParser(max_head=MAX_HEAD)
    body = []
    try:
        for piece in pieces:
            parser.feed(piece)
            body.append(parser.take_body())
        parser.feed_eof()
        body.append(parser.take_body())
    except HTTPProtocolError as e:
        return Refused(str(e))
    if not (parser.head_done and parser.body_done):
        raise Divergence("Narwhal ended early", "the EOF came before the message ended")
    return Accepted(parser.status, parser.reason, parser.headers, b"".join(body), parser.keep_alive)


def h11_verdict(pieces: list[bytes], method: bytes) -> Verdict:
    """The same bytes as the response to a request h11 sent; b"" tells h11 of the EOF."""
    # No size limit here: h11 enforces it only on bytes that wait for more (so its verdict
    # on a large head depends on the reads), and Narwhal's limits are listed in ALLOWED.
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=1 << 30)
    body = b"{}" if method == b"POST" else b""
    headers = [(b"Host", b"engine"), (b"Content-Length", b"%d" % len(body))]
    conn.send(h11.Request(method=method, target=b"/v1/completions", headers=headers))
    conn.send(h11.Data(data=body))
    conn.send(h11.EndOfMessage())
    response: h11.Response | None = None
    data: list[bytes] = []
    feed = [piece for piece in pieces if piece]  # (an empty piece would be an EOF)
    try:
        for i, piece in enumerate([*feed, b""]):
            conn.receive_data(piece)
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    break
                if isinstance(event, h11.Response):
                    response = event
                elif isinstance(event, h11.Data):
                    data.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    assert response is not None
                    rest = b"".join(feed[i + 1 :])
                    if rest:
                        conn.receive_data(rest)  # only to know whether bytes follow
                    # (A body that the EOF ended is DONE in h11 too, but the
                    # connection is gone.)
                    reuse = (
                        i < len(feed) and conn.their_state is h11.DONE and not conn.trailing_data[0]
                    )
                    return Accepted(
                        response.status_code,
                        response.reason.decode("latin-1"),
                        _as_narwhal_headers(response.headers),
                        b"".join(data),
                        reuse,
                    )
                elif isinstance(event, h11.ConnectionClosed):
                    return Refused("closed before the end of the response")
                # (InformationalResponse: skipped, as Narwhal does)
    except h11.RemoteProtocolError as e:
        return Refused(str(e))
    return Refused("closed before the end of the response")


def _as_narwhal_headers(headers: h11._headers.Headers) -> dict[str, str]:
    """h11's header list as Narwhal keeps headers: names lower-cased, a repeated header's
    values joined with ", ". (h11 also folds repeated Content-Length values into one and
    lower-cases Transfer-Encoding; `_same_headers` allows for that.)"""
    out: dict[str, str] = {}
    for raw_name, value in headers.raw_items():
        name = raw_name.decode("ascii").lower()
        text = value.decode("latin-1")
        out[name] = text if name not in out else f"{out[name]}, {text}"
    return out


def _same_headers(ours: dict[str, str], theirs: dict[str, str]) -> bool:
    framing = ("content-length", "transfer-encoding")
    if {k: v for k, v in ours.items() if k not in framing} != {
        k: v for k, v in theirs.items() if k not in framing
    }:
        return False
    if ("content-length" in ours) != ("content-length" in theirs):
        return False
    if "content-length" in ours:
        values = {v.strip(" \t") for v in ours["content-length"].split(",")}
        if values != {theirs["content-length"]}:
            return False
    if "transfer-encoding" in ours or "transfer-encoding" in theirs:
        return ours.get("transfer-encoding", "").lower() == theirs.get("transfer-encoding")
    return True


# -- The divergences allowed -------------------------------------------------------------

_CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@dataclass(frozen=True)
class Allowed:
    """One way Narwhal may differ from h11, with the reason and a response that shows it
    (the test module checks that each example really diverges so)."""

    feature: str  # the property of the case (the generator's tag)
    narwhal: Literal["accepts", "refuses", "reuses", "closes"]  # h11 does the opposite
    why: str  # a regex the refusing side's message must match ("" for reuse)
    reason: str
    example: bytes


ALLOWED = (
    # Narwhal deliberately stricter (its module docstring lists these).
    Allowed(
        "obs-fold",
        "refuses",
        "obs-fold",
        "RFC 9112 §5.2: obs-fold is obsolete; a proxy or gateway may discard a response "
        "that has it instead of unfolding it, and engines never send it (h11 unfolds).",
        b"HTTP/1.1 200 OK\r\nX-A: 1\r\n  folded\r\nContent-Length: 0\r\n\r\n",
    ),
    Allowed(
        "bare-lf",
        "refuses",
        "",
        "RFC 9112 §2.2: a recipient MAY take a bare LF as a line end; Narwhal requires CRLF, "
        "so it never sees other message boundaries than a strict peer would (h11 takes LF).",
        b"HTTP/1.1 200 OK\nContent-Length: 0\n\n",
    ),
    Allowed(
        "other-major-version",
        "refuses",
        "invalid status line",
        "RFC 9110 §2.5, §6.2: the major version fixes the message syntax; on an HTTP/1.1 "
        "connection `HTTP/2.0` or `HTTP/0.9` is not a message Narwhal can read (h11 takes "
        "any DIGIT.DIGIT).",
        b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n",
    ),
    Allowed(
        "oversized",
        "refuses",
        "larger than|longer than",
        "Narwhal's own bounds (max_head, 8 KiB chunk-size and trailer lines), as RFC 9112 "
        "§2.3 and RFC 9110 §5.4 let a recipient have; h11 runs here without a limit, since "
        "it applies its own only to bytes still waiting for their end.",
        b"HTTP/1.1 200 OK\r\nX-Pad: " + b"p" * MAX_HEAD + b"\r\nContent-Length: 0\r\n\r\n",
    ),
    Allowed(
        "long-content-length",
        "refuses",
        "invalid Content-Length",
        "RFC 9112 §6.3 asks recipients to guard against overflowing lengths; Narwhal takes "
        "at most 18 digits, leading zeros included (h11: 20).",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0000000000000000005\r\n\r\nhello",
    ),
    Allowed(
        "chunk-size-trailing-ws",
        "refuses",
        "invalid chunk-size line",
        "RFC 9112 §7.1: chunk = chunk-size [ chunk-ext ] CRLF, no whitespace after a size "
        "without an extension; h11 tolerates it on purpose (its comment: servers in the "
        "wild).",
        _CHUNKED + b"5 \r\nhello\r\n0\r\n\r\n",
    ),
    Allowed(
        "chunk-ext-ctl",
        "refuses",
        "invalid chunk-size line",
        "RFC 9112 §7.1.1: a chunk extension is tokens and quoted strings, with no CR or "
        "NUL; h11 skips anything up to the LF (`;.*`).",
        _CHUNKED + b"5;a\x00\r\nhello\r\n0\r\n\r\n",
    ),
    # h11 stricter than the RFC asks, where Narwhal follows the RFC.
    Allowed(
        "chunk-ext-bws",
        "accepts",
        "illegal chunk header",
        'RFC 9112 §7.1.1: chunk-ext = *( BWS ";" BWS ext-name ... ): whitespace before '
        "the `;` is allowed; h11 refuses it.",
        _CHUNKED + b"5 ;a=b\r\nhello\r\n0\r\n\r\n",
    ),
    Allowed(
        "chunk-size-over-20-digits",
        "accepts",
        "illegal chunk header",
        "RFC 9112 §7.1: chunk-size = 1*HEXDIG; h11 takes at most 20 digits, so it refuses "
        "zero-padded sizes that Narwhal reads.",
        _CHUNKED + b"000000000000000000005\r\nhello\r\n0\r\n\r\n",
    ),
    Allowed(
        "vt-ff",
        "accepts",
        "illegal (header line|status line)",
        "RFC 9110 §5.5: field values with CTLs other than CR, LF and NUL are invalid, but a "
        "recipient MAY keep them, and the reason phrase is ignored (RFC 9112 §4); Narwhal "
        "keeps every such CTL, h11 every one but VT and FF (Python's `\\s`).",
        b"HTTP/1.1 200 OK\r\nX-A: a\x0bb\r\nContent-Length: 0\r\n\r\n",
    ),
    Allowed(
        "no-body-framing-headers",
        "accepts",
        "Content-Length|Transfer-Encoding",
        "RFC 9112 §6.3 item 1: a 1xx, 204 or 304 response ends with its head whatever its "
        "header fields say; Narwhal ignores its Content-Length and Transfer-Encoding, h11 "
        "validates their values anyway.",
        b"HTTP/1.1 204 No Content\r\nContent-Length: abc\r\n\r\n",
    ),
    Allowed(
        "te-with-bad-cl",
        "accepts",
        "Content-Length",
        "RFC 9112 §6.3 item 3: Transfer-Encoding overrides Content-Length; Narwhal reads "
        "the chunks and does not reuse the connection (its docstring), ignoring the "
        "overridden value; h11 validates it.",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: x\r\n\r\n0\r\n\r\n",
    ),
    Allowed(
        "framing-in-trailers",
        "accepts",
        "Content-Length|Transfer-Encoding",
        "RFC 9110 §6.5.1: trailer fields cannot change the framing; Narwhal drops trailers, "
        "h11 validates Content-Length and Transfer-Encoding values in them as in a head.",
        _CHUNKED + b"0\r\nContent-Length: abc\r\n\r\n",
    ),
    # Whether the connection may carry the next request.
    Allowed(
        "http10-keep-alive",
        "reuses",
        "",
        "RFC 9112 §9.3: an HTTP/1.0 response with `Connection: keep-alive` persists; "
        "Narwhal reuses it, h11 never reuses an HTTP/1.0 connection.",
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
    ),
    Allowed(
        "te-and-cl",
        "closes",
        "",
        "RFC 9112 §6.3 item 3: both headers ought to be handled as an error; Narwhal reads "
        "the message and closes the connection, h11 keeps it.",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
    ),
)


def _allowed(case: Case, narwhal: str, why: str) -> str:
    for allowed in ALLOWED:
        if (
            allowed.feature in case.features
            and allowed.narwhal == narwhal
            and re.search(allowed.why, why)
        ):
            return f"allowed: {allowed.feature}"
    return ""


def check(case: Case) -> str:
    """The comparison for one case; returns its outcome ("both accept", "both refuse" or
    "allowed: FEATURE"), raises `Divergence` otherwise."""
    pieces = case.pieces()
    ours = narwhal_verdict(pieces)
    raw = case.raw
    for how, other in (
        ("whole", [raw]),
        ("byte by byte", [raw[i : i + 1] for i in range(len(raw))]),
    ):
        verdict = narwhal_verdict(other)
        if verdict != ours:
            raise Divergence("split points change Narwhal's verdict", f"{verdict} {how}, {ours}")
    theirs = h11_verdict(pieces, case.method)
    if isinstance(ours, Accepted) and isinstance(theirs, Accepted):
        return _compare_accepted(case, ours, theirs)
    if isinstance(ours, Refused) and isinstance(theirs, Refused):
        return "both refuse"
    refused = theirs if isinstance(ours, Accepted) else ours
    assert isinstance(refused, Refused)
    narwhal = "accepts" if isinstance(ours, Accepted) else "refuses"
    outcome = _allowed(case, narwhal, refused.why)
    if outcome:
        return outcome
    raise Divergence(
        f"Narwhal {narwhal}, h11 does not",
        f"Narwhal {ours}, h11 {theirs}; case features {sorted(case.features)}",
    )


def _compare_accepted(case: Case, ours: Accepted, theirs: Accepted) -> str:
    if (ours.status, ours.reason, ours.body) != (theirs.status, theirs.reason, theirs.body):
        raise Divergence("both accept, different messages", f"Narwhal {ours}, h11 {theirs}")
    if not _same_headers(ours.headers, theirs.headers):
        raise Divergence(
            "both accept, different headers", f"Narwhal {ours.headers}, h11 {theirs.headers}"
        )
    if ours.reuse == theirs.reuse:
        return "both accept"
    outcome = _allowed(case, "reuses" if ours.reuse else "closes", "")
    if outcome:
        return outcome
    raise Divergence(
        f"Narwhal {'reuses' if ours.reuse else 'closes'} the connection, h11 does not",
        f"{ours}; case features {sorted(case.features)}",
    )
