"""What clients read never carries an engine's address (the router's log does), nor
another client's request id."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.e2e.conftest import MODEL, chat, send, sim_process
from tests.e2e.hostile import Exchange, HostileEngine, chunk, event, route_of
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


async def first_event_then_closed(exchange: Exchange) -> None:
    """A first event, then the connection closed in the middle of the chunked body (the
    script returns without ending it)."""
    await exchange.head()
    await exchange.send(event(chunk(route_of(exchange), "Hi")))
    await asyncio.sleep(0.2)  # a streaming client has its headers and first event


@pytest.mark.parametrize("stream", [True, False])
async def test_an_engine_that_breaks_its_stream_is_named_not_addressed(
    tmp_path: Path, stream: bool
) -> None:
    """The same failure, after the response started (an error event) and before it (a
    502, the non-streaming client's): the engine's name, never its host:port, which the
    router's log keeps."""
    log = tmp_path / "router.log"
    with HostileEngine(first_event_then_closed) as engine:
        config = {
            "model": MODEL,
            "engines": [{"name": "h0", "url": engine.url, "dialect": "openai"}],
            "admission": {"mode": "open"},
        }
        with router_process(config, stderr_path=log) as router:
            reply = await send(router.url, chat(max_tokens=4, stream=stream))
    assert not engine.errors, engine.errors
    if stream:
        assert reply.status == 200, reply.raw
        events = reply.events()
        assert "[DONE]" not in events
        message = events[-1]["error"]["message"]
    else:
        assert reply.status == 502, reply.raw
        message = reply.json()["error"]["message"]
    assert "closed the connection mid-body" in message and "h0" in message, message
    address = f"127.0.0.1:{engine.port}"
    assert address not in message and str(engine.port) not in message, message
    assert address in log.read_text()  # the operator's view keeps it


async def test_two_clients_with_one_request_id_get_requests_nothing_can_mix_up(
    tmp_path: Path,
) -> None:
    # vLLM makes the X-Request-Id it is sent its own request id (and the response's id);
    # two clients sending the same one must not collide there, nor share an id anywhere.
    arrivals = tmp_path / "arrivals"
    with sim_process("--arrival-log", str(arrivals), "--time-scale", "0.2") as sim:
        config = {
            "model": MODEL,
            "engines": [{"name": "e0", "url": sim.url, "role": "both"}],
            "admission": {"mode": "open"},
        }
        with router_process(config) as router:
            same = {"X-Request-Id": "client-7"}
            replies = await asyncio.gather(
                send(router.url, chat(max_tokens=16, stream=True), headers=same),
                send(router.url, chat(max_tokens=16), headers=same),
            )
    assert [r.status for r in replies] == [200, 200], [r.raw for r in replies]
    header_ids = {r.headers["X-Request-Id"] for r in replies}
    body_ids = {replies[0].events()[0]["id"], replies[1].json()["id"]}
    seen_by_engine = {line.split()[1] for line in arrivals.read_text().splitlines()}
    assert len(header_ids) == len(body_ids) == len(seen_by_engine) == 2
    assert seen_by_engine == header_ids
    assert all(request_id.startswith("client-7-") for request_id in header_ids)
    assert body_ids == {f"chatcmpl-{request_id}" for request_id in header_ids}
