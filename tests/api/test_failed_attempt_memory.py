"""A failed attempt gives its memory back when the request ends, without a garbage
collection: nothing the router keeps of a failure (for the retry, the log and the
client's 502) leads back to the attempt's buffers.

Each attempt buffers a large payload from a hostile engine and then fails before the
response starts: non-streaming, the assembler holds the content of many events when an
error event comes; streaming, the SSE decoder holds one unfinished event when the
connection drops. Two engines, two attempts per request, every request a 502. Once the
response has started (one attempt, a 200 and an error event), the stream fails on an
unfinished event cut off, on an event whose choices are millions of empty objects (the
decoded event is some 200 MB, and the failure is raised from deep inside its reading), on
an event that is not JSON (the decoder's own error is chained to the failure) and on the
request's deadline while an unfinished event is held. The router
runs in this process with the cyclic garbage collector off, and tracemalloc counts what
is still allocated once the requests are over; the payloads themselves are built before
tracing starts, so the engine's side counts nothing.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from narwhal.router import Router
from tests.hostile_engine import HostileEngine, Script, sse
from tests.in_process import serve_app

MODEL = "m"
PAYLOAD = 8 * 1024 * 1024  # bytes of content per attempt
PIECE = 64 * 1024
REQUESTS = 2
# What may stay allocated after REQUESTS requests (each leaving two attempts' PAYLOAD
# behind, when the failures keep them): logs, metrics, connection pools.
SLACK = 1024 * 1024


def _assembled_then_error() -> Script:
    """Content events worth PAYLOAD, then an engine error event."""
    content = sse({"id": "x", "choices": [{"index": 0, "delta": {"content": "x" * PIECE}}]})
    error = sse({"error": {"message": "out of memory", "type": "InternalServerError"}})
    return Script([content] * (PAYLOAD // PIECE) + [error])


def _unfinished_event_then_drop() -> Script:
    """One event that never ends, PAYLOAD long, then the connection drops."""
    head = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"'
    return Script([head] + [b"x" * PIECE] * (PAYLOAD // PIECE), abort=True)


def _started_then_unfinished_event_then_drop() -> Script:
    """A first output (the response starts), then `_unfinished_event_then_drop`."""
    first = sse(
        {"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "a"}}]}
    )
    unfinished = _unfinished_event_then_drop()
    return Script([first, *unfinished.pieces], abort=True)


def _started_then_empty_choices() -> Script:
    """A first event (the response starts), then one event PAYLOAD long (under
    fleet.max_event_bytes) whose choices are one valid choice and millions of empty
    objects: "malformed choice index" once the whole event is decoded."""
    first = sse(
        {"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "a"}}]}
    )
    valid = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"x"}}'
    empties = (PAYLOAD - len(valid) - 64) // 3
    return Script([first, valid + b",{}" * empties + b"]}\n\n"], pause_after=1)


def _started_then_not_json() -> Script:
    """A first event (the response starts), then one event PAYLOAD long that is not JSON."""
    first = sse(
        {"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "a"}}]}
    )
    head = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"'
    return Script([first, head + b"x" * (PAYLOAD - 64) + b"\n\n"], pause_after=1)


def _started_then_unfinished_event_then_silence() -> Script:
    """A first event (the response starts), then an unfinished event PAYLOAD long, and
    nothing more for longer than the request's deadline (DEADLINE)."""
    first = sse(
        {"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "a"}}]}
    )
    head = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"'
    return Script([first, head + b"x" * (PAYLOAD - 64), b"\n\n"], pause_after=2, pause_s=3)


DEADLINE = {"X-Request-Timeout": "1"}
CASES: dict[str, tuple[Callable[[], Script], bool, int, int]] = {
    # name: (the engine's answer, the client streams, status, engine requests per request)
    "assembled": (_assembled_then_error, False, 502, 2),
    "streaming": (_unfinished_event_then_drop, True, 502, 2),
    "after-headers": (_started_then_unfinished_event_then_drop, True, 200, 1),
    "after-headers, empty choices": (_started_then_empty_choices, True, 200, 1),
    "after-headers, not JSON": (_started_then_not_json, True, 200, 1),
    "after-headers, deadline": (_started_then_unfinished_event_then_silence, True, 200, 1),
}


@pytest.mark.usefixtures("no_gc")
@pytest.mark.parametrize("case", list(CASES))
async def test_failed_attempts_free_their_buffers_without_a_collection(case: str) -> None:
    make, stream, status, attempts = CASES[case]
    headers = DEADLINE if case.endswith("deadline") else None
    script = make()
    async with HostileEngine(lambda body: script, ports=2) as engine:
        router = Router(engine.config(MODEL))
        runner, base = await serve_app(router.app)
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": stream,
        }
        try:
            async with aiohttp.ClientSession() as session:

                async def fail() -> None:
                    url = base + "/v1/chat/completions"
                    async with session.post(url, json=body, headers=headers) as r:
                        answer = await r.read()
                        assert r.status == status, answer
                        assert (b"terminal_expiry" if headers else b"error") in answer

                await fail()  # first use: pools, caches, lazily built state
                tracemalloc.start()
                try:
                    before = tracemalloc.get_traced_memory()[0]
                    for _ in range(REQUESTS):
                        await fail()
                    retained = tracemalloc.get_traced_memory()[0] - before
                finally:
                    tracemalloc.stop()
        finally:
            await runner.cleanup()
    assert engine.requests == attempts * (REQUESTS + 1)
    assert retained < SLACK, f"{retained / 2**20:.1f} MiB still allocated"
