"""Fixtures for the simulator's tests: sims in-process or as processes, and an SSE reader."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from narwhal.sim import RunningSim, SimOptions, start_sim

DONE = "[DONE]"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


StartSim = Callable[..., Awaitable[RunningSim]]


@pytest.fixture
async def sim_factory() -> AsyncIterator[StartSim]:
    """`await sim_factory(time_scale=0, dialect="sglang")`; every sim is closed afterwards."""
    started: list[RunningSim] = []

    async def factory(**fields: Any) -> RunningSim:
        fields.setdefault("time_scale", 0.0)
        sim = await start_sim(SimOptions(**fields))
        started.append(sim)
        return sim

    yield factory
    for sim in reversed(started):
        await sim.close()


@pytest.fixture
async def sim(sim_factory: StartSim) -> RunningSim:
    """A vLLM-dialect sim that never sleeps."""
    return await sim_factory()


@dataclass
class Streamed:
    status: int
    headers: Any
    events: list[Any]  # decoded JSON objects, or DONE
    raw: bytes

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [e for e in self.events if isinstance(e, dict)]

    @property
    def content(self) -> str:
        return "".join(
            c["choices"][0]["delta"].get("content") or ""
            for c in self.chunks
            if c.get("choices") and "delta" in c["choices"][0]
        )

    @property
    def text(self) -> str:
        return "".join(c["choices"][0]["text"] for c in self.chunks if c.get("choices"))

    def token_ids(self) -> list[int]:
        ids: list[int] = []
        for chunk in self.chunks:
            for choice in chunk.get("choices", []):
                ids += choice.get("token_ids") or []
        return ids


def parse_sse(raw: bytes) -> list[Any]:
    events: list[Any] = []
    for block in raw.decode().split("\n\n"):
        data = [line[6:] for line in block.split("\n") if line.startswith("data: ")]
        if not data:
            continue
        payload = "\n".join(data)
        events.append(DONE if payload == DONE else json.loads(payload))
    return events


async def post_stream(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], **kwargs: Any
) -> Streamed:
    async with http.post(url, json=body, **kwargs) as response:
        raw = await response.read()
        events = parse_sse(raw) if response.status == 200 else []
        return Streamed(response.status, response.headers, events, raw)


async def post_json(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], **kwargs: Any
) -> tuple[int, Any]:
    async with http.post(url, json=body, **kwargs) as response:
        return response.status, await response.json(content_type=None)


def chat_body(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "narwhal-sim", "messages": [{"role": "user", "content": content}], **extra}


async def timed_stream(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[float, list[float]]:
    """(TTFT, arrival time of each content event) as the client sees them."""
    started = time.monotonic()
    arrivals: list[float] = []
    buffer = b""
    async with http.post(f"{url}/v1/chat/completions", json=body) as response:
        assert response.status == 200
        async for chunk in response.content.iter_any():
            now = time.monotonic()
            buffer += chunk
            *events, buffer = buffer.split(b"\n\n")
            arrivals += [
                now for event in events if b'"content":"' in event and b"role" not in event
            ]
    return arrivals[0] - started, arrivals


# -- sims as real processes -------------------------------------------------------------
@dataclass
class SimProcess:
    proc: subprocess.Popen[str]
    url: str


@contextmanager
def sim_process(*args: str, timeout: float = 20.0) -> Iterator[SimProcess]:
    """`python -m narwhal sim --port 0 ARGS`, stopped with SIGTERM afterwards."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "narwhal", "sim", "--port", "0", *args],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = proc.stdout.readline()
        assert time.monotonic() < deadline, "sim took too long to start"
        prefix = "narwhal sim listening on "
        assert line.startswith(prefix), f"unexpected first line {line!r}"
        yield SimProcess(proc, line[len(prefix) :].strip())
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
