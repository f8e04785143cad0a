"""A strict HTTP/1.x client on a raw socket, for tests of the framing a server really writes.

It sends exactly the request it is given (HTTP/1.0 included, which no Python client
library speaks) and reads a response by the rules of RFC 9112 section 6.3: chunked when
the response says so (each size line, chunk and CRLF checked; no extensions, no
trailers), else Content-Length, else up to the server's close.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

_SIZE_LINE = re.compile(rb"[0-9a-f]+\r\n")
# What a chunk-size line looks like inside a body that should have been unframed.
CHUNK_SIZE_LINE = re.compile(rb"(?:^|\n)[0-9a-fA-F]+\r\n")


@dataclass(frozen=True)
class RawResponse:
    version: str  # "HTTP/1.0" or "HTTP/1.1"
    status: int
    headers: dict[str, str]  # names lower-cased; a repeated name fails the read
    body: bytes  # unframed
    framing: Literal["chunked", "length", "close"]

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    path: str,
    body: dict[str, Any],
    *,
    version: str = "1.1",
    connection: str | None = None,
) -> bytes:
    """A POST of `body` as JSON, with `Connection: <connection>` when given."""
    data = json.dumps(body).encode()
    head = [
        f"POST {path} HTTP/{version}",
        "Host: 127.0.0.1",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
    ]
    if connection is not None:
        head.append(f"Connection: {connection}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


async def read_response(reader: asyncio.StreamReader, timeout: float = 30) -> RawResponse:
    """Read one response; framing errors and a server that neither ends nor closes the
    body within `timeout` fail with AssertionError."""
    try:
        return await asyncio.wait_for(_read(reader), timeout)
    except TimeoutError:
        raise AssertionError(
            f"the response did not end within {timeout} s (a body with neither a length "
            "nor chunks ends only when the server closes the connection)"
        ) from None
    except asyncio.IncompleteReadError as e:
        raise AssertionError(f"the connection closed mid-response after {e.partial!r}") from None


async def _read(reader: asyncio.StreamReader) -> RawResponse:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    status_line, *lines = head[:-4].split("\r\n")
    version, status, _reason = status_line.split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        assert name.lower() not in headers, f"header {name} repeated"
        headers[name.lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        assert "content-length" not in headers, "both Transfer-Encoding and Content-Length"
        return RawResponse(version, int(status), headers, await _dechunk(reader), "chunked")
    assert "transfer-encoding" not in headers, headers["transfer-encoding"]
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
        return RawResponse(version, int(status), headers, body, "length")
    return RawResponse(version, int(status), headers, await reader.read(), "close")


async def _dechunk(reader: asyncio.StreamReader) -> bytes:
    out: list[bytes] = []
    while True:
        line = await reader.readuntil(b"\r\n")
        assert _SIZE_LINE.fullmatch(line), f"not a chunk-size line: {line!r}"
        size = int(line[:-2], 16)
        if size == 0:
            assert await reader.readexactly(2) == b"\r\n", "trailers or garbage after the end"
            return b"".join(out)
        out.append(await reader.readexactly(size))
        assert await reader.readexactly(2) == b"\r\n", "a chunk longer than its size line"


async def is_closed(reader: asyncio.StreamReader, timeout: float = 5) -> bool:
    """Whether the server closes the connection (nothing more comes) within `timeout`."""
    try:
        rest = await asyncio.wait_for(reader.read(1), timeout)
    except TimeoutError:
        return False
    assert rest == b"", f"bytes after the response: {rest!r}"
    return True


def sse_events(body: bytes) -> list[Any]:
    """The events of an SSE body made only of one-line `data:` events (what Narwhal
    writes), decoded; "[DONE]" kept as the string. Anything else fails."""
    assert body.endswith(b"\n\n"), f"the body does not end with an event: {body[-80:]!r}"
    assert not CHUNK_SIZE_LINE.search(body), "a chunk-size line inside the body"
    events: list[Any] = []
    for block in body[:-2].split(b"\n\n"):
        assert block.startswith(b"data: ") and b"\n" not in block and b"\r" not in block, (
            f"not a one-line data event: {block[:120]!r}"
        )
        data = block[len(b"data: ") :]
        events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return events
