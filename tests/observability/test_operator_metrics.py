"""The series an operator builds dashboards and alerts from, over a real router and sims.

Request duration and token counters by route and stream, the prefill engine's share of a
disaggregated pair, each engine's placement state, the build and the process.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from narwhal import DISTRIBUTION
from narwhal.config import AdmissionConfig, Config, EngineConfig, FleetConfig
from narwhal.router import Router
from narwhal.sim import SimOptions, start_sim
from tests.hostile_engine import HostileEngine, Script, sse
from tests.in_process import serve_app
from tests.metrics_text import samples, series

MODEL = "narwhal-sim"
DURATION = "narwhal_request_duration_seconds"
PROMPT = "narwhal_prompt_tokens_total"
COMPLETION = "narwhal_completion_tokens_total"
PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


@asynccontextmanager
async def router_over(
    engines: Sequence[tuple[str, SimOptions, dict[str, Any]]],
) -> AsyncIterator[str]:
    """A router (open admission) over one in-process sim per engine; its base URL."""
    sims = [await start_sim(options) for _, options, _ in engines]
    try:
        config = Config(
            model=MODEL,
            engines=tuple(
                EngineConfig(name=name, url=sim.url, **extra)
                for (name, _, extra), sim in zip(engines, sims, strict=True)
            ),
            admission=AdmissionConfig(mode="open"),
            fleet=FleetConfig(probe_interval_s=0.1),
        )
        runner, url = await serve_app(Router(config).app)
        try:
            yield url
        finally:
            await runner.cleanup()
    finally:
        for sim in sims:
            await sim.close()


def instant(**fields: Any) -> SimOptions:
    return SimOptions(model=MODEL, time_scale=0.0, **fields)


async def metrics_of(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        assert resp.status == 200
        return samples(await resp.text())


def body_for(route: str, text: str, stream: bool, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 5, "stream": stream, **fields}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def post(url: str, route: str, body: dict[str, Any] | bytes) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + PATHS[route], data=data, headers=headers) as resp,
    ):
        return resp.status, await resp.read()


def usage_of(raw: bytes, stream: bool) -> dict[str, int]:
    """The usage the client got: the body's, or the stream's usage chunk."""
    if not stream:
        usage: dict[str, int] = json.loads(raw)["usage"]
        return usage
    events = [
        json.loads(line[5:])
        for line in raw.split(b"\n")
        if line.startswith(b"data:") and line[5:].strip() != b"[DONE]"
    ]
    (usage,) = [e["usage"] for e in events if e.get("usage")]
    return usage


def moved(before: dict[str, float], after: dict[str, float], prefix: str) -> dict[str, float]:
    """The samples named `prefix...` whose value changed, and by how much."""
    return {
        key: after[key] - before.get(key, 0.0)
        for key in after
        if key.startswith(prefix) and after[key] != before.get(key, 0.0)
    }


async def test_every_request_is_timed_and_its_tokens_counted_by_route_and_stream() -> None:
    async with router_over([("s0", instant(), {})]) as url:
        for route in ("chat", "completion"):
            for stream in (False, True):
                before = await metrics_of(url)
                text = f"Tell me about {route} and stream={stream}, at some length please"
                status, raw = await post(url, route, body_for(route, text, stream))
                assert status == 200, raw
                usage = usage_of(raw, stream)
                after = await metrics_of(url)
                labels = {"route": route, "stream": "true" if stream else "false"}
                # One observation, in this route and stream's completed series only.
                assert moved(before, after, DURATION + "_count") == {
                    series(DURATION + "_count", **labels, completed="true"): 1
                }
                assert after[series(DURATION + "_bucket", **labels, completed="true", le="+Inf")]
                # The tokens the client's usage reported, under this route and stream only.
                assert moved(before, after, PROMPT) == {
                    series(PROMPT, **labels): usage["prompt_tokens"]
                }
                assert moved(before, after, COMPLETION) == {
                    series(COMPLETION, **labels): usage["completion_tokens"]
                }
                assert usage["completion_tokens"] == 5 and usage["prompt_tokens"] > 0

        # Every outcome is timed: a stream whose engine fails before its headers (502), and
        # a body that cannot be parsed (its stream flag unknown: the answer is JSON, so
        # stream="false").
        before = await metrics_of(url)
        failing = body_for("chat", "#sim:error_midstream=2 hello", True)
        status, raw = await post(url, "chat", failing)
        assert status == 502, raw
        status, _ = await post(url, "completion", b'{"model": ')
        assert status == 400
        after = await metrics_of(url)
        assert moved(before, after, DURATION + "_count") == {
            series(DURATION + "_count", route="chat", stream="true", completed="false"): 1,
            series(DURATION + "_count", route="completion", stream="false", completed="false"): 1,
        }
        outcomes = moved(before, after, "narwhal_outcomes_total")
        assert outcomes == {
            'narwhal_outcomes_total{outcome="upstream_error"}': 1,
            'narwhal_outcomes_total{outcome="invalid"}': 1,
        }
        # Neither answer carried tokens: the failed attempts' own are not counted.
        assert moved(before, after, PROMPT) == moved(before, after, COMPLETION) == {}


async def test_prompt_tokens_are_the_engines_count_and_a_broken_stream_counts_its_tokens() -> None:
    """The engine counts the prompt at 1000 tokens (a template of its own, say), far from
    the router's sizing of "hi": the counter and the client's usage both say 1000. A
    stream that breaks after its headers still gave the client its tokens."""
    chunk = sse({"id": "x", "choices": [{"index": 0, "delta": {"content": "hi"}}]})
    finish = sse({"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    usage = sse(
        {"id": "x", "choices": [], "usage": {"prompt_tokens": 1000, "completion_tokens": 1}}
    )

    def script(body: dict[str, Any]) -> Script:
        if "break" in json.dumps(body["messages"]):
            return Script([chunk, chunk], pause_after=1, abort=True)
        return Script([chunk, finish, usage, sse("[DONE]")])

    async with HostileEngine(script) as engine:
        runner, url = await serve_app(Router(engine.config(MODEL)).app)
        try:
            for stream in (False, True):
                before = await metrics_of(url)
                status, raw = await post(url, "chat", body_for("chat", "hi", stream))
                assert status == 200, raw
                assert usage_of(raw, stream)["prompt_tokens"] == 1000
                after = await metrics_of(url)
                labels = {"route": "chat", "stream": "true" if stream else "false"}
                assert moved(before, after, PROMPT) == {series(PROMPT, **labels): 1000}
                assert moved(before, after, COMPLETION) == {series(COMPLETION, **labels): 1}

            before = await metrics_of(url)
            status, raw = await post(url, "chat", body_for("chat", "break", True))
            assert status == 200 and b"[DONE]" not in raw  # ended with an error event
            after = await metrics_of(url)
        finally:
            await runner.cleanup()
    assert moved(before, after, "narwhal_outcomes_total") == {
        'narwhal_outcomes_total{outcome="upstream_error"}': 1
    }
    assert moved(before, after, DURATION + "_count") == {
        series(DURATION + "_count", route="chat", stream="true", completed="false"): 1
    }
    # No usage came: the prompt is the router's own sizing of "break", a token or two.
    (sized,) = moved(before, after, PROMPT).values()
    assert 0 < sized < 10
    # Both chunks the client got count (without IDs or usage: one token an event).
    assert raw.count(b'"content":"hi"') == 2
    assert moved(before, after, COMPLETION) == {series(COMPLETION, route="chat", stream="true"): 2}


async def test_the_page_carries_build_process_and_engine_state_series() -> None:
    async with router_over([("s0", instant(), {"wave": 1}), ("s1", instant(), {})]) as url:
        values = await metrics_of(url)
    version = importlib.metadata.version(DISTRIBUTION)
    assert values[f'narwhal_build_info{{version="{version}"}}'] == 1
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_start_time_seconds",
        "process_open_fds",
        "process_max_fds",
    ):
        assert values[name] > 0, name
    assert any(key.startswith("python_info{") for key in values)
    for engine in ("s0", "s1"):
        assert values[f'narwhal_engine_eligible{{engine="{engine}"}}'] == 1
        assert values[f'narwhal_engine_drained{{engine="{engine}"}}'] == 0
        assert values[f'narwhal_engine_in_maintenance{{engine="{engine}"}}'] == 0
    # Only prefill engines have a prefill series: neither of these is one.
    assert not any(key.startswith("narwhal_prefill_seconds") for key in values)


async def test_drain_and_maintenance_show_at_the_next_scrape() -> None:
    async with router_over([("s0", instant(), {"wave": 1}), ("s1", instant(), {})]) as url:

        async def admin(path: str, payload: Any = None) -> None:
            async with (
                aiohttp.ClientSession() as session,
                session.post(url + path, json=payload) as resp,
            ):
                assert resp.status == 200, await resp.text()

        def state(values: dict[str, float], engine: str) -> tuple[float, float, float]:
            return (
                values[f'narwhal_engine_eligible{{engine="{engine}"}}'],
                values[f'narwhal_engine_drained{{engine="{engine}"}}'],
                values[f'narwhal_engine_in_maintenance{{engine="{engine}"}}'],
            )

        await admin("/admin/engines/s1/drain")
        values = await metrics_of(url)
        assert state(values, "s1") == (0, 1, 0)
        assert state(values, "s0") == (1, 0, 0)
        await admin("/admin/maintenance", {"wave": 1, "action": "start"})
        assert state(await metrics_of(url), "s0") == (0, 0, 1)
        await admin("/admin/maintenance", {"wave": 1, "action": "end"})
        await admin("/admin/engines/s1/undrain")
        values = await metrics_of(url)
        assert state(values, "s0") == state(values, "s1") == (1, 0, 0)


async def test_a_disaggregated_pair_times_the_prefill_on_the_prefill_engine() -> None:
    pair = [
        ("p0", instant(role="prefill"), {"role": "prefill"}),
        ("d0", instant(role="decode"), {"role": "decode"}),
    ]
    async with router_over(pair) as url:
        before = await metrics_of(url)
        assert before['narwhal_prefill_seconds_count{engine="p0"}'] == 0
        # The prefill engine takes at least this long (wall clock, whatever the time scale).
        slow = 0.2
        status, raw = await post(
            url, "chat", body_for("chat", f"#sim:slow_prefill={slow} hi", True)
        )
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n"), raw
        after = await metrics_of(url)
    assert after['narwhal_prefill_seconds_count{engine="p0"}'] == 1
    assert after['narwhal_prefill_seconds_sum{engine="p0"}'] >= slow
    assert not any(k.startswith("narwhal_prefill_seconds") and '"d0"' in k for k in after)
    # TTFT stays the decode engine's (one observation per request), and holds the prefill.
    assert after['narwhal_ttft_seconds_count{engine="d0"}'] == 1
    assert after['narwhal_ttft_seconds_count{engine="p0"}'] == 0
    assert (
        after['narwhal_ttft_seconds_sum{engine="d0"}']
        >= after['narwhal_prefill_seconds_sum{engine="p0"}']
    )
