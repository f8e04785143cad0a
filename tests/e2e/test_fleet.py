"""Fleet and scheduler against several `narwhal sim` processes.

Placement follows load, engines leave and rejoin placement with their health, drain and
maintenance, the disaggregated P/D handshake, retries before headers and the 503 row.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from tests.e2e.conftest import MODEL, Start, chat, metrics_of, send, settle, sim_process
from tests.processes import NarwhalProcess, narwhal_process, router_process


def engine(name: str, proc: NarwhalProcess, role: str = "both", **extra: Any) -> dict[str, Any]:
    return {"name": name, "url": proc.url, "dialect": "vllm", "role": role, **extra}


def config_for(engines: list[dict[str, Any]], **sections: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model": MODEL,
        "engines": engines,
        "admission": {"mode": "open"},
        "fleet": {"probe_interval_s": 0.1, "stale_after_s": 1.0, "probe_timeout_s": 0.5},
    }
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value}
    return config


async def admin(router: NarwhalProcess, path: str, payload: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        if payload is None and path == "/admin/engines":
            async with session.get(router.url + path) as resp:
                return resp.status, await resp.json()
        async with session.post(router.url + path, json=payload) as resp:
            return resp.status, await resp.json()


async def engines_by_name(router: NarwhalProcess) -> dict[str, dict[str, Any]]:
    _, body = await admin(router, "/admin/engines")
    return {e["name"]: e for e in body["engines"]}


async def until(predicate: Any, timeout: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


def served_by(values: dict[str, float], name: str) -> float:
    return sum(
        v
        for k, v in values.items()
        if k.startswith("narwhal_ttft_seconds_count{") and f'engine="{name}"' in k
    )


async def test_placement_follows_load(start: Start) -> None:
    fast = start(sim_process("--time-scale", "1", "--decode-base-ms", "1"))
    slow = start(sim_process("--time-scale", "1", "--decode-base-ms", "40"))
    router = start(router_process(config_for([engine("fast", fast), engine("slow", slow)])))

    async def one(i: int) -> int:
        await asyncio.sleep(i * 0.01)
        return (await send(router.url, chat(f"q{i}", max_tokens=16, ignore_eos=True))).status

    statuses = await asyncio.gather(*(one(i) for i in range(60)))
    assert set(statuses) == {200}
    values = await metrics_of(router.url)
    assert served_by(values, "fast") > 2 * served_by(values, "slow")


async def test_a_killed_engine_leaves_placement_and_comes_back(start: Start) -> None:
    stays = start(sim_process("--time-scale", "0"))
    victim_cm = sim_process("--time-scale", "0")
    victim = victim_cm.__enter__()
    port = victim.url.rsplit(":", 1)[1]
    router = start(router_process(config_for([engine("stays", stays), engine("victim", victim)])))
    try:
        assert (await engines_by_name(router))["victim"]["eligible"]
        victim.terminate()
        assert await until(lambda: _eligible(router, "victim", False), timeout=5), (
            "the killed engine stayed eligible"
        )
        for _ in range(5):
            assert (await send(router.url, chat("still served"))).status == 200
    finally:
        victim_cm.__exit__(None, None, None)
    start(sim_process("--time-scale", "0", "--port", port))
    assert await until(lambda: _eligible(router, "victim", True), timeout=10)


async def _eligible(router: NarwhalProcess, name: str, want: bool) -> bool:
    return bool((await engines_by_name(router))[name]["eligible"]) is want


async def test_drain_finishes_in_flight_work_and_takes_no_new(start: Start) -> None:
    a = start(sim_process("--time-scale", "0"))
    b = start(sim_process("--time-scale", "0"))
    router = start(router_process(config_for([engine("a", a), engine("b", b)])))
    in_flight = [
        asyncio.create_task(send(router.url, chat("#sim:stall=1 x", stream=True, max_tokens=8)))
        for _ in range(6)
    ]
    await settle(router.url, lambda v: v["narwhal_decode_slots_in_use"] == 6)
    status, body = await admin(router, "/admin/engines/a/drain")
    assert (status, body) == (200, {"name": "a", "drained": True})
    engines = await engines_by_name(router)
    assert engines["a"]["state"] == "drained" and not engines["a"]["eligible"]
    on_a = engines["a"]["scores"]["decoding"]  # placed on a before the drain
    for _ in range(6):
        assert (await send(router.url, chat("new"))).status == 200
    replies = await asyncio.gather(*in_flight)
    assert all(r.status == 200 and r.events()[-1] == "[DONE]" for r in replies)
    values = await metrics_of(router.url)
    assert served_by(values, "a") == on_a  # a finished its own work and took no new
    assert served_by(values, "b") == 12 - on_a
    status, _ = await admin(router, "/admin/engines/a/undrain")
    assert status == 200 and (await engines_by_name(router))["a"]["eligible"]
    status, body = await admin(router, "/admin/engines/nobody/drain")
    assert status == 404


async def test_zero_eligible_engines_is_503_and_not_ready(start: Start) -> None:
    a = start(sim_process("--time-scale", "0"))
    router = start(router_process(config_for([engine("a", a, wave=1)])))
    await admin(router, "/admin/engines/a/drain")
    reply = await send(router.url, chat())
    assert reply.status == 503 and reply.headers["Retry-After"] == "1"
    assert reply.json()["error"]["code"] == "backend_unavailable"
    async with aiohttp.ClientSession() as session:
        async with session.get(router.url + "/ready") as resp:
            assert resp.status == 503
            assert await resp.json() == {"ready": False, "reason": "no_engines"}
    await admin(router, "/admin/engines/a/undrain")
    status, body = await admin(router, "/admin/maintenance", {"wave": 1, "action": "start"})
    assert status == 200 and body == {"active_waves": [1]}
    reply = await send(router.url, chat())
    assert reply.status == 503 and reply.json()["error"]["code"] == "router_unavailable"
    async with aiohttp.ClientSession() as session:
        async with session.get(router.url + "/ready") as resp:
            assert (await resp.json())["reason"] == "maintenance"
    await admin(router, "/admin/maintenance", {"wave": 1, "action": "end"})
    assert (await send(router.url, chat())).status == 200
    values = await metrics_of(router.url)
    assert values['narwhal_outcomes_total{outcome="unavailable"}'] == 2


async def test_retry_before_headers_succeeds_on_another_engine(start: Start) -> None:
    good = start(sim_process("--time-scale", "0"))
    doomed_cm = sim_process("--time-scale", "0")
    doomed = doomed_cm.__enter__()
    # Slow probes: the router still believes the dead engine is up when requests arrive.
    config = config_for(
        [engine("good", good), engine("doomed", doomed)],
        fleet={"probe_interval_s": 30, "stale_after_s": 60, "max_attempts": 2},
    )
    router = start(router_process(config))
    doomed_cm.__exit__(None, None, None)
    replies = await asyncio.gather(
        *(send(router.url, chat(f"r{i}", stream=i % 2 == 0)) for i in range(8))
    )
    assert [r.status for r in replies] == [200] * 8
    for reply in replies[::2]:
        assert reply.events().count("[DONE]") == 1


async def test_disaggregated_pair_carries_transfer_parameters(start: Start) -> None:
    slow_prefill = ("--time-scale", "1", "--prefill-tokens-per-s", "4000")
    prefill = start(sim_process(*slow_prefill, "--role", "prefill"))
    decode = start(sim_process(*slow_prefill, "--role", "decode"))
    router = start(
        router_process(
            config_for([engine("p0", prefill, "prefill"), engine("d0", decode, "decode")])
        )
    )
    prompt = "word " * 3000  # about 0.75 s of prefill at 4000 tokens/s
    reply = await send(
        router.url,
        chat(prompt, stream=True, max_tokens=8, return_token_ids=True),
        headers={"X-Request-Id": "pd-1"},
    )
    assert reply.status == 200, reply.raw
    events = [e for e in reply.events() if isinstance(e, dict)]
    assert reply.events()[-1] == "[DONE]"
    # Both halves carry one request id: the client's, made the request's own.
    (event_id,) = {e["id"] for e in events}
    assert event_id.startswith("chatcmpl-pd-1-")
    assert event_id == "chatcmpl-" + reply.headers["X-Request-Id"]
    ids = [i for e in events for c in e["choices"] for i in (c.get("token_ids") or [])]
    assert len(ids) == 8
    decode_metrics = await metrics_of(decode.url)
    prefill_metrics = await metrics_of(prefill.url)
    labels = '{engine="0",model_name="narwhal-sim"}'
    ttft_sum = decode_metrics[f"vllm:time_to_first_token_seconds_sum{labels}"]
    assert decode_metrics[f"vllm:time_to_first_token_seconds_count{labels}"] == 1
    assert ttft_sum < 0.4  # the decode engine did not run the 0.75 s prefill again
    assert prefill_metrics[f"vllm:time_to_first_token_seconds_sum{labels}"] > 0.5
    engines = await engines_by_name(router)
    assert engines["p0"]["role"] == "prefill" and engines["d0"]["role"] == "decode"
    assert engines["d0"]["token_accounting"] == "token_ids"
    reply = await send(router.url, chat("short one", max_tokens=5))
    assert reply.status == 200 and json.loads(reply.raw)["choices"][0]["message"]["content"]


async def test_an_engine_serving_another_model_is_not_eligible(start: Start) -> None:
    right = start(sim_process("--time-scale", "0"))
    with narwhal_process(["sim", "--port", "0", "--time-scale", "0", "--model", "other"]) as wrong:
        router = start(router_process(config_for([engine("right", right), engine("wrong", wrong)])))
        engines = await engines_by_name(router)
        assert engines["right"]["eligible"]
        assert not engines["wrong"]["eligible"]
        assert engines["wrong"]["monitoring"]["serves_model"] is False
        replies = await asyncio.gather(*(send(router.url, chat(f"m{i}")) for i in range(6)))
        assert [r.status for r in replies] == [200] * 6


async def test_reported_costs_follow_the_engines_after_traffic_stops(start: Start) -> None:
    """/admin/engines shows what the engines run now: the load an engine reported while
    requests were placed does not stay in its cost once they are gone."""
    sim = start(sim_process("--decode-base-ms", "200"))  # 4 tokens: about 0.8 s running
    router = start(router_process(config_for([engine("a", sim)])))
    long = [
        asyncio.create_task(send(router.url, chat(f"wait {i}", max_tokens=4, ignore_eos=True)))
        for i in range(4)
    ]
    # Placed while the engine's scrape says 4 running: its cost then counts them.
    assert await until(lambda: _engine_reports_running(sim, 4))
    await asyncio.sleep(0.3)  # a probe interval or more: the router's scrape sees them
    assert (await send(router.url, chat("quick", max_tokens=2))).status == 200
    assert all(reply.status == 200 for reply in await asyncio.gather(*long))
    assert await until(lambda: _engine_reports_running(sim, 0))

    async def idle() -> bool:
        return (await engines_by_name(router))["a"]["scores"]["cost"] == 0

    assert await until(idle, timeout=3.0)


async def _engine_reports_running(sim: NarwhalProcess, count: int) -> bool:
    values = await metrics_of(sim.url)
    return any(
        key.startswith("vllm:num_requests_running") and value == count
        for key, value in values.items()
    )


async def test_every_engine_has_its_series_from_the_start(start: Start) -> None:
    """A dashboard sees zeros for an engine that has served nothing yet, not a gap."""
    sims = [start(sim_process("--time-scale", "0")) for _ in range(2)]
    router = start(router_process(config_for([engine("a", sims[0]), engine("b", sims[1])])))
    values = await metrics_of(router.url)
    for name in ("a", "b"):
        assert values[f'narwhal_ttft_seconds_count{{engine="{name}"}}'] == 0
        assert values[f'narwhal_output_tokens_total{{engine="{name}",source="token_ids"}}'] == 0
        for stage in ("before_headers", "after_headers"):
            key = f'narwhal_engine_failures_total{{engine="{name}",stage="{stage}"}}'
            assert values[key] == 0
