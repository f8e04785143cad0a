"""One router on several processes (`serving.workers: 2`): relay workers sharing the
client port under one decision process (`narwhal.supervisor`), real processes on
loopback in front of `narwhal sim`.

What users depend on: requests are served and counted once across workers (offered
equals the sum of outcomes on the one merged `/metrics`); `/ready` and `/admin` answer
for the whole router through any worker; a worker killed mid-load loses only its own
streams, each counted once, and is started again; the decision process killed stops
admission (503 `router_unavailable`) while the streams in flight run on, and admission
comes back with it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.conftest import Start, chat, metrics_of, send, settle, sim_process
from tests.e2e.test_fleet import config_for, engine
from tests.processes import NarwhalProcess, router_process, write_router_config

TOKEN = "admin-secret"


def children(pid: int) -> dict[str, list[int]]:
    """The supervisor's processes by role (`--role decision|worker` on their command line)."""
    found: dict[str, list[int]] = {"decision": [], "worker": []}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if parent != pid or b"--role" not in argv:
            continue
        found[argv[argv.index(b"--role") + 1].decode()].append(int(entry))
    return found


async def until(predicate: Any, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        assert loop.time() < end, "not within the time allowed"
        await asyncio.sleep(0.05)


def outcomes(values: dict[str, float]) -> float:
    return sum(v for k, v in values.items() if k.startswith("narwhal_outcomes_total{"))


@pytest.fixture
def workers(start: Start) -> Iterator[tuple[NarwhalProcess, NarwhalProcess]]:
    sim = start(sim_process("--time-scale", "1"))  # about 6 ms a token
    config = config_for([engine("a", sim)], admission={"mode": "open"})
    config["serving"] = {"workers": 2, "admin_token": TOKEN, "drain_timeout_s": 5}
    with router_process(config) as router:
        yield router, sim


async def stream(url: str, content: str, tokens: int = 48) -> str:
    """One streamed chat: 'completed', or how it broke."""
    body = chat(content, stream=True, max_tokens=tokens, ignore_eos=True)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                if resp.status != 200:
                    return f"status {resp.status}"
                raw = await resp.read()
    except (aiohttp.ClientError, ConnectionError) as e:
        return f"broken: {type(e).__name__}"
    return "completed" if raw.rstrip().endswith(b"data: [DONE]") else "truncated"


async def test_two_workers_serve_and_every_request_is_counted_once(
    workers: tuple[NarwhalProcess, NarwhalProcess],
) -> None:
    router, _ = workers
    roles = children(router.pid)
    assert len(roles["decision"]) == 1 and len(roles["worker"]) == 2
    replies = await asyncio.gather(
        *(send(router.url, chat(f"Hello {n}", max_tokens=16)) for n in range(40))
    )
    assert [r.status for r in replies] == [200] * 40
    # Request ids carry their process's prefix: more than one worker answered.
    prefixes = {r.headers["x-request-id"][:16] for r in replies}
    assert len(prefixes) == 2
    values = await settle(router.url, lambda v: outcomes(v) >= 40)
    assert values["narwhal_offered_total"] == 40 == outcomes(values)
    assert values['narwhal_outcomes_total{outcome="completed"}'] == 40
    async with aiohttp.ClientSession() as session:
        async with session.get(router.url + "/ready") as resp:
            assert resp.status == 200 and (await resp.json())["ready"] is True
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with session.get(router.url + "/admin/engines", headers=headers) as resp:
            assert resp.status == 200
            assert [e["name"] for e in (await resp.json())["engines"]] == ["a"]
        async with session.get(router.url + "/admin/engines") as resp:
            assert resp.status == 401  # the token is the decision process's to check


async def test_a_worker_killed_mid_load_loses_only_its_streams_and_comes_back(
    workers: tuple[NarwhalProcess, NarwhalProcess],
) -> None:
    router, _ = workers
    victim = children(router.pid)["worker"][0]
    # Streams of about 2.5 s: in flight on both workers when one dies.
    load = [asyncio.create_task(stream(router.url, f"story {n}", 400)) for n in range(30)]
    await asyncio.sleep(0.8)
    os.kill(victim, signal.SIGKILL)
    ended = await asyncio.gather(*load)
    lost = [e for e in ended if e != "completed"]
    assert lost and len(lost) < len(ended)  # the victim's streams broke, the other's ran on
    await until(
        lambda: (
            victim not in children(router.pid)["worker"]
            and len(children(router.pid)["worker"]) == 2
        )
    )
    replies = await asyncio.gather(
        *(send(router.url, chat(f"after {n}", max_tokens=16)) for n in range(10))
    )
    assert [r.status for r in replies] == [200] * 10
    values = await settle(router.url, lambda v: v["narwhal_offered_total"] >= 40)
    # Every request counted once: the dead worker's as it last sent them, and each of its
    # streams cut by its death as one internal error.
    assert values["narwhal_offered_total"] == 40 == outcomes(values)
    assert values['narwhal_outcomes_total{outcome="internal_error"}'] == len(lost)
    assert values['narwhal_outcomes_total{outcome="completed"}'] == 40 - len(lost)


async def test_without_the_decision_process_workers_refuse_and_streams_run_on(
    workers: tuple[NarwhalProcess, NarwhalProcess],
) -> None:
    router, _ = workers
    decision = children(router.pid)["decision"][0]
    load = [asyncio.create_task(stream(router.url, f"long {n}", 200)) for n in range(6)]
    await asyncio.sleep(0.3)
    os.kill(decision, signal.SIGKILL)
    refused = await send(router.url, chat("while it is gone", max_tokens=16))
    assert refused.status == 503
    assert refused.json()["error"]["code"] == "router_unavailable"
    assert await asyncio.gather(*load) == ["completed"] * 6
    await until(lambda: children(router.pid)["decision"] not in ([], [decision]), 60)

    async def served() -> bool:
        return (await send(router.url, chat("back", max_tokens=16))).status == 200

    loop = asyncio.get_running_loop()
    end = loop.time() + 60
    while not await served():
        assert loop.time() < end, "admission did not come back with the decision process"
        await asyncio.sleep(0.2)


async def test_sigterm_stops_every_process(tmp_path: Path, start: Start) -> None:
    sim = start(sim_process("--time-scale", "0"))
    config = config_for([engine("a", sim)], admission={"mode": "open"})
    config["serving"] = {"workers": 2, "shutdown_delay_s": 0}
    with router_process(config) as router:
        pids = [p for ps in children(router.pid).values() for p in ps]
        assert (await send(router.url, chat())).status == 200
        assert router.terminate() == 0
    assert pids and all(_gone(pid) for pid in pids)


def _gone(pid: int) -> bool:
    """No such process, or one that has exited and awaits its parent's wait."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def test_a_reload_through_any_worker_adds_an_engine_every_worker_serves(
    start: Start, tmp_path: Path
) -> None:
    """`POST /admin/reload` reaches the decision process through a worker; the engine it
    adds is placed on only once the workers can reach it (each reads the file again when
    the decision process's fleet names an engine it does not know)."""
    first = start(sim_process("--time-scale", "0"))
    second = start(sim_process("--time-scale", "0"))
    path = tmp_path / "narwhal.yaml"
    config = config_for([engine("a", first)], admission={"mode": "open"})
    config["serving"] = {"workers": 2, "admin_token": TOKEN}
    router = start(router_process(config, config_path=path))
    config["engines"] = [engine("a", first), engine("b", second)]
    write_router_config(path, config)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as session:
        async with session.post(router.url + "/admin/reload", headers=headers) as resp:
            assert resp.status == 200
            assert any("engine b added" in c for c in (await resp.json())["changes"])

    def on_b(values: dict[str, float]) -> float:
        return values.get('narwhal_ttft_seconds_count{engine="b"}', 0.0)

    loop = asyncio.get_running_loop()
    end = loop.time() + 30
    while True:
        replies = await asyncio.gather(
            *(send(router.url, chat(f"n {n}", max_tokens=4)) for n in range(16))
        )
        assert [r.status for r in replies] == [200] * 16  # never placed where unreachable
        if on_b(await metrics_of(router.url)) >= 8:
            break
        assert loop.time() < end, "the added engine took no work"
        await asyncio.sleep(0.2)
