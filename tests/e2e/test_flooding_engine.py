"""An engine that floods lines that are not data (comments, as fast as it can) cannot hold
the router's event loop, and cannot send them without limit.

While the engine floods, comment lines with a data event every `GAP` bytes for a few
seconds, a client polls `GET /health`: its p99 stays under 100 ms. Then the engine sends
more comment lines in a row than `fleet.max_event_bytes` allows between events: that is
an engine fault, and the already started stream ends with an error event (no `[DONE]`)
and one `upstream_error` outcome. One that sends nothing but comments is answered 502
before any event, as for any other engine fault.

The engine runs in this test's loop (`tests/hostile_engine.py`), the router in its own
process, as the operator runs it. The latency limit is wall-clock time, so the test runs
alone (scripts/check.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.conftest import MODEL, chat, metrics_of, send
from tests.hostile_engine import HostileEngine, Script, sse
from tests.processes import router_process

pytestmark = pytest.mark.alone

LIMIT = 1 << 20  # fleet.max_event_bytes: the most non-data bytes between two events
GAP = LIMIT // 4  # the flood's comment bytes between its data events
FLOOD_S = 3.0
COMMENTS = b":\n\n" * (GAP // 3)


def choice(**fields: Any) -> bytes:
    return sse({"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, **fields}]})


ROLE = choice(delta={"role": "assistant", "content": ""})
HELLO = choice(delta={"content": "hello"})
STOP = choice(delta={}, finish_reason="stop")


def flooding(body: dict[str, Any]) -> Script:
    if body["messages"][-1]["content"] == "comments only":
        # Nothing but comments, from the start, for longer than the test would wait.
        return Script([], flood=COMMENTS, flood_s=10 * FLOOD_S, after=[ROLE, STOP])
    return Script(
        [ROLE, HELLO],
        pause_after=1,  # the response starts before the flood
        flood=COMMENTS + HELLO,
        flood_s=FLOOD_S,
        # Past the limit: no event in 1.25 MiB of comments.
        after=[COMMENTS] * 5 + [STOP, sse("[DONE]")],
    )


async def _poll_health(url: str, seconds: float) -> list[float]:
    """`GET /health` latencies over `seconds`, from a process of its own (this test's loop
    is busy writing the flood: polls from it would measure that too)."""
    poller = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).with_name("health_poller.py")), url, str(seconds),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await poller.communicate()
    assert poller.returncode == 0
    latencies: list[float] = json.loads(out)
    return latencies


async def test_a_comment_flood_neither_blocks_the_loop_nor_goes_unbounded() -> None:
    async with HostileEngine(flooding) as engine:
        settings = engine.settings(MODEL)
        settings["fleet"]["max_event_bytes"] = LIMIT
        with contextlib.ExitStack() as stack:
            # Started off the loop: the router probes this loop's engine while it starts.
            router = await asyncio.to_thread(stack.enter_context, router_process(settings))
            before = await metrics_of(router.url)
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    router.url + "/v1/chat/completions",
                    json=chat("flood", max_tokens=4, stream=True),
                ) as resp,
            ):
                # The response has started: the flood is on, for FLOOD_S from now.
                latencies, raw = await asyncio.gather(
                    _poll_health(router.url, FLOOD_S - 0.3), resp.read()
                )
                status = resp.status
            after = await metrics_of(router.url)
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99)]
    print(f"/health during the flood: {len(latencies)} polls, p99 {p99 * 1e3:.1f} ms, "
          f"max {latencies[-1] * 1e3:.1f} ms; {engine.flooded / 1e6:.0f} MB flooded")  # fmt: skip
    assert status == 200
    events = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    assert "[DONE]" not in events
    last = json.loads(events[-1])
    assert set(last) == {"error"} and last["error"]["code"] == "upstream_error", last
    assert "fleet.max_event_bytes" in last["error"]["message"]
    assert all(json.loads(e)["choices"][0]["delta"] == {"content": "hello"} for e in events[1:-1])
    # The flood went on for its whole time, at more than a trickle.
    assert len(events) - 3 >= 20, len(events)
    outcomes = {
        k: after[k] - before.get(k, 0) for k in after if k.startswith("narwhal_outcomes_total{")
    }
    assert {k: v for k, v in outcomes.items() if v} == {
        'narwhal_outcomes_total{outcome="upstream_error"}': 1
    }
    assert p99 < 0.1, latencies[-10:]


@pytest.mark.parametrize("stream", [True, False])
async def test_an_engine_that_sends_only_comments_is_a_502(stream: bool) -> None:
    async with HostileEngine(flooding) as engine:
        settings = engine.settings(MODEL)
        settings["fleet"]["max_event_bytes"] = LIMIT
        with contextlib.ExitStack() as stack:
            router = await asyncio.to_thread(stack.enter_context, router_process(settings))
            before = await metrics_of(router.url)
            reply = await send(router.url, chat("comments only", stream=stream), timeout=FLOOD_S)
            after = await metrics_of(router.url)
    assert reply.status == 502, reply.raw
    error = reply.json()["error"]
    assert error["code"] == "upstream_error" and "without an event" in error["message"], error
    assert engine.requests == 1
    outcome = 'narwhal_outcomes_total{outcome="upstream_error"}'
    assert after[outcome] - before.get(outcome, 0) == 1
