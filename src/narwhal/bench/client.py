"""One request: send it, scan what comes back, fill in its record.

The clock starts just before the request is handed to aiohttp, so TTFT and
latency include waiting for a pooled connection. Reads are as large as
aiohttp has buffered (`iter_any`), each stamped once and given to the
`StreamScanner`; nothing is JSON-decoded and no chunk is kept.

How failures are classified (first match wins):

    status != 200                    HTTP (the body's first 64 KiB are read for its
                                     `error.code` and a sample; Retry-After kept)
    TimeoutError                     timeout (--timeout covers the whole request)
    ServerDisconnectedError          truncated after headers, disconnected before
    ClientPayloadError               truncated (broken chunked encoding)
    ClientConnectorError             connect
    ClientOSError, OSError           truncated after headers, connect before
    other ClientError                client_error
    200, an {"error": ...} event     error_event
    200, stream without [DONE]       truncated (unless it ended with a finish
                                     reason or usage)

With --no-stream the whole body arrives at once: its arrival is the TTFT, and
no TPOT or inter-token gap is recorded. A successful stream's inter-token gaps
go into the stage's `itl` histogram as the request ends (a failed one's are
dropped, as its TTFT and TPOT are), so none of them is kept per request. An
error response's latency ends when its body has been read, so a refusal's cost
is what a client would wait for it.
"""

from __future__ import annotations

import time

import aiohttp
import msgspec
from yarl import URL

from narwhal.bench.admission import error_code, retry_after
from narwhal.bench.histogram import LogHistogram
from narwhal.bench.record import (
    CLIENT_ERROR,
    CONNECT,
    DISCONNECTED,
    ERROR_EVENT,
    HTTP,
    NAN,
    TIMEOUT,
    TRUNCATED,
    Record,
    error_key,
)
from narwhal.bench.scanner import StreamScanner

perf = time.perf_counter
SAMPLE_BYTES = 300
ERROR_BODY_BYTES = 64 * 1024  # an error envelope is small; a server's HTML page need not be


async def execute(
    session: aiohttp.ClientSession,
    url: URL,
    body: bytes,
    record: Record,
    *,
    stream: bool,
    origin: float,
    keep_marks: bool = False,
    samples: dict[str, str] | None = None,
    body_parts: list[bytes] | None = None,
    itl: LogHistogram | None = None,
) -> None:
    """Send one request and record what happened; never raises for request errors.

    `samples` gets, for each error key not in it yet, a short text saying why
    (the start of the error body or event, or the exception). `body_parts`, when
    given, gets every read of a 200 response as it came (a conversation reads its
    reply from them once the response has ended, off the timed path).
    """
    scanner = StreamScanner(keep_marks)
    detail = b""
    t0 = perf()
    record.start = t0 - origin
    try:
        async with session.post(url, data=body) as resp:
            record.status = resp.status
            if resp.status != 200:
                record.error = HTTP
                answer = await _read_bounded(resp.content, ERROR_BODY_BYTES)
                record.code = error_code(answer)
                record.retry_after = retry_after(resp.headers.get("Retry-After"))
                detail = answer[:SAMPLE_BYTES]
            elif stream:
                async for data in resp.content.iter_any():
                    scanner.feed(data, perf() - t0)
                    if body_parts is not None:
                        body_parts.append(data)
                scanner.close(perf() - t0)
                if scanner.error_event:
                    record.error = ERROR_EVENT
                    detail = scanner.error_text
                elif not scanner.complete:
                    record.error = TRUNCATED
                    detail = b"the stream ended without [DONE] or a finish reason"
            else:
                payload = await resp.read()
                scanner.scan_body(payload, perf() - t0)
                if body_parts is not None:
                    body_parts.append(payload)
                if scanner.error_event:
                    record.error = ERROR_EVENT
                    detail = scanner.error_text
    except TimeoutError:
        record.error = TIMEOUT
        detail = b"no complete response within --timeout"
    except aiohttp.ClientError as exc:
        record.error = _classify(exc, record.status)
        detail = f"{type(exc).__name__}: {exc}".encode()
    except OSError as exc:
        record.error = TRUNCATED if record.status else CONNECT
        detail = f"{type(exc).__name__}: {exc}".encode()
    record.latency = perf() - t0
    record.events = scanner.events
    record.tokens = scanner.tokens
    record.usage_prompt_tokens = scanner.prompt_tokens
    record.cached_tokens = scanner.cached_tokens
    if scanner.first_output >= 0.0:
        record.ttft = scanner.first_output
        # A whole response arrives at once: its TTFT is that moment, its TPOT unknown.
        record.last_token = scanner.last_output if stream else NAN
    record.marks = scanner.marks
    if itl is not None and stream and record.error is None:
        itl.add_all(scanner.gaps, scanner.zero_gaps)
    if record.error is not None and samples is not None:
        key = error_key(record)
        if key is not None and key not in samples:
            samples[key] = detail[:SAMPLE_BYTES].decode("utf-8", "replace")


async def _read_bounded(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The body up to `limit` bytes; the rest is left unread (aiohttp then closes
    the connection rather than reuse it)."""
    parts: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await content.read(limit - size)
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


def _classify(exc: aiohttp.ClientError, status: int) -> str:
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return TRUNCATED if status else DISCONNECTED
    if isinstance(exc, aiohttp.ClientPayloadError):
        return TRUNCATED
    if isinstance(exc, aiohttp.ClientConnectorError):
        return CONNECT
    if isinstance(exc, aiohttp.ClientOSError):
        return TRUNCATED if status else CONNECT
    return CLIENT_ERROR


class SetupError(Exception):
    """The run cannot start (no model to ask for); the message says why."""


async def discover_model(
    session: aiohttp.ClientSession, base_url: str, timeout_s: float = 10.0
) -> str:
    """The first model id that GET /v1/models lists."""
    url = URL(base_url + "/v1/models")
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            payload = await resp.read()
            status = resp.status
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise SetupError(f"GET {url} failed: {exc or type(exc).__name__}") from None
    if status != 200:
        raise SetupError(f"GET {url} answered HTTP {status}; pass --model")
    try:
        listing = msgspec.json.decode(payload)
        model = listing["data"][0]["id"]
    except (msgspec.DecodeError, KeyError, IndexError, TypeError):
        raise SetupError(f"GET {url} listed no model; pass --model") from None
    if not isinstance(model, str):
        raise SetupError(f"GET {url} listed no model; pass --model")
    return model
