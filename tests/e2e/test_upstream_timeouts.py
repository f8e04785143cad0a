"""Per-phase upstream timeouts against real sockets: two hostile engines (`hostile.py`, each
on its own thread and loop) behind a router process, with limits of a fraction of a second.

- An engine that accepts a request (and sends its response head) but no event, silent or
  sending only keep-alive comments, is given up after `fleet.first_event_timeout_s`: the
  request is served by the other engine well within its deadline, the engine sees its
  connection closed, the attempt is counted as a timeout and an engine failure. When every
  attempt stalls the client gets a 502 `upstream_error`.
- An engine that goes silent after its first event: a streaming client gets one error
  event and no `[DONE]` after `fleet.idle_timeout_s`; a non-streaming one is served by the
  other engine.
- A slow engine that keeps sending (events, or only comments) within the gap is not cut.
- Without a configured first-event limit, predictive admission's projection sets it (a
  sim in real time that holds a request before its prefill).

Every request ends in one counted outcome, releases every slot and its engine count, and
its access line names the timeout that ended an attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from narwhal.engines.timeouts import FLOOR_S
from tests.e2e.conftest import MODEL, Reply, chat, metrics_of, send, settle, sim_process
from tests.e2e.hostile import Exchange, HostileEngine, Script, chunk, event, route_of, well_behaved
from tests.e2e.test_admission import assert_all_released
from tests.processes import NarwhalProcess, router_process

FIRST_EVENT_S = 0.3
IDLE_S = 0.3
PING = b": keep-alive\n\n"
ENGINES = ("h0", "h1")


class Plays:
    """What each prompt does on its first request (`stall`), on either engine; later
    requests with that prompt are answered well. Engines run on their own threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, int] = {}
        self.closed: dict[str, tuple[str, float]] = {}  # prompt -> engine, seconds held

    async def held(self, prompt: str) -> tuple[str, float]:
        """The engine that stalled `prompt` and how long until the router hung up (the
        engine's thread may see the close after the client has its answer)."""
        for _ in range(200):
            if prompt in self.closed:
                return self.closed[prompt]
            await asyncio.sleep(0.025)
        raise AssertionError(f"no engine saw the stalled {prompt!r} closed")

    def turn(self, prompt: str) -> int:
        with self._lock:
            turn = self._seen.get(prompt, 0)
            self._seen[prompt] = turn + 1
            return turn

    def script(self, engine: str) -> Script:
        async def play(exchange: Exchange) -> None:
            prompt = exchange.prompt
            kind, _, stalls = prompt.partition(" ")[0].partition("x")
            # "<kind>x<N>": the first N requests of the prompt misbehave as <kind>.
            if self.turn(prompt) >= int(stalls or 1):
                await _SLOW.get(kind, well_behaved)(exchange)
                return
            held = time.monotonic()
            # A reset (the router aborts the attempt) is a close all the same.
            with contextlib.suppress(ConnectionError):
                await _STALLS[kind](exchange)
            self.closed[prompt] = (engine, time.monotonic() - held)

        return play


async def silent(exchange: Exchange) -> None:
    """The head, then nothing until the router hangs up."""
    await exchange.head()
    assert await exchange.until_closed(10), "the router kept the stalled attempt"


async def pinging(exchange: Exchange) -> None:
    """The head, then only keep-alive comments, every 0.1 s, until the router hangs up."""
    await exchange.head()
    while not await exchange.until_closed(0.1):
        await exchange.send(PING)


async def silent_after_first(exchange: Exchange) -> None:
    """The head and a first event, then nothing until the router hangs up."""
    await exchange.head()
    await exchange.send(event(chunk(route_of(exchange), "Hello")))
    assert await exchange.until_closed(10), "the router kept the stalled attempt"


