"""A client that leaves while its stream is being written is an outcome, not an error.

The router and a simulated engine run in this process, the router without handler
cancellation (aiohttp's default), so the client's disconnect is found by the relay's own
write rather than by a cancelled task: the path a disconnect takes whenever it lands
between two writes before aiohttp has cancelled the handler.
"""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import urlsplit

import aiohttp
import pytest

from narwhal.config import Config, EngineConfig
from narwhal.router import Router
from narwhal.sim import SimOptions, start_sim
from tests.in_process import serve_app
from tests.metrics_text import samples

MODEL = "narwhal-sim"
GONE = 'narwhal_outcomes_total{outcome="client_gone"}'


async def test_a_client_gone_mid_write_is_counted_and_not_logged_as_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = await start_sim(SimOptions(model=MODEL, time_scale=0.0))
    config = Config(model=MODEL, engines=(EngineConfig(name="s0", url=sim.url),))
    runner, base = await serve_app(Router(config).app, handler_cancellation=False)
    port = urlsplit(base).port
    try:
        body = json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "#sim:slow_prefill=0.3 hello"}],
                "max_tokens": 8,
                "stream": True,
            }
        ).encode()
        with caplog.at_level(logging.ERROR, logger="aiohttp.server"):
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
            await asyncio.sleep(0.1)  # the router waits for the engine's first event
            writer.close()  # and the client leaves before it comes
            await writer.wait_closed()
            async with aiohttp.ClientSession() as session:
                for _ in range(100):
                    async with session.get(base + "/metrics") as resp:
                        values = samples(await resp.text())
                    if values[GONE] == 1:
                        break
                    await asyncio.sleep(0.05)
    finally:
        await runner.cleanup()
        await sim.close()
    assert values[GONE] == 1
    assert values["narwhal_offered_total"] == 1
    assert values["narwhal_decode_slots_in_use"] == values["narwhal_prefill_slots_in_use"] == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors
