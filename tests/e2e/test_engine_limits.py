"""What the router buffers from an engine is bounded: a hostile engine (`hostile.py`) sends
an endless SSE line, an event far past `fleet.max_event_bytes`, choice indices the request
could not produce, a content flood past `fleet.max_response_bytes`, and a `[DONE]` with the
body left open. Each time the client hears the truth (a 502 `upstream_error` before
headers, an error event after them, or the answer `[DONE]` ended), the router's peak
memory (VmHWM) stays far below what the engine sent, the engine sees its connection
closed, and every request is counted once with every slot released.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import MODEL, Reply, chat, completion, send
from tests.e2e.hostile import Exchange, HostileEngine, Script, chunk, event, route_of, well_behaved
from tests.e2e.test_admission import assert_all_released
from tests.processes import NarwhalProcess, router_process

HUGE = 200 << 20  # what the hostile engine sends: 200 MiB
# Far below HUGE, far above the router's own footprint (~60 MB); the peak before the
# limits were 246 MB (the line) and ~1 GB (the event).
PEAK_LIMIT_MB = 150
MIB = b"x" * (1 << 20)


def peak_rss_mb(process: NarwhalProcess) -> float:
    """The process's peak resident memory so far (VmHWM), in MB."""
    with open(f"/proc/{process.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def config_for(*engines: HostileEngine, **fleet: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "engines": [
            {"name": f"h{i}", "url": engine.url, "dialect": "openai", "role": "both"}
            for i, engine in enumerate(engines)
        ],
        "admission": {"mode": "open"},
        "fleet": {"probe_interval_s": 0.2, "stale_after_s": 1.0, **fleet},
    }


@pytest.fixture
def hostile(request: pytest.FixtureRequest) -> Iterator[HostileEngine]:
    script: Script = request.param
    with HostileEngine(script) as engine:
        yield engine
    assert not engine.errors, engine.errors


def body_for(stream: bool, route: str = "chat") -> dict[str, Any]:
    make = chat if route == "chat" else completion
    return make("hostile", stream=stream, max_tokens=16)


def error_of(reply: Reply) -> dict[str, Any]:
    """The error of a 502 answer, or of the stream's last event."""
    if reply.status != 200:
        error: dict[str, Any] = reply.json()["error"]
        return error
    last = reply.events()[-1]
    assert isinstance(last, dict) and "error" in last, reply.raw[-500:]
    error = last["error"]
    return error


async def served_and_released(
    router: NarwhalProcess, engine: HostileEngine, body: dict[str, Any], **send_args: Any
) -> tuple[Reply, float]:
    """Send `body`; the reply and the router's peak memory after it, once the engine's
    connection is closed and every slot is back."""
    reply = await send(router.url, body, **send_args)
    assert await asyncio.to_thread(engine.wait_idle), "the router kept the engine connection"
    await assert_all_released(router)
    return reply, peak_rss_mb(router)


# --- fleet.max_event_bytes ------------------------------------------------------------------


async def endless_line(exchange: Exchange) -> None:
    """One `data:` line that never ends: 200 MiB without a newline, then the body ends."""
    await exchange.head()
    await exchange.send(b'data: {"choices":[{"index":0,"delta":{"content":"')
    await exchange.repeat(MIB, HUGE)
    await exchange.end()


async def huge_event(exchange: Exchange, *, first: bool = False) -> None:
    """One valid 200 MiB event (maybe after a small one), finished and [DONE]."""
    route = route_of(exchange)
    await exchange.head()
    if first:
        await exchange.send(event(chunk(route, "Hi")))
        await asyncio.sleep(0.2)  # the client has its headers and first event
    whole = event(chunk(route, "<" + "x" * 16 + ">"))
    head, tail = whole.split(b"x" * 16)
    await exchange.send(head)
    await exchange.repeat(MIB, HUGE)
    await exchange.send(tail)
    await exchange.send(event(chunk(route, "", "stop")) + b"data: [DONE]\n\n")
    await exchange.end()


async def huge_event_after_headers(exchange: Exchange) -> None:
    await huge_event(exchange, first=True)


