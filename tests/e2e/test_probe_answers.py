"""A hostile engine's probe answers cannot take the router's memory (fleet/probe.py).

Engine h0 answers one of the monitor's GETs with what no engine should: a
`Content-Length` of 4 GB followed by 400 MB and then silence, a 300 MB chunked body, or a
/v1/models list of 1.5 million cards (4.5 MB, within the byte bound). The router must
read no more than `fleet.max_probe_answer_bytes` of it (so its peak resident memory stays
far below what the engine sends), count the probe failed, say why in /admin/engines, and
go on serving through h1, an engine that answers everything well, beside it.

The engines run in this test's loop (`tests/hostile_engine.py`), the router in its own
process, whose memory is read from /proc.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from tests.e2e.conftest import MODEL, chat, send
from tests.hostile_engine import HostileEngine, ProbeAnswer, Script, sse
from tests.processes import NarwhalProcess, router_process

MIB = 1 << 20
LIMIT = 8 * MIB  # fleet.max_probe_answer_bytes' default
# Far above the router's own ~60 MB, far below the hundreds of MB the engine sends.
MAX_PEAK_RSS_MB = 150
_LINE = b"# a comment line of a metrics page, repeated past any real page's size\n"
PAGE = (_LINE * (MIB // len(_LINE) + 1))[:MIB]
CARDS = 1_500_000
MODELS = b'{"object":"list","data":[{"id":"%b"}%b]}' % (MODEL.encode(), b",{}" * CARDS)


@dataclass(frozen=True, slots=True)
class Case:
    path: str
    answer: ProbeAnswer
    reason: str


def _over(path: str) -> str:
    return f"{path} answer over fleet.max_probe_answer_bytes ({LIMIT} bytes)"


CASES = {
    "/metrics 4 GB claimed, 400 MB sent, stall": Case(
        "/metrics",
        ProbeAnswer(PAGE, repeat=400, claimed=4 << 30, stall=True, content_type="text/plain"),
        _over("/metrics"),
    ),
    "/metrics 300 MB chunked": Case(
        "/metrics", ProbeAnswer(PAGE, repeat=300, content_type="text/plain"), _over("/metrics")
    ),
    "/health 4 GB claimed, 400 MB sent, stall": Case(
        "/health", ProbeAnswer(PAGE, repeat=400, claimed=4 << 30, stall=True), _over("/health")
    ),
    "/health 300 MB chunked": Case("/health", ProbeAnswer(PAGE, repeat=300), _over("/health")),
    "/v1/models 4 GB claimed, 400 MB sent, stall": Case(
        "/v1/models",
        ProbeAnswer(PAGE, repeat=400, claimed=4 << 30, stall=True),
        _over("/v1/models"),
    ),
    "/v1/models 1.5 million cards": Case(
        "/v1/models", ProbeAnswer(MODELS), "/v1/models answer lists over 10000 models"
    ),
}


def answer(body: dict[str, Any]) -> Script:
    """A short, correct chat answer."""
    base = {"id": "x", "object": "chat.completion.chunk", "model": MODEL}
    return Script(
        [
            sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            sse({**base, "choices": [{"index": 0, "delta": {"content": "hello"}}]}),
            sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            sse("[DONE]"),
        ]
    )


def memory_mb(pid: int) -> dict[str, float]:
    """The process's resident memory now (VmRSS) and at its peak (VmHWM), in MB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS", "VmHWM")))
    return {name: int(value.split()[0]) / 1024 for name, value in fields.items()}


@pytest.fixture
async def fleet(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[Case, HostileEngine, HostileEngine, NarwhalProcess]]:
    case = CASES[request.param]
    async with (
        HostileEngine(answer, probes={case.path: case.answer}) as bad,
        HostileEngine(answer) as good,
    ):
        settings = {
            "model": MODEL,
            "engines": [
                {"name": "h0", "url": bad.urls[0], "dialect": "openai"},
                {"name": "h1", "url": good.urls[0], "dialect": "openai"},
            ],
            "admission": {"mode": "open"},
            "fleet": {"max_attempts": 2, "probe_interval_s": 0.2},
        }
        with contextlib.ExitStack() as stack:
            # Started off the loop: the router probes this loop's engines while it starts.
            router = await asyncio.to_thread(stack.enter_context, router_process(settings))
            yield case, bad, good, router


async def monitoring(router: NarwhalProcess, name: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.get(router.url + "/admin/engines") as response:
            report = await response.json()
    (engine,) = [e for e in report["engines"] if e["name"] == name]
    found: dict[str, Any] = engine["monitoring"]
    return found


@pytest.mark.parametrize("fleet", list(CASES), indirect=True)
async def test_an_oversized_probe_answer_fails_the_probe_and_costs_no_memory(
    fleet: tuple[Case, HostileEngine, HostileEngine, NarwhalProcess],
) -> None:
    case, bad, good, router = fleet
    # Three probes of the hostile answer, each read as far as the router reads it: a
    # failed probe is asked again (one that took the answer for a good one would not be).
    asked = await bad.asked(case.path, 3, within=30)
    memory = memory_mb(router.pid)
    print(
        f"{case.path}: {asked} probes, router VmRSS {memory['VmRSS']:.0f} MB, "
        f"peak {memory['VmHWM']:.0f} MB"
    )
    assert memory["VmHWM"] < MAX_PEAK_RSS_MB, memory
    assert asked >= 3

    report = await monitoring(router, "h0")
    assert report["oversized_answers"] == {case.path: case.reason}
    if case.path == "/health":
        assert report["health"] == "down"  # two failed checks in a row
    assert (await monitoring(router, "h1"))["oversized_answers"] == {}

    before = (bad.requests, good.requests)
    for _ in range(4):
        reply = await send(router.url, chat("hi", max_tokens=4), timeout=10)
        assert reply.status == 200, reply.raw
        assert reply.json()["choices"][0]["message"]["content"] == "hello"
    served = (bad.requests - before[0], good.requests - before[1])
    # h0 is down with its /health refused; else it serves too (its answers are good).
    assert served == (0, 4) if case.path == "/health" else sum(served) == 4
