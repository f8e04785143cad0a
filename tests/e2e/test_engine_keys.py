"""Engines started with --api-key: the router sends each engine's key on every request,
probe and scrape (completions, profiling, /tokenize sizing, /health, /metrics,
/v1/models, /version); the client's own Authorization reaches an engine only where
`forward_client_authorization` is on; and an engine that refuses the router's key is an
engine fault, told in the router's log.

The sims record every request they answer (`--authorization-log`: method, path, status,
Authorization), which is what the engine received."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from tests.e2e.conftest import MODEL, chat, send, settle, sim_process
from tests.processes import NarwhalProcess, router_process

ENGINE_KEY = "engine-key-0123"
CLIENT = {"Authorization": "Bearer client-secret"}


@contextmanager
def keyed_sim(log: Path, *flags: str) -> Iterator[NarwhalProcess]:
    with sim_process(
        "--time-scale", "0", "--api-key", ENGINE_KEY, "--authorization-log", str(log), *flags
    ) as sim:
        yield sim


def requests_seen(log: Path) -> list[tuple[str, str, int, str]]:
    """(method, path, status, authorization) of every request the sim answered."""
    seen = []
    for line in log.read_text().splitlines():
        method, path, status, authorization = line.split(" ", 3)
        seen.append((method, path, int(status), authorization))
    return seen


async def ready(url: str, timeout: float = 20) -> dict[str, Any]:
    """/ready's answer once it is 200 (or the last one, when the time is up)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(url + "/ready") as response:
                body: dict[str, Any] = await response.json()
            if body["ready"] or loop.time() > end:
                return body
            await asyncio.sleep(0.05)


LONG = "Once upon a time there was a router that sized every prompt it was given " * 3


def engine(sim: NarwhalProcess, **fields: Any) -> dict[str, Any]:
    return {"name": "e0", "url": sim.url, **fields}


async def test_every_request_to_the_engine_carries_its_key_and_never_the_clients(
    tmp_path: Path,
) -> None:
    """Predictive mode (the default), so the engine is profiled and prompts are sized by
    its /tokenize; the key comes from an environment variable."""
    log = tmp_path / "engine.log"
    with keyed_sim(log) as sim:
        config = {"model": MODEL, "engines": [engine(sim, api_key_env="NARWHAL_TEST_ENGINE_KEY")]}
        with router_process(config, env={"NARWHAL_TEST_ENGINE_KEY": ENGINE_KEY}) as router:
            assert (await ready(router.url))["ready"]
            # Prompts long enough to teach the estimate's bounds, so the engine counts them.
            for body in (chat(LONG, max_tokens=4), chat(LONG, max_tokens=4, stream=True)):
                reply = await send(router.url, body, headers=CLIENT)
                assert reply.status == 200, reply.raw
            completion = {"model": MODEL, "prompt": LONG, "max_tokens": 4}
            assert (await send(router.url, completion, headers=CLIENT)).status == 200
            # Prompts are counted by the engine in the background (no decision here waits
            # for it): before the router stops, one count has been answered.
            values = await settle(
                router.url,
                lambda v: v.get('narwhal_tokenize_calls_total{result="answered"}', 0) >= 1,
            )
            assert values.get('narwhal_tokenize_calls_total{result="answered"}', 0) >= 1
    seen = requests_seen(log)
    paths = {(method, path) for method, path, _, _ in seen}
    assert {
        ("GET", "/health"),
        ("GET", "/metrics"),
        ("GET", "/v1/models"),
        ("GET", "/version"),
        ("POST", "/tokenize"),
        ("POST", "/v1/completions"),  # the profiling probes and the client's completion
        ("POST", "/v1/chat/completions"),
    } <= paths, paths
    assert {authorization for *_, authorization in seen} == {f"Bearer {ENGINE_KEY}"}
    assert {status for _, _, status, _ in seen} == {200}