async def slow_events(exchange: Exchange) -> None:
    """Eight tokens, one every 0.15 s (half the gap): slow, never silent for long."""
    route = route_of(exchange)
    await exchange.head()
    for i in range(8):
        await exchange.send(event(chunk(route, f"t{i} ")))
        await asyncio.sleep(0.15)
    await exchange.send(event(chunk(route, "", "stop")) + b"data: [DONE]\n\n")
    await exchange.end()


async def slow_pings(exchange: Exchange) -> None:
    """A first event, then only comments for 1 s (every 0.1 s), then the rest."""
    route = route_of(exchange)
    await exchange.head()
    await exchange.send(event(chunk(route, "Hello")))
    for _ in range(10):
        await asyncio.sleep(0.1)
        await exchange.send(PING)
    await exchange.send(event(chunk(route, "", "stop")) + b"data: [DONE]\n\n")
    await exchange.end()


async def flood(exchange: Exchange) -> None:
    """16 MiB of tokens as fast as the router takes them (far more than the sockets on
    the way hold: a client that stops reading holds the engine back)."""
    route = route_of(exchange)
    await exchange.head()
    piece = event(chunk(route, "x" * 65536))
    for _ in range(256):
        await exchange.send(piece)
    await exchange.send(event(chunk(route, "", "stop")) + b"data: [DONE]\n\n")
    await exchange.end()


_STALLS = {"silent": silent, "pinging": pinging, "after-first": silent_after_first}
_SLOW = {"slow-events": slow_events, "slow-pings": slow_pings, "flood": flood}


class Fleet:
    def __init__(self, plays: Plays, router: NarwhalProcess, log: Path) -> None:
        self.plays = plays
        self.router = router
        self.log = log

    async def access_line(self, reply: Reply) -> dict[str, Any]:
        request_id = reply.headers["X-Request-Id"]
        for _ in range(100):
            for raw in self.log.read_text().splitlines():
                line = json.loads(raw)
                if line["logger"] == "narwhal.access" and line["request_id"] == request_id:
                    return dict(line)
            await asyncio.sleep(0.05)
        raise AssertionError(f"no access line for {request_id}")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    plays = Plays()
    log = tmp_path_factory.mktemp("timeouts") / "router.log"
    with HostileEngine(plays.script("h0")) as h0, HostileEngine(plays.script("h1")) as h1:
        config = {
            "model": MODEL,
            "engines": [
                {"name": name, "url": engine.url, "dialect": "openai", "role": "both"}
                for name, engine in zip(ENGINES, (h0, h1), strict=True)
            ],
            "admission": {"mode": "open"},
            "fleet": {
                "probe_interval_s": 0.2,
                "stale_after_s": 1.0,
                "max_attempts": 2,
                "first_event_timeout_s": FIRST_EVENT_S,
                "idle_timeout_s": IDLE_S,
            },
        }
        with router_process(config, "--log-format", "json", stderr_path=log) as router:
            yield Fleet(plays, router, log)
        assert not h0.errors and not h1.errors, (h0.errors, h1.errors)


def delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0) - before.get(key, 0)


def timeouts(engine: str, phase: str) -> str:
    return f'narwhal_upstream_timeouts_total{{engine="{engine}",phase="{phase}"}}'


def failures(engine: str, stage: str) -> str:
    return f'narwhal_engine_failures_total{{engine="{engine}",stage="{stage}"}}'


def outcome(name: str) -> str:
    return f'narwhal_outcomes_total{{outcome="{name}"}}'


