"""What clients read never carries an engine's address (the router's log does), nor
another client's request id."""

from __future__ import annotations

import asyncio
from pathlib import Path

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
