"""Reloading the configuration while the router serves (SIGHUP, POST /admin/reload),
against real processes: engines added and removed under load with no stream lost, a bad
file refused with the running configuration kept, operator drains kept.

Each test's router reads a file of its own (`config_path`), rewritten by the test.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from tests.e2e.conftest import Reply, Start, chat, metrics_of, send, settle, sim_process
from tests.e2e.test_fleet import config_for, engine
from tests.processes import NarwhalProcess, router_process, write_router_config


async def admin(
    router: NarwhalProcess, method: str, path: str, token: str | None = None, body: Any = None
) -> tuple[int, Any]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session:
        async with session.request(method, router.url + path, headers=headers, json=body) as resp:
            return resp.status, await resp.json()


async def engines_by_name(router: NarwhalProcess, token: str | None = None) -> dict[str, Any]:
    status, body = await admin(router, "GET", "/admin/engines", token)
    assert status == 200, body
    return {e["name"]: e for e in body["engines"]}


def served_by(values: dict[str, float], name: str) -> float:
    return values.get(f'narwhal_ttft_seconds_count{{engine="{name}"}}', 0.0)


async def until(predicate: Any, timeout: float = 15.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


class Load:
    """Streaming requests back to back from a few clients until `stop()`; every reply kept."""

    def __init__(self, url: str, prompt: str, clients: int = 4) -> None:
        self.replies: list[Reply] = []
        self._url = url
        self._prompt = prompt
        self._stopped = False
        self._tasks = [asyncio.create_task(self._client(i)) for i in range(clients)]

    async def _client(self, i: int) -> None:
        n = 0
        while not self._stopped:
            n += 1
            body = chat(f"{self._prompt} {i}-{n}", stream=True, max_tokens=8)
            self.replies.append(await send(self._url, body))

    async def stop(self) -> list[Reply]:
        self._stopped = True
        await asyncio.gather(*self._tasks)
        return self.replies


def assert_all_complete(replies: list[Reply]) -> None:
    """No stream lost: every one a 200 that ended with [DONE]."""
    assert replies
    broken = [r for r in replies if r.status != 200 or r.events()[-1] != "[DONE]"]
    assert not broken, broken[0].raw[-300:]


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_sighup_adds_an_engine_under_load_that_takes_work_once_checked(
    start: Start, tmp_path: Path
) -> None:
    first = start(sim_process("--time-scale", "0"))
    second = start(sim_process("--time-scale", "0"))
    path = tmp_path / "narwhal.yaml"
    # Predictive mode: an engine added is placeable once up and profiled, as at start-up.
    config = config_for([engine("a", first)], admission={"mode": "predictive", "ttft_target_s": 30})
    router = start(router_process(config, config_path=path))
    load = Load(router.url, "#sim:stall=0.2 load")
    await settle(router.url, lambda v: served_by(v, "a") >= 4)

    nowhere = f"http://127.0.0.1:{unused_port()}"  # an engine that is not up
    config["engines"] += [engine("b", second), {"name": "c", "url": nowhere}]
    write_router_config(path, config)
    router.proc.send_signal(signal.SIGHUP)

    async def b_served() -> bool:
        return served_by(await metrics_of(router.url), "b") >= 4

    assert await until(b_served), "the added engine took no work"
    engines = await engines_by_name(router)
    assert engines["b"]["state"] == "up" and engines["b"]["profiling"]["state"] == "profiled"
    assert engines["c"]["state"] == "down" and not engines["c"]["eligible"]
    assert_all_complete(await load.stop())
    values = await metrics_of(router.url)
    assert served_by(values, "c") == 0  # never placed where nothing was checked healthy


async def test_sighup_removes_an_engine_under_load_and_no_stream_is_lost(
    start: Start, tmp_path: Path
) -> None:
    a = start(sim_process("--time-scale", "0"))
    b = start(sim_process("--time-scale", "0"))
    path = tmp_path / "narwhal.yaml"
    config = config_for([engine("a", a), engine("b", b)])
    router = start(router_process(config, config_path=path))
    # Long streams, so that b has some in flight when it leaves the configuration.
    in_flight = [
        asyncio.create_task(send(router.url, chat(f"#sim:stall=2 x{i}", stream=True)))
        for i in range(6)
    ]
    await settle(router.url, lambda v: v["narwhal_decode_slots_in_use"] == 6)
    on_b = (await engines_by_name(router))["b"]["scores"]["decoding"]
    assert on_b > 0  # placement by load spread them
    load = Load(router.url, "#sim:stall=0.1 load")

    config["engines"] = [engine("a", a)]
    write_router_config(path, config)
    router.proc.send_signal(signal.SIGHUP)

    async def b_removing() -> bool:
        return (await engines_by_name(router))["b"]["state"] == "removing"

    assert await until(b_removing)
    replies = await asyncio.gather(*in_flight)
    assert_all_complete(replies)  # b's own streams finished there

    async def b_gone() -> bool:
        return "b" not in await engines_by_name(router)

    assert await until(b_gone), "the removed engine stayed listed after its last request"
    values = await metrics_of(router.url)
    on_b_in_all, on_a = served_by(values, "b"), served_by(values, "a")
    await settle(router.url, lambda v: served_by(v, "a") >= on_a + 10)  # more load, b gone
    assert_all_complete(await load.stop())
    values = await metrics_of(router.url)
    assert served_by(values, "b") == on_b_in_all  # b took nothing after it left
    assert values["narwhal_offered_total"] == sum(
        v for k, v in values.items() if k.startswith("narwhal_outcomes_total{")
    )


async def test_a_bad_file_is_refused_with_check_configs_messages_and_nothing_changes(
    start: Start, tmp_path: Path
) -> None:
    sim = start(sim_process("--time-scale", "0"))
    path, log = tmp_path / "narwhal.yaml", tmp_path / "router.log"
    config = config_for([engine("a", sim)], serving={"max_retained": 100})
    router = start(router_process(config, config_path=path, stderr_path=log))
    bad = dict(config, serving={"max_retained": "many", "drain_timout_s": 1})
    bad["engines"] = [engine("a", sim), engine("a", sim)]
    write_router_config(path, bad)
    checked = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "narwhal", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    problems = [line.removeprefix("error: ") for line in checked.stderr.splitlines()]
    assert checked.returncode == 2 and len(problems) >= 3, checked.stderr

    router.proc.send_signal(signal.SIGHUP)

    async def logged() -> bool:
        text = await asyncio.to_thread(log.read_text)
        return text.count("configuration not reloaded (SIGHUP)") >= len(problems)

    assert await until(logged)
    text = await asyncio.to_thread(log.read_text)
    for problem in problems:
        assert f"ERROR narwhal.reload: configuration not reloaded (SIGHUP): {problem}" in text
    # The running configuration stays: one engine a, serving.
    assert list(await engines_by_name(router)) == ["a"]
    assert (await send(router.url, chat())).status == 200
    status, body = await admin(router, "POST", "/admin/reload")
    assert status == 400
    assert body["error"]["code"] == "invalid_configuration"
    assert body["problems"] == problems


async def test_post_admin_reload_says_what_changed_and_refuses_what_needs_a_restart(
    start: Start, tmp_path: Path
) -> None:
    sim = start(sim_process("--time-scale", "0"))
    path = tmp_path / "narwhal.yaml"
    config = config_for([engine("a", sim)], serving={"admin_token": "old-token"})
    router = start(router_process(config, config_path=path))
    config["serving"] = {"admin_token": "new-token", "max_retained": 50, "api_keys": ["sk-1"]}
    write_router_config(path, config)

    status, _ = await admin(router, "POST", "/admin/reload")
    assert status == 401  # the admin token guards reloading too
    status, body = await admin(router, "POST", "/admin/reload", "old-token")
    assert status == 200
    assert body == {
        "reloaded": True,
        "changes": [
            "serving.max_retained: 4096 -> 50",
            "serving.admin_token changed",
            "serving.api_keys changed",
        ],
    }
    # The new tokens apply at once.
    status, _ = await admin(router, "GET", "/admin/engines", "old-token")
    assert status == 401
    assert (await send(router.url, chat())).status == 401
    reply = await send(router.url, chat(), headers={"Authorization": "Bearer sk-1"})
    assert reply.status == 200
    values = await metrics_of(router.url)
    assert values["narwhal_retained_requests"] == 0

    status, body = await admin(router, "POST", "/admin/reload", "new-token")
    assert (status, body["changes"]) == (200, [])  # nothing changed since

    config["serving"] = {**config["serving"], "port": unused_port()}
    config["admission"] = {"mode": "predictive"}
    write_router_config(path, config)
    status, body = await admin(router, "POST", "/admin/reload", "new-token")
    assert status == 400
    assert [p.split(":")[0] for p in body["problems"]] == ["serving.port", "admission.mode"]
    assert "restart to change serving.port" in body["error"]["message"]


async def test_one_refusal_names_the_files_problems_and_the_restart_only_keys_it_changes(
    start: Start, tmp_path: Path
) -> None:
    sim = start(sim_process("--time-scale", "0"))
    path = tmp_path / "narwhal.yaml"
    config = config_for([engine("a", sim)], admission={"mode": "open"})
    config["serving"] = {"port": unused_port()}
    # The flag wins over the file's port: that is not a change a reload should name.
    router = start(router_process(config, "--port", "0", config_path=path))
    config["serving"] = {**config["serving"], "max_retained": "many"}
    config["admission"] = {"mode": "predictive"}
    write_router_config(path, config)
    status, body = await admin(router, "POST", "/admin/reload")
    assert status == 400
    assert [p.split(":")[0] for p in body["problems"]] == [
        "serving.max_retained",
        "admission.mode",
    ]
    assert (await send(router.url, chat())).status == 200  # the running configuration stays


async def test_a_drain_and_a_maintenance_wave_survive_a_reload(
    start: Start, tmp_path: Path
) -> None:
    a = start(sim_process("--time-scale", "0"))
    b = start(sim_process("--time-scale", "0"))
    c = start(sim_process("--time-scale", "0"))
    path = tmp_path / "narwhal.yaml"
    config = config_for([engine("a", a), engine("b", b, wave=1), engine("c", c)])
    router = start(router_process(config, config_path=path))
    for name in ("a", "b"):
        assert (await admin(router, "POST", f"/admin/engines/{name}/drain"))[0] == 200
    wave = {"wave": 1, "action": "start"}
    assert (await admin(router, "POST", "/admin/maintenance", body=wave))[0] == 200

    # a changes in place, b is replaced (another URL, the same engine), c joins wave 2.
    config["engines"] = [
        engine("a", a, phase_concurrency={"decode": 8}),
        {**engine("b", b, wave=1), "url": b.url + "/"},
        engine("c", c, wave=2),
    ]
    write_router_config(path, config)
    status, body = await admin(router, "POST", "/admin/reload")
    assert status == 200 and len(body["changes"]) == 3, body
    engines = await engines_by_name(router)
    assert engines["a"]["state"] == "drained"
    assert engines["b"]["state"] == "maintenance"  # and drained still, under it:
    values = await metrics_of(router.url)
    assert values['narwhal_engine_drained{engine="b"}'] == 1
    assert values['narwhal_engine_in_maintenance{engine="b"}'] == 1

    async def c_up() -> bool:
        return bool((await engines_by_name(router))["c"]["eligible"])

    assert await until(c_up)
    for _ in range(4):
        assert (await send(router.url, chat())).status == 200
    values = await metrics_of(router.url)
    assert served_by(values, "a") == served_by(values, "b") == 0
