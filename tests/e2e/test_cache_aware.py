"""Cache-aware placement (`fleet.policy: cache_aware`) against `narwhal sim` processes:
a conversation's turns stick to the engine that holds its history, unrelated
conversations spread across the fleet, and /admin/engines and /metrics show the index."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.conftest import MODEL, Start, metrics_of, send, sim_process
from tests.processes import router_process

ENGINES = 3


def conversation(topic: str, turns: int, size: int = 100) -> list[dict[str, str]]:
    """A system prompt of its own (`size` sentences, about 6 tokens each) and `turns` user
    turns with replies."""
    messages = [{"role": "system", "content": f"You answer questions about {topic}. " * size}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn} about {topic}?"})
        messages.append({"role": "assistant", "content": f"Answer {turn} about {topic}."})
    return messages


def arrivals(logs: list[Path]) -> dict[str, int]:
    """Request id prefix (the client's X-Request-Id) -> the engine that received it."""
    where: dict[str, int] = {}
    for engine, log in enumerate(logs):
        if log.exists():
            for line in log.read_text().splitlines():
                request_id = line.split()[1]
                where[request_id.rsplit("-", 1)[0]] = engine
    return where


@pytest.mark.parametrize("mode", ["open", "predictive"])
async def test_a_conversation_sticks_to_its_engine_and_others_spread(
    start: Start, tmp_path: Path, mode: str
) -> None:
    logs = [tmp_path / f"arrivals-{i}" for i in range(ENGINES)]
    # At time-scale 0.5 a turn's cached history saves its engine about 20 ms of prefill:
    # more than a busy host adds to one request (at 0.05 it saved 2 ms, and a turn was
    # once placed on an engine whose few measured first tokens host noise had slowed).
    sims = [start(sim_process("--arrival-log", str(log), "--time-scale", "0.5")) for log in logs]
    config: dict[str, Any] = {
        "model": MODEL,
        "engines": [{"name": f"e{i}", "url": s.url} for i, s in enumerate(sims)],
        "admission": {"mode": mode, "ttft_target_s": 5},
        "fleet": {"policy": "cache_aware", "probe_interval_s": 0.2},
    }
    router = start(router_process(config))

    async def turn(topic: str, turns: int, size: int = 100) -> None:
        messages = conversation(topic, turns, size)[:-1]  # ends with the user's question
        body = {"model": MODEL, "messages": messages, "max_tokens": 4}
        reply = await send(router.url, body, headers={"X-Request-Id": f"{topic}-{turns}"})
        assert reply.status == 200, reply.raw

    for turns in range(1, 7):  # one conversation, turn by turn
        await turn("narwhals", turns)
    # Unrelated conversations, their first turns at once: nothing is cached for them, so
    # the prefill each puts on an engine (about 0.15 s of sim time) spreads the others.
    topics = ("tides", "glaciers", "krill", "sonar", "icebergs", "plankton", "fjords")
    await asyncio.gather(*(turn(topic, 1, size=500) for topic in topics))

    where = arrivals(logs)
    assert len({where[f"narwhals-{t}"] for t in range(1, 7)}) == 1, where
    assert len({where[f"{t}-1"] for t in topics}) >= 2, where

    async with aiohttp.ClientSession() as session:
        async with session.get(router.url + "/admin/engines") as response:
            engines = (await response.json())["engines"]
    home = engines[where["narwhals-1"]]["prefix_cache"]
    assert home["blocks"] > 0 and home["predicted_hit_tokens"] > 0
    values = await metrics_of(router.url)
    predicted = sum(
        values[f'narwhal_prefix_predicted_hit_tokens_total{{engine="e{i}"}}']
        for i in range(ENGINES)
    )
    # Turns 2-6 each find the history of the turn before: most of their prompt.
    assert predicted >= 5 * 500
    assert values[f'narwhal_prefix_index_blocks{{engine="e{where["narwhals-1"]}"}}'] > 0