@pytest.mark.parametrize("hostile", [endless_line], indirect=True)
@pytest.mark.parametrize("stream", [False, True])
async def test_an_endless_line_fails_the_attempt_within_the_limit(
    hostile: HostileEngine, stream: bool
) -> None:
    with router_process(config_for(hostile)) as router:
        reply, peak = await served_and_released(router, hostile, body_for(stream))
    assert reply.status == 502
    error = error_of(reply)
    assert error["code"] == "upstream_error"
    assert "fleet.max_event_bytes" in error["message"]
    assert peak < PEAK_LIMIT_MB, f"router peak {peak:.0f} MB"


@pytest.mark.parametrize("hostile", [huge_event], indirect=True)
async def test_an_oversized_event_before_headers_is_a_502(hostile: HostileEngine) -> None:
    with router_process(config_for(hostile)) as router:
        reply, peak = await served_and_released(router, hostile, body_for(False))
    assert reply.status == 502
    assert error_of(reply)["code"] == "upstream_error"
    assert "fleet.max_event_bytes" in error_of(reply)["message"]
    assert peak < PEAK_LIMIT_MB, f"router peak {peak:.0f} MB"


@pytest.mark.parametrize("hostile", [huge_event_after_headers], indirect=True)
async def test_an_oversized_event_after_headers_ends_the_stream(hostile: HostileEngine) -> None:
    with router_process(config_for(hostile)) as router:
        reply, peak = await served_and_released(router, hostile, body_for(True))
    assert reply.status == 200
    events = reply.events()
    assert events[0]["choices"][0]["delta"]["content"] == "Hi"
    assert "[DONE]" not in events
    error = error_of(reply)
    assert error["code"] == "upstream_error"
    assert "fleet.max_event_bytes" in error["message"]
    assert peak < PEAK_LIMIT_MB, f"router peak {peak:.0f} MB"


@pytest.mark.parametrize("hostile", [huge_event], indirect=True)
async def test_an_oversized_event_is_retried_on_another_engine(hostile: HostileEngine) -> None:
    """Like any engine output error before headers: another engine serves the request."""
    with HostileEngine(well_behaved) as good:
        config = config_for(hostile, good, max_attempts=2, policy="round_robin")
        with router_process(config) as router:
            replies = [await send(router.url, body_for(False)) for _ in range(2)]
            assert await asyncio.to_thread(hostile.wait_idle)
            values = await assert_all_released(router)
    assert [r.status for r in replies] == [200, 200]
    assert all(r.json()["choices"][0]["message"]["content"] == "Hello" for r in replies)
    assert hostile.requests >= 1
    assert values['narwhal_engine_failures_total{engine="h0",stage="before_headers"}'] >= 1


async def _done_without_a_choice(exchange: Exchange) -> None:
    await exchange.head()
    await exchange.send(event({"id": "x", "object": "chat.completion.chunk", "choices": []}))
    await exchange.send(b"data: [DONE]\n\n")
    await exchange.end()


async def test_an_answer_without_any_choice_is_retried_on_another_engine() -> None:
    """Found at the end of assembly, it is still an engine output error before headers."""
    with HostileEngine(_done_without_a_choice) as bad, HostileEngine(well_behaved) as good:
        config = config_for(bad, good, max_attempts=2, policy="round_robin")
        with router_process(config) as router:
            replies = [await send(router.url, body_for(False)) for _ in range(2)]
            values = await assert_all_released(router)
    assert [r.status for r in replies] == [200, 200], [r.raw for r in replies]
    assert bad.requests >= 1
    assert values['narwhal_engine_failures_total{engine="h0",stage="before_headers"}'] >= 1


async def test_max_event_bytes_is_configurable() -> None:
    """An event of 64 KiB passes the default and fails a 32 KiB limit."""

    async def answer(exchange: Exchange) -> None:
        route = route_of(exchange)
        await exchange.head()
        await exchange.send(event(chunk(route, "y" * (64 << 10), "stop")) + b"data: [DONE]\n\n")
        await exchange.end()

    with HostileEngine(answer) as engine:
        with router_process(config_for(engine)) as router:
            reply = await send(router.url, body_for(False))
            assert reply.status == 200
            assert reply.json()["choices"][0]["message"]["content"] == "y" * (64 << 10)
        with router_process(config_for(engine, max_event_bytes=32 << 10)) as router:
            reply = await send(router.url, body_for(False))
            assert reply.status == 502
            assert "fleet.max_event_bytes (32768 bytes)" in error_of(reply)["message"]
            await assert_all_released(router)


# --- choice indices -------------------------------------------------------------------------

WIDE = 100_000  # choices in one event: ~2.5 MB of JSON, under the event limit


