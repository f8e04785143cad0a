"""/metrics is rendered by `narwhal.observability.exposition`: the bytes prometheus_client gives."""

from __future__ import annotations

import math

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

from narwhal.config import Config, EngineConfig
from narwhal.observability.exposition import Exposition
from narwhal.router import Router
from narwhal.sim import SimOptions, start_sim
from tests.in_process import serve_app

MODEL = "narwhal-sim"


def test_every_kind_of_sample_renders_as_prometheus_client_renders_it() -> None:
    registry = CollectorRegistry(auto_describe=True)
    counter = Counter("c", "a counter\nwith \\ a two-line help", ["engine"], registry=registry)
    counter.labels('we"ird\\name\nx').inc(3)
    counter.labels("plain").inc(1e21)  # Go-style exponent
    gauge = Gauge("g", "a gauge", ["a", "b"], registry=registry)
    gauge.labels(b="2", a="1").set(math.inf)
    gauge.labels(b="3", a="1").set(-math.inf)
    gauge.labels(b="4", a="1").set(math.nan)
    gauge.labels(b="5", a="1").set(-0.000123)
    Gauge("bare", "no labels", registry=registry).set(1234567.5)
    histogram = Histogram("h", "a histogram", ["stream"], buckets=(0.1, 1.0), registry=registry)
    histogram.labels("true").observe(0.5)
    histogram.labels("false").observe(7)
    Info("build", "an info", registry=registry).info({"version": "0.1.0"})
    exposition = Exposition(registry)
    for _ in range(2):  # the second time from what the first one kept
        assert exposition.render() == generate_latest(registry)
    counter.labels("late").inc()  # a series that appears between scrapes
    assert exposition.render() == generate_latest(registry)


async def test_the_router_metrics_page_is_what_prometheus_client_renders() -> None:
    sim = await start_sim(SimOptions(model=MODEL, time_scale=0.0))
    router = Router(Config(model=MODEL, engines=(EngineConfig(name="s0", url=sim.url),)))
    runner, url = await serve_app(router.app)
    try:
        async with aiohttp.ClientSession() as session:
            for stream in (True, False):
                body = {"model": MODEL, "prompt": "hi", "max_tokens": 4, "stream": stream}
                async with session.post(url + "/v1/completions", json=body) as response:
                    assert response.status == 200
            async with session.get(url + "/metrics") as response:
                page = await response.read()
        assert b'narwhal_outcomes_total{outcome="completed"} 2.0' in page
        assert b"\nprocess_cpu_seconds_total " in page  # the process collector's series too
        rendered = router.metrics.render()
        expected = generate_latest(router.metrics.registry)  # no await between the two
        assert _timeless(rendered) == _timeless(expected)
        # The page's series are the same (values such as loop lag move between reads).
        assert _series(page) == _series(rendered)
    finally:
        await runner.cleanup()
        await sim.close()


def _timeless(page: bytes) -> list[bytes]:
    """The page with gauges' and the process's values left out: some gauges are computed
    from the clock (a scrape's age, a model's time-weighted estimates) and the process
    collector reads the CPU time the renders themselves spend, so two renders differ
    there."""
    moving = {
        line.split()[2]
        for line in page.splitlines()
        if line.startswith(b"# TYPE ") and (line.endswith(b" gauge") or b" process_" in line)
    }
    return [
        line.rsplit(b" ", 1)[0] if line.split(b"{")[0].split()[0] in moving else line
        for line in page.splitlines()
    ]


def _series(page: bytes) -> list[bytes]:
    return [line.rsplit(b" ", 1)[0] for line in page.splitlines()]
