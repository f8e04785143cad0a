"""Everything at once: a mixed fleet, every engine fault the simulator scripts, bad
bodies, short deadlines, clients that leave, a drain, and an engine killed and started
again mid-run. Afterwards the router must have told every client the truth (a stream
either ends with `[DONE]` or with an error event, never silently) and must hold nothing
(DESIGN.md §1: one counted terminal outcome per request, every slot released).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from typing import Any

import aiohttp
import pytest

from tests.e2e.conftest import MODEL, settle, sim_process
from tests.e2e.test_admission import GAUGES, quiescent
from tests.processes import NarwhalProcess, narwhal_process, router_process

REQUESTS = 600
CONCURRENCY = 60
ARRIVAL_GAP_S = 0.006  # 600 arrivals over 3.6 s: the drain and the kill fall among them
SCENARIOS = (
    ("",) * 4
    + ("#sim:tool_calls", "#sim:function_call", "#sim:reasoning", "#sim:refusal")
    + ("#sim:logprobs", "#sim:long", "#sim:len=3")
    + ("#sim:no_token_ids", "#sim:bool_token_id", "#sim:negative_token_id")
    + ("#sim:malformed_token_ids", "#sim:audio_delta", "#sim:annotations")
    + ("#sim:error_midstream", "#sim:error_midstream=1", "#sim:disconnect_midstream")
    + ("#sim:disconnect_midstream=0", "#sim:stall=0.3", "#sim:slow_prefill=0.2")
    + ("#sim:http_500",)
)


def _request(rng: random.Random, i: int) -> tuple[str, bytes, dict[str, str], bool]:
    """(path, body bytes, headers, streaming) for request `i`."""
    scenario = rng.choice(SCENARIOS)
    stream = rng.random() < 0.6
    body: dict[str, Any] = {"model": MODEL, "max_tokens": rng.choice([1, 4, 16]), "stream": stream}
    if rng.random() < 0.5:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": f"request {i} {scenario}"}]
    else:
        path = "/v1/completions"
        body["prompt"] = f"request {i} {scenario}"
    if rng.random() < 0.3:
        body["return_token_ids"] = True
    if stream and rng.random() < 0.3:
        body["stream_options"] = {"include_usage": True}
    headers = {"Content-Type": "application/json"}
    if rng.random() < 0.2:
        headers["X-Request-Timeout"] = f"{rng.uniform(0.05, 1.5):.3f}"
    raw = json.dumps(body).encode()
    kind = rng.random()
    if kind < 0.03:
        raw = raw[: len(raw) // 2]  # broken JSON
    elif kind < 0.05:
        raw = json.dumps({**body, "model": "another-model"}).encode()
    return path, raw, headers, stream


@pytest.mark.parametrize("mode", ["open", "predictive"])
async def test_every_request_is_answered_truthfully_and_released(mode: str) -> None:
    """In predictive mode also: every engine profiled again after its restart, and the
    models hold nothing afterwards (no prefill left in a lane, no decode in a book)."""
    rng = random.Random(11)
    with (
        sim_process("--time-scale", "0.3", "--seed", "1") as vllm,
        sim_process("--time-scale", "0.3", "--seed", "2", "--dialect", "sglang") as sglang,
    ):
        config = {
            "model": MODEL,
            "engines": [
                {"name": "v0", "url": vllm.url, "dialect": "vllm", "role": "both"},
                {"name": "g0", "url": sglang.url, "dialect": "sglang", "role": "both"},
            ],
            "admission": {
                "mode": mode,
                "ttft_target_s": 5.0,
                "queue_limit": 40,
                "wait_timeout_s": 1.0,
                "phase_concurrency": {"prefill": 24, "decode": 64},
            },
            "serving": {"max_retained": 90, "request_timeout_s": 5},
            "fleet": {"probe_interval_s": 0.2, "stale_after_s": 1.0, "max_attempts": 2},
        }
        with router_process(config) as router, contextlib.ExitStack() as restarted:
            seen, values = await _run(router, vllm, rng, restarted)
            engines = await _engines(router, profiled=mode == "predictive")
    # Told the truth: every stream that started ended with [DONE] or an error event.
    assert seen["stream cut short"] == 0, seen
    assert seen["stream done"] > 50 and seen["stream error event"] > 0, seen
    # Held nothing: each offered request has one outcome, and every gauge is back to zero.
    outcomes = {k: v for k, v in values.items() if k.startswith("narwhal_outcomes_total{")}
    assert values["narwhal_offered_total"] == sum(outcomes.values())
    assert values["narwhal_offered_total"] >= REQUESTS - seen["left"]
    for gauge in GAUGES:
        assert values[gauge] == 0, gauge
    assert (
        values['narwhal_outcomes_total{outcome="completed"}']
        >= seen["status 200"] - (seen["stream error event"])
    )
    for engine in engines:
        assert engine["scores"]["prefilling"] == engine["scores"]["decoding"] == 0, engine
        if mode == "predictive":
            assert engine["profiling"]["state"] == "profiled", engine
            assert engine["scores"]["backlog_s"] == 0, engine
            assert engine["scores"]["decode_work_tokens"] == 0, engine


async def _run(
    router: NarwhalProcess,
    vllm: NarwhalProcess,
    rng: random.Random,
    restarted: contextlib.ExitStack,
) -> tuple[Counter[str], dict[str, float]]:
    seen: Counter[str] = Counter()
    limit = asyncio.Semaphore(CONCURRENCY)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(i: int) -> None:
            path, raw, headers, stream = _request(rng, i)
            leave_after = rng.uniform(0.02, 0.5) if rng.random() < 0.1 else None
            await asyncio.sleep(i * ARRIVAL_GAP_S)  # arrivals spread over the run
            async with limit:
                try:
                    async with asyncio.timeout(leave_after):
                        async with session.post(router.url + path, data=raw, headers=headers) as r:
                            body = await r.read()
                            seen[f"status {r.status}"] += 1
                            if r.status == 200 and stream:
                                seen[_stream_end(body)] += 1
                except TimeoutError:
                    seen["left"] += 1

        tasks = [asyncio.create_task(one(i)) for i in range(REQUESTS)]
        await asyncio.sleep(0.4)
        for action in ("drain", "undrain"):
            async with session.post(f"{router.url}/admin/engines/v0/{action}") as response:
                assert response.status == 200
            await asyncio.sleep(0.3)
        # The vLLM engine dies with requests on it, and comes back on the same port.
        port = vllm.url.rsplit(":", 1)[1]
        vllm.proc.kill()
        await asyncio.to_thread(vllm.proc.wait)
        await asyncio.sleep(0.8)
        sim = narwhal_process(
            ["sim", "--port", port, "--model", MODEL, "--time-scale", "0.3", "--seed", "1"]
        )
        await asyncio.to_thread(restarted.enter_context, sim)
        await asyncio.gather(*tasks)
    values = await settle(router.url, quiescent)
    return seen, values


def _stream_end(body: bytes) -> str:
    events = [line[5:].strip() for line in body.splitlines() if line.startswith(b"data:")]
    if events and events[-1] == b"[DONE]":
        return "stream done"
    if events and b'"error"' in events[-1]:
        return "stream error event"
    return "stream cut short"


async def _engines(router: NarwhalProcess, profiled: bool) -> list[dict[str, Any]]:
    """/admin/engines; with `profiled`, once every engine is (the restarted one's new
    profile may still be on its way on a loaded machine), or as it is after 15 s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(router.url + "/admin/engines") as response:
                engines: list[dict[str, Any]] = (await response.json())["engines"]
            if not profiled or loop.time() > deadline:
                return engines
            if all(e["profiling"]["state"] == "profiled" for e in engines):
                return engines
            await asyncio.sleep(0.1)