async def test_sizing_by_a_guarded_tokenize_endpoint(tmp_path: Path) -> None:
    """SGLang guards /tokenize too (vLLM leaves it open): with the key, prompts are still
    sized by the engine."""
    log = tmp_path / "engine.log"
    with keyed_sim(log, "--dialect", "sglang") as sim:
        config = {
            "model": MODEL,
            "engines": [engine(sim, dialect="sglang", api_key=ENGINE_KEY)],
        }
        with router_process(config) as router:
            assert (await ready(router.url))["ready"]
            assert (await send(router.url, chat(LONG, max_tokens=4))).status == 200
            await settle(
                router.url,
                lambda v: v.get('narwhal_tokenize_calls_total{result="answered"}', 0) >= 1,
            )
    tokenize = [s for s in requests_seen(log) if s[1] == "/tokenize"]
    assert tokenize and all(s[2:] == (200, f"Bearer {ENGINE_KEY}") for s in tokenize)


async def test_an_engine_refusing_the_routers_key_is_out_of_placement_and_logged(
    tmp_path: Path,
) -> None:
    log = tmp_path / "engine.log"
    with keyed_sim(log) as sim:
        for fields, told in (
            ({}, "no api_key is set"),
            ({"api_key": "not-the-key"}, "the configured api_key is wrong"),
        ):
            router_log = tmp_path / "router.log"
            config = {
                "model": MODEL,
                "engines": [engine(sim, **fields)],
                "admission": {"mode": "open"},
            }
            with router_process(config, stderr_path=router_log) as router:
                assert await ready(router.url, timeout=1) == {
                    "ready": False,
                    "reason": "no_engines",
                }
                reply = await send(router.url, chat(max_tokens=4))
                assert reply.status == 503
                assert reply.json()["error"]["code"] == "backend_unavailable"
            lines = [line for line in router_log.read_text().splitlines() if "e0" in line]
            (refused,) = [line for line in lines if "refused the router's credentials" in line]
            assert "ERROR" in refused and told in refused and "engines[].api_key" in refused
            assert "not-the-key" not in router_log.read_text()  # a key is never logged


async def test_the_clients_authorization_is_forwarded_only_when_asked(tmp_path: Path) -> None:
    """With `forward_client_authorization`, the client's header goes with its request (in
    place of the engine's key, which probes still carry); without a header of its own,
    the engine's key goes. An engine refusing a forwarded key is an engine fault (502),
    logged."""
    log, router_log = tmp_path / "engine.log", tmp_path / "router.log"
    with keyed_sim(log) as sim:
        config = {
            "model": MODEL,
            "engines": [engine(sim, api_key=ENGINE_KEY)],
            "admission": {"mode": "open"},
            "fleet": {"forward_client_authorization": True},
        }
        with router_process(config, stderr_path=router_log) as router:
            assert (await ready(router.url))["ready"]
            refused = await send(router.url, chat(max_tokens=4), headers=CLIENT)
            own_key = await send(
                router.url, chat(max_tokens=4), headers={"Authorization": f"Bearer {ENGINE_KEY}"}
            )
            no_header = await send(router.url, chat(max_tokens=4))
    assert refused.status == 502
    assert refused.json()["error"]["code"] == "upstream_error"
    assert (own_key.status, no_header.status) == (200, 200)
    completions = [s for s in requests_seen(log) if s[1] == "/v1/chat/completions"]
    # One attempt for the refused one (a retry never goes to the engine that failed).
    assert [(status, auth) for _, _, status, auth in completions] == [
        (401, CLIENT["Authorization"]),
        (200, f"Bearer {ENGINE_KEY}"),
        (200, f"Bearer {ENGINE_KEY}"),
    ]
    probes = [s for s in requests_seen(log) if s[1] != "/v1/chat/completions"]
    assert probes and {auth for *_, auth in probes} == {f"Bearer {ENGINE_KEY}"}
    (told,) = [
        line
        for line in router_log.read_text().splitlines()
        if "refused the router's request" in line
    ]
    assert "401" in told and "refused the client's own Authorization, forwarded" in told
