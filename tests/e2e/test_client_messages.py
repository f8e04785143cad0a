"""What clients read never carries an engine's address (the router's log does)."""

from __future__ import annotations

from tests.e2e.conftest import MODEL, chat, send, sim_process
from tests.processes import router_process


async def test_an_unreachable_engine_is_named_not_addressed() -> None:
    with sim_process() as sim:
        port = sim.url.rsplit(":", 1)[1]
        config = {
            "model": MODEL,
            "engines": [{"name": "e0", "url": sim.url, "role": "both"}],
            "admission": {"mode": "open"},
            "fleet": {"probe_interval_s": 30, "stale_after_s": 60},  # not noticed in time
        }
        with router_process(config) as router:
            assert (await send(router.url, chat(max_tokens=2))).status == 200
            sim.terminate()  # gone, and the monitor has not looked since
            reply = await send(router.url, chat(max_tokens=2))
    assert reply.status == 502, reply.raw
    message = reply.json()["error"]["message"]
    assert "e0" in message
    assert port not in message and "127.0.0.1" not in message, message