async def released(fleet: Fleet) -> dict[str, float]:
    """Every slot and engine count back to zero, offered == outcomes; the metrics."""
    values = await assert_all_released(fleet.router)
    for engine in ENGINES:
        for phase in ("prefill", "decode"):
            assert values[f'narwhal_engine_requests{{engine="{engine}",phase="{phase}"}}'] == 0
    return values


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("kind", ["silent", "pinging"])
async def test_an_engine_that_sends_no_first_event_is_given_up_for_the_other(
    fleet: Fleet, kind: str, stream: bool
) -> None:
    prompt = f"{kind} first-event stream={stream}"
    before = await metrics_of(fleet.router.url)
    started = time.monotonic()
    reply = await send(fleet.router.url, chat(prompt, stream=stream, max_tokens=4))
    took = time.monotonic() - started
    assert reply.status == 200, reply.raw
    if stream:
        assert reply.events()[-1] == "[DONE]"
    else:
        assert reply.json()["choices"][0]["message"]["content"] == "Hello"
    # Given up at the limit, not held to the deadline (600 s).
    assert FIRST_EVENT_S <= took < FIRST_EVENT_S + 2.0, took
    stalled, held = await fleet.plays.held(prompt)
    assert held < FIRST_EVENT_S + 1.0, held  # the engine saw the attempt abandoned
    after = await released(fleet)
    assert delta(after, before, timeouts(stalled, "first_event")) == 1
    assert delta(after, before, failures(stalled, "before_headers")) == 1
    assert delta(after, before, outcome("completed")) == 1
    line = await fleet.access_line(reply)
    assert (line["outcome"], line["upstream_timeout"]) == ("completed", "first_event")
    assert line["engines"] == [other for other in ENGINES if other != stalled]


async def test_when_every_attempt_stalls_the_client_gets_a_502(fleet: Fleet) -> None:
    before = await metrics_of(fleet.router.url)
    started = time.monotonic()
    reply = await send(fleet.router.url, chat("silentx2 every attempt", max_tokens=4))
    took = time.monotonic() - started
    assert reply.status == 502, reply.raw
    error = reply.json()["error"]
    assert error["code"] == "upstream_error"
    assert "fleet.first_event_timeout_s" in error["message"]
    assert 2 * FIRST_EVENT_S <= took < 2 * FIRST_EVENT_S + 2.0, took
    after = await released(fleet)
    for engine in ENGINES:  # one attempt on each
        assert delta(after, before, timeouts(engine, "first_event")) == 1
    assert delta(after, before, outcome("upstream_error")) == 1
    line = await fleet.access_line(reply)
    assert (line["status"], line["upstream_timeout"]) == (502, "first_event")


async def test_a_stream_whose_engine_goes_silent_ends_with_an_error_event(
    fleet: Fleet,
) -> None:
    before = await metrics_of(fleet.router.url)
    started = time.monotonic()
    reply = await send(fleet.router.url, chat("after-first streamed", stream=True, max_tokens=4))
    took = time.monotonic() - started
    assert reply.status == 200
    events = reply.events()
    assert "[DONE]" not in events
    *relayed, last = events
    assert [e["choices"][0]["delta"] for e in relayed] == [{"content": "Hello"}]
    assert last["error"]["code"] == "upstream_error"
    assert "fleet.idle_timeout_s" in last["error"]["message"]
    assert IDLE_S <= took < IDLE_S + 2.0, took
    stalled, held = await fleet.plays.held("after-first streamed")
    assert held < IDLE_S + 1.0, held
    after = await released(fleet)
    assert delta(after, before, timeouts(stalled, "idle")) == 1
    assert delta(after, before, failures(stalled, "after_headers")) == 1
    assert delta(after, before, outcome("upstream_error")) == 1
    line = await fleet.access_line(reply)
    assert (line["outcome"], line["upstream_timeout"]) == ("upstream_error", "idle")


async def test_a_non_streaming_answer_whose_engine_goes_silent_is_served_elsewhere(
    fleet: Fleet,
) -> None:
    before = await metrics_of(fleet.router.url)
    reply = await send(fleet.router.url, chat("after-first whole", max_tokens=4))
    assert reply.status == 200, reply.raw
    assert reply.json()["choices"][0]["message"]["content"] == "Hello"
    stalled, _ = await fleet.plays.held("after-first whole")
    after = await released(fleet)
    assert delta(after, before, timeouts(stalled, "idle")) == 1
    assert delta(after, before, failures(stalled, "before_headers")) == 1
    assert delta(after, before, outcome("completed")) == 1


