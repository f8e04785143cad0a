"""SIGTERM as a load balancer sees it, against real processes (`narwhal.ops.shutdown`).

The simulator's `#sim:stall=S` holds a stream after its second token for S wall-clock
seconds, so a request is in flight when the signal comes, deterministically. The delay is
made long and ended by a second SIGTERM (which the sequence honours), so that nothing
here depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from tests.e2e.conftest import chat, fleet_config, send, settle, sim_process
from tests.processes import NarwhalProcess, router_process

_SUMMARY = re.compile(r"shut down: offered (\d+); outcomes: (.*)$", re.MULTILINE)


@pytest.fixture(scope="module")
def sim() -> Iterator[NarwhalProcess]:
    with sim_process("--time-scale", "0") as process:
        yield process


def config_for(sim: NarwhalProcess, **serving: Any) -> dict[str, Any]:
    return fleet_config([("s0", sim, "vllm")], serving=serving)


async def until(check: Any, within: float = 15.0) -> Any:
    """Poll the coroutine function `check` until it returns something true."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while True:
        result = await check()
        if result or loop.time() > end:
            return result
        await asyncio.sleep(0.05)


async def ready_reason(url: str) -> tuple[int, Any] | None:
    try:
        async with aiohttp.ClientSession() as session, session.get(url + "/ready") as resp:
            return resp.status, await resp.json()
    except aiohttp.ClientConnectionError:
        return None


async def refuses_connections(url: str) -> bool:
    parts = urlsplit(url)
    try:
        _, writer = await asyncio.open_connection(parts.hostname, parts.port)
    except (ConnectionRefusedError, ConnectionResetError):
        # (reset: the connection sat in the listener's backlog as the listener closed)
        return True
    writer.close()
    return False


async def in_flight(router: NarwhalProcess, decoding: int) -> None:
    values = await settle(router.url, lambda v: v["narwhal_decode_slots_in_use"] >= decoding)
    assert values["narwhal_decode_slots_in_use"] >= decoding


async def exit_summary(router: NarwhalProcess, log: Path) -> tuple[int, dict[str, int]]:
    """Wait for the router to exit 0; the offered count and outcomes of its last line."""
    assert await asyncio.to_thread(router.proc.wait, 60) == 0
    text = await asyncio.to_thread(log.read_text)
    match = _SUMMARY.search(text)
    assert match is not None, text
    outcomes = {}
    for part in match.group(2).split(", "):
        outcome, count = part.rsplit(" ", 1)
        outcomes[outcome] = int(count)
    return int(match.group(1)), outcomes


async def test_sigterm_keeps_the_listener_open_for_the_delay_then_drains(
    sim: NarwhalProcess, tmp_path: Path
) -> None:
    log = tmp_path / "router.log"
    config = config_for(sim, shutdown_delay_s=120, drain_timeout_s=60)
    with router_process(config, stderr_path=log) as router:
        streaming = asyncio.create_task(
            send(router.url, chat("#sim:stall=5 a", stream=True, max_tokens=10))
        )
        await in_flight(router, 1)
        router.proc.send_signal(signal.SIGTERM)

        # The delay: /ready says why, and the listener still answers.
        async def not_ready() -> tuple[int, Any] | None:
            answer = await ready_reason(router.url)
            return answer if answer is not None and answer[0] == 503 else None

        assert await until(not_ready) == (503, {"ready": False, "reason": "shutting_down"})
        late = await send(router.url, chat("too late"))
        assert late.status == 503
        assert late.json()["error"]["code"] == "router_unavailable"
        assert late.headers["Retry-After"] == "1"
        assert late.headers["Connection"] == "close"  # the next request goes elsewhere
        assert not streaming.done()

        # A second signal ends the delay: the listener closes, the stream runs on.
        router.proc.send_signal(signal.SIGTERM)
        assert await until(lambda: refuses_connections(router.url))
        reply = await streaming
        assert reply.status == 200 and reply.events()[-1] == "[DONE]"
        offered, outcomes = await exit_summary(router, log)
    assert offered == 2 and outcomes == {"completed": 1, "unavailable": 1}


async def test_the_drain_deadline_ends_what_still_runs_with_a_proper_answer(
    sim: NarwhalProcess, tmp_path: Path
) -> None:
    log = tmp_path / "router.log"
    with router_process(config_for(sim, drain_timeout_s=1), stderr_path=log) as router:
        streaming = asyncio.create_task(
            send(router.url, chat("#sim:stall=60 a", stream=True, max_tokens=10))
        )
        whole = asyncio.create_task(send(router.url, chat("#sim:stall=60 b", max_tokens=10)))
        await in_flight(router, 2)
        router.proc.send_signal(signal.SIGTERM)

        reply = await streaming
        assert reply.status == 200
        assert reply.raw.endswith(b"\n\n")  # the response ended, at an event's end
        events = reply.events()  # every event whole JSON: none was cut mid-chunk
        assert "[DONE]" not in events
        *chunks, last = events
        assert chunks and all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert last["error"]["code"] == "terminal_expiry"
        assert "shutting down" in last["error"]["message"]

        answer = await whole
        assert answer.status == 503  # a body, not a dropped connection
        assert answer.json()["error"]["code"] == "router_unavailable"
        offered, outcomes = await exit_summary(router, log)
    assert offered == sum(outcomes.values()) == 2
    assert outcomes == {"expired": 1, "unavailable": 1}


async def test_the_drain_deadline_cuts_off_a_client_that_stopped_reading_as_expired(
    sim: NarwhalProcess, tmp_path: Path
) -> None:
    """A streaming client that takes nothing more (its socket buffers full) when the
    drain deadline comes: the router waits no longer for it, and counts the request
    expired by the shutdown, not as a client that went away (aiohttp's drain, interrupted
    by the deadline, cannot be waited on again for the last write)."""
    log = tmp_path / "router.log"
    body = json.dumps(chat("#sim:long a", stream=True, max_tokens=20000, ignore_eos=True))
    with router_process(config_for(sim, drain_timeout_s=1), stderr_path=log) as router:
        parts = urlsplit(router.url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        writer.transport.pause_reading()  # and never reads again
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode())
        )
        try:
            await in_flight(router, 1)
            await asyncio.sleep(0.5)  # the stream fills the buffers and waits on the client
            router.proc.send_signal(signal.SIGTERM)
            offered, outcomes = await exit_summary(router, log)
        finally:
            writer.close()
        del reader
    assert offered == 1 and outcomes == {"expired": 1}


async def test_requests_queued_at_sigterm_are_refused_at_once(
    sim: NarwhalProcess, tmp_path: Path
) -> None:
    log = tmp_path / "router.log"
    config = config_for(sim)
    config["admission"]["phase_concurrency"] = {"prefill": 1}
    with router_process(config, stderr_path=log) as router:
        placed = asyncio.create_task(send(router.url, chat("#sim:slow_prefill=2 a")))
        await settle(router.url, lambda v: v["narwhal_prefill_slots_in_use"] == 1)
        queued = asyncio.create_task(send(router.url, chat("b")))
        values = await settle(router.url, lambda v: v["narwhal_admission_queue_depth"] == 1)
        assert values["narwhal_admission_queue_depth"] == 1
        router.proc.send_signal(signal.SIGTERM)
        refused = await queued
        assert refused.status == 503
        assert refused.json()["error"]["code"] == "router_unavailable"
        assert not placed.done()  # refused while the placed one still runs
        assert (await placed).status == 200
        offered, outcomes = await exit_summary(router, log)
    assert offered == 2 and outcomes == {"completed": 1, "unavailable": 1}
