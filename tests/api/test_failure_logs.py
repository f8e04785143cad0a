"""An engine failure is told to the operator: logged (which request, which engine, and
why) and counted per engine in `narwhal_engine_failures_total{engine,stage}`.

The client gets only the last failure (a 502 before the response starts, an error event
after it); the log keeps every attempt. The router and a simulated engine run in this
process so the test reads the router's log records directly.
"""

from __future__ import annotations

import logging

import aiohttp
import pytest

from narwhal.config import Config, EngineConfig, FleetConfig
from narwhal.router import Router
from narwhal.sim import SimOptions, start_sim
from tests.in_process import serve_app
from tests.metrics_text import samples

MODEL = "narwhal-sim"


async def test_every_failed_attempt_is_logged_with_its_request_and_engine(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sims = [await start_sim(SimOptions(model=MODEL, time_scale=0.0)) for _ in range(2)]
    config = Config(
        model=MODEL,
        engines=tuple(EngineConfig(name=f"s{i}", url=sim.url) for i, sim in enumerate(sims)),
        fleet=FleetConfig(max_attempts=2),
    )
    runner, base = await serve_app(Router(config).app)
    url = base + "/v1/chat/completions"

    async def post(content: str, request_id: str) -> tuple[int, bytes]:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 8,
            "stream": True,
        }
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=body, headers={"X-Request-Id": request_id}) as r:
                return r.status, await r.read()

    try:
        with caplog.at_level(logging.WARNING, logger="narwhal"):
            before, _ = await post("#sim:http_500 hi", "req-before")
            # The first tokens go out (and the response starts) before the stall.
            after, events = await post("#sim:stall=0.2 #sim:error_midstream=4 hi", "req-after")
        values = await _metrics(base)
    finally:
        await runner.cleanup()
        for sim in sims:
            await sim.close()
    assert before == 502
    assert after == 200 and b'"error"' in events
    messages = [r.getMessage() for r in caplog.records]
    # Two attempts, one on each engine: both failures are there, each with its engine.
    attempts = sorted(m for m in messages if m.startswith("request req-before-"))
    assert all(": attempt " in m for m in attempts), attempts
    assert len(attempts) == 2, messages
    assert {m.split(" on engine ")[1][:2] for m in attempts} == {"s0", "s1"}
    assert all("answered 500" in m for m in attempts), attempts
    (streamed,) = [m for m in messages if m.startswith("request req-after-")]
    assert "failed after the response started" in streamed
    assert "simulated engine failure" in streamed
    failures = 'narwhal_engine_failures_total{{engine="{}",stage="{}"}}'
    assert values[failures.format("s0", "before_headers")] == 1
    assert values[failures.format("s1", "before_headers")] == 1
    # The stream failed on whichever engine served it.
    assert sum(values[failures.format(e, "after_headers")] for e in ("s0", "s1")) == 1


async def test_a_failed_disaggregated_attempt_names_both_engines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    prefill = await start_sim(SimOptions(model=MODEL, time_scale=0.0, role="prefill"))
    decode = await start_sim(SimOptions(model=MODEL, time_scale=0.0, role="decode"))
    config = Config(
        model=MODEL,
        engines=(
            EngineConfig(name="p0", url=prefill.url, role="prefill"),
            EngineConfig(name="d0", url=decode.url, role="decode"),
        ),
    )
    runner, base = await serve_app(Router(config).app)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "#sim:http_500 hi"}]}
    try:
        with caplog.at_level(logging.WARNING, logger="narwhal"):
            async with aiohttp.ClientSession() as session:
                url = base + "/v1/chat/completions"
                async with session.post(url, json=body, headers={"X-Request-Id": "pd-1"}) as r:
                    assert r.status == 502
        values = await _metrics(base)
    finally:
        await runner.cleanup()
        await prefill.close()
        await decode.close()
    (message,) = [r.getMessage() for r in caplog.records if "pd-1" in r.getMessage()]
    assert "on prefill p0, decode d0 failed" in message and "answered 500" in message
    # Counted on the engine that failed: the prefill one.
    assert values['narwhal_engine_failures_total{engine="p0",stage="before_headers"}'] == 1
    assert values.get('narwhal_engine_failures_total{engine="d0",stage="before_headers"}', 0) == 0


async def _metrics(base: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session:
        async with session.get(base + "/metrics") as response:
            return samples(await response.text())
