"""An engine behind HTTPS: Narwhal's own HTTP/1.1 client (engines/upstream.py) and the fleet
monitor's probes over TLS, with a certificate the router trusts only through the system
trust store (`SSL_CERT_FILE`), as an operator would install a private CA."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Iterator

import aiohttp
import pytest
import trustme

from tests.e2e.conftest import chat, fleet_config, send, sim_process
from tests.processes import NarwhalProcess, router_process


class TLSProxy:
    """A TLS front for a plain-HTTP engine, on its own thread and event loop (the router's
    first probes come while the test's loop waits for the router to start)."""

    def __init__(self, context: ssl.SSLContext, backend_port: int) -> None:
        self._context = context
        self._backend_port = backend_port
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.port = 0
        self.handshakes = 0
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),))

    def __enter__(self) -> TLSProxy:
        self._thread.start()
        assert self._ready.wait(10), "the TLS proxy did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self._loop.close()

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self._context)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handshakes += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._backend_port)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def https_engine(ca: trustme.CA) -> Iterator[TLSProxy]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    with sim_process("--time-scale", "0") as sim:
        with TLSProxy(context, int(sim.url.rsplit(":", 1)[1])) as proxy:
            yield proxy


def https_fleet(proxy: TLSProxy) -> dict[str, object]:
    engine = {"name": "t0", "url": f"https://127.0.0.1:{proxy.port}", "dialect": "vllm"}
    return {**fleet_config([]), "engines": [{**engine, "role": "both"}]}


@pytest.fixture(scope="module")
def router(
    https_engine: TLSProxy, ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NarwhalProcess]:
    ca_file = tmp_path_factory.mktemp("tls") / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    with router_process(https_fleet(https_engine), env={"SSL_CERT_FILE": str(ca_file)}) as r:
        yield r


async def engine_view(router: NarwhalProcess) -> dict[str, object]:
    async with aiohttp.ClientSession() as session:
        async with session.get(router.url + "/admin/engines") as resp:
            (engine,) = (await resp.json())["engines"]
    return dict(engine)


async def test_streams_and_answers_through_an_https_engine(
    router: NarwhalProcess, https_engine: TLSProxy
) -> None:
    assert (await engine_view(router))["eligible"] is True  # the monitor's probes got through
    streamed = await send(router.url, chat("Hello", stream=True, max_tokens=8))
    assert streamed.status == 200, streamed.raw
    assert streamed.events()[-1] == "[DONE]"
    events = [e for e in streamed.events() if isinstance(e, dict)]
    assert "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    whole = await send(router.url, chat("Hello", max_tokens=8, return_token_ids=True))
    assert whole.status == 200, whole.raw
    assert (
        len(whole.json()["choices"][0]["token_ids"]) == whole.json()["usage"]["completion_tokens"]
    )
    # Keep-alive over TLS: more requests, no handshake per request.
    before = https_engine.handshakes
    for _ in range(5):
        assert (await send(router.url, chat("Again", max_tokens=4))).status == 200
    assert https_engine.handshakes - before <= 1


async def test_an_untrusted_certificate_keeps_the_engine_out(https_engine: TLSProxy) -> None:
    """Without the CA the handshake fails: the engine is never placed, and a request gets
    a clear refusal rather than an answer from a server Narwhal could not verify."""
    with router_process(https_fleet(https_engine)) as router:
        view = await engine_view(router)
        assert view["eligible"] is False and view["state"] == "down"
        reply = await send(router.url, chat("Hello", max_tokens=4))
        assert reply.status == 503
        assert reply.json()["error"]["code"] == "backend_unavailable"
