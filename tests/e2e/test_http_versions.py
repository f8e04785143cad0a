"""End to end over a raw socket: what HTTP/1.0 and HTTP/1.1 clients really receive.

HTTP/1.0 has no chunked encoding (RFC 9112 section 6.1), and nginx speaks HTTP/1.0 to its
upstreams unless told otherwise, so a stream to such a client must be the plain SSE bytes,
ended by the router closing the connection; a non-streaming answer carries its
Content-Length. HTTP/1.1 clients keep chunked framing, and their connection unless they
asked to close it. The events must be those an HTTP/1.1 client gets for the same request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.e2e.conftest import chat, completion, fleet_config, path_for, send, sim_process
from tests.processes import NarwhalProcess, router_process
from tests.raw_http import RawResponse, is_closed, read_response, request, sse_events


@pytest.fixture(scope="module")
def router() -> Iterator[NarwhalProcess]:
    with (
        sim_process("--time-scale", "0", "--seed", "7") as sim,
        router_process(fleet_config([("v0", sim, "vllm")], fleet={"max_attempts": 1})) as proc,
    ):
        yield proc


# (request builder, prompt, max_tokens): a short answer (often whole in hand before the
# headers go), one that stalls after its first events (so the rest is pushed as it comes),
# and a long one (many reads).
STREAMS = [
    (chat, "Tell me a story", 4),
    (chat, "#sim:stall=0.2 Tell me a story", 8),
    (completion, "#sim:long Once upon a time", 300),
]
STREAM_IDS = ["short", "stalled", "long"]


@asynccontextmanager
async def connection(router: NarwhalProcess) -> AsyncIterator[Connection]:
    host, port = router.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield Connection(reader, writer)
    finally:
        writer.close()


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self._writer = writer

    async def exchange(
        self, body: dict[str, Any], *, version: str, connection: str | None = None
    ) -> RawResponse:
        self._writer.write(request(path_for(body), body, version=version, connection=connection))
        await self._writer.drain()
        return await read_response(self.reader)

    async def closed(self, timeout: float = 5) -> bool:
        return await is_closed(self.reader, timeout)


def without_identity(event: Any) -> Any:
    """The event less what differs between any two requests: its id and time."""
    if not isinstance(event, dict):
        return event
    return {k: v for k, v in event.items() if k not in ("id", "created")}


async def same_as_http11(router: NarwhalProcess, body: dict[str, Any], events: list[Any]) -> None:
    reference = await send(router.url, body)
    assert [without_identity(e) for e in events] == [
        without_identity(e) for e in reference.events()
    ]


def assert_stream_head(response: RawResponse, version: str) -> None:
    assert response.version == f"HTTP/{version}" and response.status == 200, response
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-request-id"]
    assert "content-length" not in response.headers


@pytest.mark.parametrize("keep_alive", [None, "keep-alive"], ids=["plain", "keep-alive"])
@pytest.mark.parametrize(("make", "prompt", "tokens"), STREAMS, ids=STREAM_IDS)
async def test_http10_stream_is_plain_sse_ended_by_close(
    router: NarwhalProcess,
    make: Callable[..., dict[str, Any]],
    prompt: str,
    tokens: int,
    keep_alive: str | None,
) -> None:
    """Whatever the client's Connection header: a stream has no length, so its end is the
    connection's."""
    body = make(prompt, stream=True, max_tokens=tokens, ignore_eos=True)
    async with connection(router) as conn:
        response = await conn.exchange(body, version="1.0", connection=keep_alive)
    assert_stream_head(response, "1.0")
    assert response.framing == "close" and response.headers["connection"] == "close"
    events = sse_events(response.body)
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    assert sum(isinstance(e, dict) for e in events) >= tokens
    await same_as_http11(router, body, events)


async def test_http10_stream_failing_after_the_headers_ends_with_the_error_event(
    router: NarwhalProcess,
) -> None:
    body = chat("#sim:stall=0.2 #sim:error_midstream=5 go", stream=True, max_tokens=20)
    async with connection(router) as conn:
        response = await conn.exchange(body, version="1.0")
    assert_stream_head(response, "1.0")
    assert response.framing == "close"
    events = sse_events(response.body)
    assert "[DONE]" not in events
    assert set(events[-1]) == {"error"} and events[-1]["error"]["code"] == "upstream_error"


@pytest.mark.parametrize("make", [chat, completion])
async def test_http10_non_streaming_has_its_content_length(
    router: NarwhalProcess, make: Callable[..., dict[str, Any]]
) -> None:
    body = make("Describe the sea", max_tokens=16)
    async with connection(router) as conn:
        response = await conn.exchange(body, version="1.0")
        assert await conn.closed()
    assert response.version == "HTTP/1.0" and response.status == 200
    assert response.framing == "length"  # read by exactly its Content-Length
    assert int(response.headers["content-length"]) == len(response.body)
    reference = await send(router.url, body)
    assert without_identity(response.json()) == without_identity(reference.json())


async def test_http10_error_has_its_content_length(router: NarwhalProcess) -> None:
    async with connection(router) as conn:
        response = await conn.exchange(chat(model="no-such-model"), version="1.0")
        assert await conn.closed()
    assert response.status == 404 and response.framing == "length"
    assert response.json()["error"]["code"] == "model_not_found"


async def test_http10_keep_alive_serves_an_answer_then_closes_after_a_stream(
    router: NarwhalProcess,
) -> None:
    async with connection(router) as conn:
        answer = await conn.exchange(chat(max_tokens=5), version="1.0", connection="keep-alive")
        assert answer.framing == "length" and answer.headers["connection"] == "keep-alive"
        assert not await conn.closed(timeout=0.3)
        body = chat("#sim:stall=0.2 go", stream=True, max_tokens=6)
        streamed = await conn.exchange(body, version="1.0", connection="keep-alive")
    assert answer.json()["object"] == "chat.completion"
    assert streamed.framing == "close" and streamed.headers["connection"] == "close"
    assert sse_events(streamed.body)[-1] == "[DONE]"


@pytest.mark.parametrize(("make", "prompt", "tokens"), STREAMS, ids=STREAM_IDS)
async def test_http11_connection_close_gets_chunks_then_the_close(
    router: NarwhalProcess, make: Callable[..., dict[str, Any]], prompt: str, tokens: int
) -> None:
    body = make(prompt, stream=True, max_tokens=tokens, ignore_eos=True)
    async with connection(router) as conn:
        response = await conn.exchange(body, version="1.1", connection="close")
        assert await conn.closed()
    assert_stream_head(response, "1.1")
    assert response.framing == "chunked" and response.headers["connection"] == "close"
    events = sse_events(response.body)
    assert events[-1] == "[DONE]"
    await same_as_http11(router, body, events)


async def test_http11_keep_alive_gets_chunks_on_one_connection(router: NarwhalProcess) -> None:
    async with connection(router) as conn:
        responses = []
        for make, prompt, tokens in [*STREAMS, *STREAMS]:
            body = make(prompt, stream=True, max_tokens=tokens, ignore_eos=True)
            responses.append((body, await conn.exchange(body, version="1.1")))
        answer = await conn.exchange(chat(max_tokens=5), version="1.1")
        assert not await conn.closed(timeout=0.3)
    for body, response in responses:
        assert_stream_head(response, "1.1")
        assert response.framing == "chunked" and "connection" not in response.headers
        await same_as_http11(router, body, sse_events(response.body))
    assert answer.framing == "length" and answer.json()["object"] == "chat.completion"