@pytest.mark.parametrize("kind", ["slow-events", "slow-pings"])
async def test_a_slow_engine_that_keeps_sending_is_not_cut(fleet: Fleet, kind: str) -> None:
    # "x0": no misbehaving turn; every request is answered slowly, over more than three
    # gaps in all, never silent for one.
    before = await metrics_of(fleet.router.url)
    reply = await send(fleet.router.url, chat(f"{kind}x0 live", stream=True, max_tokens=16))
    assert reply.status == 200
    events = reply.events()
    assert events[-1] == "[DONE]", events[-3:]
    assert not any(isinstance(e, dict) and "error" in e for e in events)
    after = await released(fleet)
    assert delta(after, before, outcome("completed")) == 1
    for engine in ENGINES:
        for phase in ("first_event", "idle"):
            assert delta(after, before, timeouts(engine, phase)) == 0
    line = await fleet.access_line(reply)
    assert line["upstream_timeout"] is None


async def test_a_client_that_stops_reading_does_not_make_the_engine_look_silent(
    fleet: Fleet,
) -> None:
    # While the client reads nothing the router stops reading the engine (backpressure):
    # the engine cannot send then, which is no silence of its own.
    before = await metrics_of(fleet.router.url)
    body = chat("floodx0 slow client", stream=True, max_tokens=16)
    async with aiohttp.ClientSession() as session:
        async with session.post(fleet.router.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            await asyncio.sleep(4 * IDLE_S)
            raw = await resp.read()
    events = Reply(200, {}, raw).events()
    assert events[-1] == "[DONE]", events[-1:]
    assert len(events) == 256 + 2
    after = await released(fleet)
    assert delta(after, before, outcome("completed")) == 1
    for engine in ENGINES:
        assert delta(after, before, timeouts(engine, "idle")) == 0


async def test_without_a_configured_limit_the_projection_sets_it(tmp_path: Path) -> None:
    """Predictive admission against two sims in real time: a request the sim holds before
    its prefill for 4 s is given up on the first engine after the derived limit (the
    budget, 0.5 s, raised to the 1 s floor, far above 4x the projection's few
    milliseconds) and retried on the other, which the prompt's directive holds as long;
    there, with no placement left to retry on, the attempt is not cut (it would only turn
    a late answer into an error) and the request is served; the first sim dropped it."""
    config = {
        "model": MODEL,
        "engines": [
            {"name": "s0", "url": "", "role": "both"},
            {"name": "s1", "url": "", "role": "both"},
        ],
        "admission": {"mode": "predictive", "ttft_target_s": 0.5},
        "fleet": {"max_attempts": 2},
    }
    with sim_process("--time-scale", "1") as first, sim_process("--time-scale", "1") as second:
        config["engines"][0]["url"] = first.url
        config["engines"][1]["url"] = second.url
        log = tmp_path / "router.log"
        with router_process(config, "--log-format", "json", stderr_path=log) as router:
            router_fleet = Fleet(Plays(), router, log)
            assert (await send(router.url, chat("Hello", max_tokens=4))).status == 200
            started = time.monotonic()
            reply = await send(router.url, chat("#sim:slow_prefill=4 a", max_tokens=4))
            took = time.monotonic() - started
            assert reply.status == 200, reply.raw
            assert FLOOR_S + 4 <= took < FLOOR_S + 4 + 2.0, took
            values = await assert_all_released(router)
            timed_out = [values[timeouts(name, "first_event")] for name in ("s0", "s1")]
            assert sorted(timed_out) == [0, 1], timed_out
            assert values[outcome("completed")] == 2
            line = await router_fleet.access_line(reply)
            assert line["upstream_timeout"] == "first_event"
            given_up = first if timed_out[0] else second
            running = 'vllm:num_requests_running{engine="0",model_name="narwhal-sim"}'
            engine = await settle(given_up.url, lambda v: v.get(running, 0) == 0)
            assert engine[running] == 0  # the sim stopped work on it