async def wide_event(exchange: Exchange, *, first: bool = False) -> None:
    """One event with choice indices 0 .. WIDE-1, where the request asked for one."""
    route = route_of(exchange)
    await exchange.head()
    if first:
        await exchange.send(event(chunk(route, "Hi")))
        await asyncio.sleep(0.2)
    one = chunk(route, "x")
    one["choices"] = [{**one["choices"][0], "index": i} for i in range(WIDE)]
    await exchange.send(event(one))
    await exchange.send(event(chunk(route, "", "stop")) + b"data: [DONE]\n\n")
    await exchange.end()


async def wide_event_after_headers(exchange: Exchange) -> None:
    await wide_event(exchange, first=True)


@pytest.mark.parametrize("hostile", [wide_event], indirect=True)
@pytest.mark.parametrize("route", ["chat", "completion"])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_choice_index_the_request_cannot_produce_fails_the_attempt(
    hostile: HostileEngine, route: str, stream: bool
) -> None:
    with router_process(config_for(hostile)) as router:
        started = time.monotonic()
        reply, peak = await served_and_released(router, hostile, body_for(stream, route))
        elapsed = time.monotonic() - started
    assert reply.status == 502
    error = error_of(reply)
    assert error["code"] == "upstream_error"
    assert "choice index 1" in error["message"]
    assert peak < PEAK_LIMIT_MB, f"router peak {peak:.0f} MB"
    assert elapsed < 5, f"{elapsed:.1f} s"


@pytest.mark.parametrize("hostile", [wide_event_after_headers], indirect=True)
async def test_a_choice_index_past_n_after_headers_ends_the_stream(
    hostile: HostileEngine,
) -> None:
    with router_process(config_for(hostile)) as router:
        reply, peak = await served_and_released(router, hostile, body_for(True))
    assert reply.status == 200
    assert "[DONE]" not in reply.events()
    error = error_of(reply)
    assert error["code"] == "upstream_error"
    assert "choice index 1" in error["message"]
    assert peak < PEAK_LIMIT_MB, f"router peak {peak:.0f} MB"


# --- what a stream that failed after its headers leaves behind ------------------------------

EMPTIES = 2_700_000  # empty objects in one event: ~8 MB of JSON, under the event limit
FAILURES = 10
# What the router may have grown by after FAILURES such streams (pools, metrics, allocator
# slack); before their failures let go of what they read it grew ~200 MB a stream.
RETAINED_LIMIT_MB = 60


def rss_mb(process: NarwhalProcess) -> float:
    """The process's resident memory now (VmRSS), in MB."""
    with open(f"/proc/{process.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/<pid>/status")


async def empty_choices_after_headers(exchange: Exchange) -> None:
    """A first event, then one whose choices are one valid choice and EMPTIES empty
    objects: "malformed choice index" once the router has decoded all of it (~200 MB of
    empty dicts, which the cyclic collector does not track, so none of them triggers it)."""
    route = route_of(exchange)
    await exchange.head()
    await exchange.send(event(chunk(route, "Hi")))
    await asyncio.sleep(0.2)  # the client has its headers and first event
    valid = event(chunk(route, "x"))  # its choices list ends the object: ...}]}\n\n
    await exchange.send(valid[: -len(b"]}\n\n")] + b",{}" * EMPTIES + b"]}\n\n")
    assert await exchange.until_closed(30), "the router never let go of the connection"


@pytest.mark.parametrize("hostile", [empty_choices_after_headers], indirect=True)
async def test_streams_failed_after_headers_give_their_memory_back(
    hostile: HostileEngine,
) -> None:
    with router_process(config_for(hostile)) as router:
        await served_and_released(router, hostile, body_for(True))  # first use: pools, caches
        before = rss_mb(router)
        for _ in range(FAILURES):
            reply, _ = await served_and_released(router, hostile, body_for(True))
            assert reply.status == 200
            assert "[DONE]" not in reply.events()
            error = error_of(reply)
            assert error["code"] == "upstream_error"
            assert "malformed choice index" in error["message"]
        grown = rss_mb(router) - before
    assert grown < RETAINED_LIMIT_MB, f"{before:.0f} MB, {grown:.0f} MB more after {FAILURES}"


# --- fleet.max_response_bytes and [DONE] ---------------------------------------------------


