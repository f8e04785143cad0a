"""Network faults between the router and its engines, and between the router and etcd.

A fault-injecting TCP proxy (`tests/faultproxy.py`) sits between a real router and a real
engine (or etcd): latency, a bandwidth cap, connections reset in the middle of a
response, blackholes and half-open connections. For each, what the client sees is
checked (a status before headers, an error event after them, or the answer), and so are
the books: every request ends in one counted outcome and releases what it held.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from tests.e2e.conftest import MODEL, chat, metrics_of, send, settle, sim_process
from tests.etcd_server import etcd_server
from tests.faultproxy import FaultProxy, fault_proxy
from tests.processes import NarwhalProcess, router_process

IDLE = (
    "narwhal_retained_requests",
    "narwhal_admission_queue_depth",
    "narwhal_prefill_slots_in_use",
    "narwhal_decode_slots_in_use",
)


def books_balance(metrics: dict[str, float]) -> bool:
    outcomes = sum(v for k, v in metrics.items() if k.startswith("narwhal_outcomes_total"))
    return metrics["narwhal_offered_total"] == outcomes and all(metrics[g] == 0 for g in IDLE)


@contextmanager
def proxied_fleet(
    engines: int = 1, **sections: Any
) -> Iterator[tuple[NarwhalProcess, list[FaultProxy]]]:
    """`engines` sims, each behind its own fault proxy, behind one router (open mode)."""
    with ExitStack() as stack:
        proxies = []
        for _ in range(engines):
            sim = stack.enter_context(sim_process())
            port = int(sim.url.rsplit(":", 1)[1])
            proxies.append(stack.enter_context(fault_proxy("127.0.0.1", port)))
        config: dict[str, Any] = {
            "model": MODEL,
            "engines": [
                {"name": f"e{i}", "url": p.url, "role": "both"} for i, p in enumerate(proxies)
            ],
            "admission": {"mode": "open"},
            "fleet": {"probe_interval_s": 0.2, "stale_after_s": 1, "probe_timeout_s": 0.5},
        }
        for key, value in sections.items():
            config[key] = {**config.get(key, {}), **value}
        yield stack.enter_context(router_process(config)), proxies


async def test_latency_and_a_bandwidth_cap_slow_answers_but_lose_nothing() -> None:
    # Probes get the defaults' time (the module's short ones detect faults fast): a slowed
    # link must slow the answers, not mark the engine down on a loaded machine.
    probes = {"probe_timeout_s": 2.0, "stale_after_s": 5.0}
    with proxied_fleet(fleet=probes) as (router, [proxy]):
        proxy.shape(latency_s=0.05, bytes_per_s=20_000)
        started = time.monotonic()
        streamed = await send(router.url, chat(stream=True, max_tokens=32))
        whole = await send(router.url, chat(max_tokens=32))
        assert time.monotonic() - started > 0.1
        assert streamed.status == 200 and streamed.events()[-1] == "[DONE]"
        assert whole.status == 200 and whole.json()["choices"][0]["message"]["content"]
        assert books_balance(await settle(router.url, books_balance))


@pytest.mark.parametrize("stream", [True, False])
async def test_a_connection_reset_mid_response_is_an_error_never_a_hang(stream: bool) -> None:
    with proxied_fleet() as (router, [proxy]):
        proxy.reset_after(3000)  # a few events in: after the response started
        reply = await send(router.url, chat(stream=stream, max_tokens=200), timeout=20)
        if stream:
            assert reply.status == 200  # headers went out with the first event
            events = reply.events()
            assert "[DONE]" not in events
            assert "error" in events[-1], events[-1]
        else:
            assert reply.status == 502, reply.raw
            assert reply.json()["error"]["code"] == "upstream_error"
        proxy.reset_after(None)
        assert (
            await send(router.url, chat(max_tokens=4))
        ).status == 200  # the engine is fine after
        metrics = await settle(router.url, books_balance)
        assert books_balance(metrics), metrics
        assert metrics['narwhal_outcomes_total{outcome="upstream_error"}'] == 1


async def test_a_reset_before_the_response_is_retried_on_the_other_engine() -> None:
    with proxied_fleet(engines=2) as (router, proxies):
        for proxy in proxies:
            proxy.reset_after(1)  # every connection dies at its first byte back
        failing = await send(router.url, chat(max_tokens=4))
        assert failing.status == 502 and failing.json()["error"]["code"] == "upstream_error"
        proxies[1].reset_after(None)
        replies = [await send(router.url, chat(max_tokens=4)) for _ in range(6)]
        assert [r.status for r in replies] == [200] * 6
        metrics = await settle(router.url, books_balance)
        assert books_balance(metrics)
        failures = sum(
            v
            for k, v in metrics.items()
            if k.startswith("narwhal_engine_failures_total") and 'stage="before_headers"' in k
        )
        assert 2 <= failures <= 2 + 6  # each request at most fleet.max_attempts (2) attempts


@pytest.mark.parametrize("fault", ["blackhole", "half_open"])
async def test_an_engine_that_goes_silent_ends_in_a_deadline_and_leaves_placement(
    fault: str,
) -> None:
    """Accepted but never answered (partition), or answered into the void (half-open):
    the request ends at its deadline with a 504, slots come back, and the engine leaves
    placement once its probes time out, so the next requests go to the other engine."""
    with proxied_fleet(engines=2) as (router, proxies):
        getattr(proxies[0], fault)()
        started = time.monotonic()
        replies = await asyncio.gather(
            *(
                send(router.url, chat(max_tokens=4), headers={"X-Request-Timeout": "1.5"})
                for _ in range(4)
            )
        )
        assert time.monotonic() - started < 10
        assert {r.status for r in replies} <= {200, 504}
        for reply in replies:
            if reply.status == 504:
                assert reply.json()["error"]["code"] == "terminal_expiry"
        # e0 leaves placement once two probes in a row have timed out: about 1.5 s, and
        # longer on a loaded machine, so wait for it (bounded) rather than for a time.
        left = await settle(router.url, lambda v: v['narwhal_engine_up{engine="e0"}'] == 0)
        assert left['narwhal_engine_up{engine="e0"}'] == 0, "e0 never left placement"
        later = [
            await send(router.url, chat(max_tokens=4), headers={"X-Request-Timeout": "3"})
            for _ in range(4)
        ]
        assert [r.status for r in later] == [200] * 4
        metrics = await settle(router.url, books_balance)
        assert books_balance(metrics), metrics


async def test_resets_between_the_leader_and_etcd_do_not_cost_it_leadership() -> None:
    """Connections to etcd cut again and again, each renewal retried on a new one: the
    leader keeps its lease, and never fences while renewals still get through."""
    with ExitStack() as stack:
        etcd = stack.enter_context(etcd_server())
        proxy = stack.enter_context(fault_proxy("127.0.0.1", etcd.client_port))
        sim = stack.enter_context(sim_process())
        config = {
            "model": MODEL,
            "engines": [{"name": "e0", "url": sim.url, "role": "both"}],
            "admission": {"mode": "open"},
            "ha": {
                "backend": "etcd",
                "endpoints": [proxy.url],
                "key": f"/nettest/{time.monotonic_ns()}",
                "lease_ttl_s": 2,
            },
        }
        router = stack.enter_context(router_process(config))
        deadline = time.monotonic() + 10
        while (await metrics_of(router.url))['narwhal_router_state{state="active"}'] != 1:
            assert time.monotonic() < deadline, "never became active"
            await asyncio.sleep(0.05)
        for _ in range(20):
            proxy.reset()
            await asyncio.sleep(0.15)
            assert (await send(router.url, chat(max_tokens=4))).status == 200
        metrics = await metrics_of(router.url)
        assert metrics['narwhal_router_state{state="active"}'] == 1
        assert metrics['narwhal_outcomes_total{outcome="unavailable"}'] == 0
