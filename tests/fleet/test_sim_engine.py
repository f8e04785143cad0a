"""The monitor against the project's simulated engine (`narwhal.sim`), when it is there."""

from __future__ import annotations

import time

import aiohttp
import pytest

from narwhal.config import EngineConfig, FleetConfig
from narwhal.fleet.scrape import parse_engine_metrics
from tests.fleet.conftest import MonitorFactory
from tests.fleet.fake_engine import wait_for

try:
    from narwhal.sim import SimOptions, start_sim
except ImportError as e:  # built by another engineer at the same time as the monitor
    pytest.skip(f"narwhal.sim is not importable yet ({e})", allow_module_level=True)

FLEET = FleetConfig(probe_interval_s=0.05, stale_after_s=1.0, probe_timeout_s=0.5)


@pytest.mark.parametrize(
    ("dialect", "metrics"), [("vllm", "ok"), ("sglang", "ok"), ("openai", "unsupported")]
)
async def test_idle_sim_engine(make_monitor: MonitorFactory, dialect: str, metrics: str) -> None:
    sim = await start_sim(SimOptions(dialect=dialect), port=0)  # type: ignore[arg-type]
    try:
        config = EngineConfig(name="sim", url=sim.url, dialect=dialect)  # type: ignore[arg-type]
        monitor = make_monitor([config], FLEET)
        await monitor.start()
        assert monitor.is_placeable("sim")
        report = monitor.report("sim", time.monotonic())
        assert (report["health"], report["metrics"]) == ("up", metrics)
        if metrics == "ok":
            assert report["last_scrape"] == {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0}
        await monitor.close()
    finally:
        await sim.close()


async def test_sim_engine_load_is_seen(
    make_monitor: MonitorFactory, session: aiohttp.ClientSession
) -> None:
    # Slowed down 10x: one request decodes for seconds, long enough to be scraped.
    sim = await start_sim(SimOptions(time_scale=10.0), port=0)
    try:
        monitor = make_monitor([EngineConfig(name="sim", url=sim.url)], FLEET)
        await monitor.start()
        body = {
            "model": SimOptions().model,
            "prompt": "Tell me a long story about a narwhal.",
            "max_tokens": 400,
            "stream": True,
        }
        async with session.post(sim.url + "/v1/completions", json=body) as response:
            assert response.status == 200
            await response.content.readline()  # the first event: the request is running

            def running() -> float | None:
                scrape = monitor.health("sim").last_scrape
                return None if scrape is None else scrape.running

            await wait_for(lambda: (running() or 0) >= 1, within=3.0)
            assert monitor.health("sim").last_scrape is not None
        # The request is gone (connection closed): the engine drains back to idle.
        await wait_for(lambda: running() == 0, within=5.0)
    finally:
        await sim.close()


async def test_prefix_cache_of_a_sim_engine_is_read(session: aiohttp.ClientSession) -> None:
    """The router's scrape reads what the sim exposes the way vLLM does."""
    sim = await start_sim(
        SimOptions(time_scale=0.0, block_size=32, kv_capacity_tokens=32_000), port=0
    )
    try:
        prompt = list(range(100, 300))  # 200 token IDs: 6 full blocks of 32
        body = {"model": SimOptions().model, "prompt": prompt, "max_tokens": 1}
        for _ in range(2):
            async with session.post(sim.url + "/v1/completions", json=body) as response:
                assert response.status == 200
        async with session.get(sim.url + "/metrics") as response:
            scrape = parse_engine_metrics(await response.text(), ("vllm",))
        assert scrape is not None
        assert (scrape.block_size, scrape.num_gpu_blocks) == (32, 1000)
        assert (scrape.prefix_cache_queries, scrape.prefix_cache_hits) == (400.0, 192.0)
    finally:
        await sim.close()