async def content_flood(exchange: Exchange) -> None:
    """Valid content events of 16 KiB, never finished, until the router hangs up."""
    route = route_of(exchange)
    await exchange.head()
    piece = event(chunk(route, "z" * (16 << 10)))
    while True:
        await exchange.send(piece * 4)


@pytest.mark.parametrize("hostile", [content_flood], indirect=True)
async def test_a_non_streaming_answer_is_bounded(hostile: HostileEngine) -> None:
    config = config_for(hostile, max_response_bytes=16 << 20)
    with router_process(config) as router:
        started = time.monotonic()
        reply, peak = await served_and_released(
            router, hostile, body_for(False), headers={"X-Request-Timeout": "20"}
        )
        elapsed = time.monotonic() - started
    assert reply.status == 502
    error = error_of(reply)
    assert error["code"] == "upstream_error"
    assert "fleet.max_response_bytes (16777216 bytes" in error["message"]
    assert elapsed < 10, f"{elapsed:.1f} s: held until the deadline"
    assert peak < PEAK_LIMIT_MB, f"router peak {peak:.0f} MB"


async def done_then_more(exchange: Exchange) -> None:
    """A whole answer and [DONE], then more events (in the same read and later), and the
    body left open until the router hangs up."""
    route = route_of(exchange)
    await exchange.head()
    await exchange.send(event(chunk(route, "Hello")) + event(chunk(route, "", "stop")))
    await exchange.send(b"data: [DONE]\n\n" + event(chunk(route, " AFTER")))
    await asyncio.sleep(0.1)
    await exchange.send(event(chunk(route, " LATER")))
    assert await exchange.until_closed(30), "the router never let go of the connection"


@pytest.mark.parametrize("hostile", [done_then_more], indirect=True)
@pytest.mark.parametrize("route", ["chat", "completion"])
async def test_a_non_streaming_answer_ends_at_done(hostile: HostileEngine, route: str) -> None:
    with router_process(config_for(hostile)) as router:
        started = time.monotonic()
        reply = await send(router.url, body_for(False, route), headers={"X-Request-Timeout": "20"})
        elapsed = time.monotonic() - started
        assert await asyncio.to_thread(hostile.wait_idle)
        values = await assert_all_released(router)
    assert reply.status == 200, reply.raw
    choice = reply.json()["choices"][0]
    text = choice["message"]["content"] if route == "chat" else choice["text"]
    assert text == "Hello"
    assert choice["finish_reason"] == "stop"
    assert elapsed < 3, f"{elapsed:.1f} s: held past [DONE]"
    assert values['narwhal_outcomes_total{outcome="completed"}'] == 1


@pytest.mark.parametrize("hostile", [done_then_more], indirect=True)
async def test_a_stream_read_to_its_end_is_completed_whatever_the_engine_does_after(
    hostile: HostileEngine,
) -> None:
    """The client reads the whole stream and closes while the router still waits for the
    end of the engine's body (left open here): that cancels the router's handler, and the
    request is still counted completed, not client_gone."""
    with router_process(config_for(hostile)) as router:
        reply = await send(router.url, body_for(True), headers={"X-Request-Timeout": "20"})
        assert reply.status == 200 and reply.events()[-1] == "[DONE]"
        assert await asyncio.to_thread(hostile.wait_idle)
        values = await assert_all_released(router)
    assert values['narwhal_outcomes_total{outcome="completed"}'] == 1
    assert values.get('narwhal_outcomes_total{outcome="client_gone"}', 0) == 0


async def done_then_end_apart(exchange: Exchange) -> None:
    """A correct answer whose body ends a moment after [DONE], in a packet of its own."""
    route = route_of(exchange)
    await exchange.head()
    await exchange.send(event(chunk(route, "Hello")) + event(chunk(route, "", "stop")))
    await exchange.send(b"data: [DONE]\n\n")
    await asyncio.sleep(0.001)
    await exchange.end()


@pytest.mark.parametrize("hostile", [done_then_end_apart], indirect=True)
async def test_a_connection_whose_body_ends_after_done_is_reused(hostile: HostileEngine) -> None:
    """Stopping at [DONE] does not cost the keep-alive: the end of the body that follows
    at once is still taken, and the next request goes on the same connection."""
    with router_process(config_for(hostile)) as router:
        replies = [await send(router.url, body_for(False)) for _ in range(5)]
        await assert_all_released(router)
    assert [r.status for r in replies] == [200] * 5
    assert hostile.requests == 5
    assert hostile.connections == 1
