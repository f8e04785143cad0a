"""A hostile engine: an OpenAI-compatible server on 127.0.0.1 whose completion answers are
scripted byte for byte, on its own thread and event loop (the router's first probes come
while the test's loop waits for the router to start).

It answers `GET /health` (200), `GET /v1/models` (the test model) and `GET /metrics` (404,
as `transformers serve` does), so the router places requests on it as an engine of the
`openai` dialect. Every completion request runs the test's script, which writes the
response itself through an `Exchange`: the head, chunks of a chunked body, maybe its end.
A script that ends the body leaves the connection open for the next request (keep-alive);
one that does not has the connection closed when it returns.

`open_connections` (those that carried a completion request) is the engine-side evidence
that the router let go of its connections instead of keeping them for reuse.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tests.e2e.conftest import MODEL

_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


class Exchange:
    """One completion request on the hostile engine, and its response as it is written."""

    def __init__(self, body: dict[str, Any], reader: asyncio.StreamReader, writer: Any) -> None:
        self.body = body
        self._reader = reader
        self._writer: asyncio.StreamWriter = writer
        self.ended = False  # the body's last chunk went out: the connection may be reused

    @property
    def prompt(self) -> str:
        if "prompt" in self.body:
            return str(self.body["prompt"])
        return str(self.body["messages"][-1]["content"])

    async def head(self) -> None:
        """A 200 event-stream head with a chunked body."""
        self._writer.write(_SSE_HEAD)
        await self._writer.drain()

    async def send(self, data: bytes) -> None:
        """One chunk of the body (not empty)."""
        self._writer.write(b"%x\r\n%b\r\n" % (len(data), data))
        await self._writer.drain()

    async def repeat(self, piece: bytes, total: int) -> None:
        """`total` bytes of the body, `piece` over and over (the last one cut)."""
        sent = 0
        while sent < total:
            data = piece[: total - sent]
            await self.send(data)
            sent += len(data)

    async def end(self) -> None:
        self._writer.write(b"0\r\n\r\n")
        await self._writer.drain()
        self.ended = True

    async def until_closed(self, timeout: float) -> bool:
        """Wait for the router to close the connection; True if it did within `timeout`."""
        try:
            async with asyncio.timeout(timeout):
                while await self._reader.read(65536):
                    pass
        except TimeoutError:
            return False
        return True


Script = Callable[[Exchange], Awaitable[None]]


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def chunk(route: str, text: str | None = None, finish: str | None = None) -> dict[str, Any]:
    """An OpenAI streaming chunk with one choice, index 0."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if route == "completion":
        choice["text"] = text or ""
    else:
        choice["delta"] = {"content": text} if text is not None else {}
    obj = "text_completion" if route == "completion" else "chat.completion.chunk"
    return {"id": "h-1", "object": obj, "created": 1, "model": MODEL, "choices": [choice]}


def route_of(exchange: Exchange) -> str:
    return "completion" if "prompt" in exchange.body else "chat"


async def well_behaved(exchange: Exchange) -> None:
    """A short, correct answer: "Hello", finished, usage, [DONE], the end of the body."""
    route = route_of(exchange)
    await exchange.head()
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    done = {**chunk(route, "", "stop"), "choices": [], "usage": usage}
    await exchange.send(event(chunk(route, "Hello")) + event(chunk(route, "", "stop")))
    await exchange.send(event(done) + b"data: [DONE]\n\n")
    await exchange.end()


class HostileEngine:
    def __init__(self, script: Script) -> None:
        self._script = script
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.port = 0
        self.requests = 0  # completion requests received
        self.open_connections = 0  # that carried a completion request (probes aside)
        self.connections = 0  # that carried one, ever
        self.errors: list[str] = []  # what went wrong in a script, for the test to show
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> HostileEngine:
        self._thread.start()
        assert self._ready.wait(10), "the hostile engine did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self._loop.close()

    def wait_idle(self, timeout: float = 10) -> bool:
        """Until no connection that carried a completion is open (the router let go of
        all of them: closed, not kept for reuse)."""
        end = time.monotonic() + timeout
        while self.open_connections and time.monotonic() < end:
            time.sleep(0.02)
        return not self.open_connections

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        carried = [False]
        try:
            while await self._one(reader, writer, carried):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the router closed it (reset, or EOF mid-request)
        except Exception as e:  # a bug in a script: the test shows it
            self.errors.append(repr(e))
        finally:
            if carried[0]:
                self.open_connections -= 1
            writer.close()

    async def _one(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, carried: list[bool]
    ) -> bool:
        """Serve one request; whether the connection may carry another."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            if not e.partial:
                return False  # closed between requests
            raise
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        if method == "GET":
            if path == "/health":
                answer, status = b"{}", b"200 OK"
            elif path == "/v1/models":
                answer = json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode()
                status = b"200 OK"
            else:
                answer, status = b'{"detail":"Not Found"}', b"404 Not Found"
            writer.write(
                b"HTTP/1.1 %b\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                % (status, len(answer), answer)
            )
            await writer.drain()
            return True
        self.requests += 1
        if not carried[0]:
            carried[0] = True
            self.open_connections += 1
            self.connections += 1
        exchange = Exchange(json.loads(raw), reader, writer)
        await self._script(exchange)
        return exchange.ended
