"""Real processes for end-to-end tests: `narwhal sim` engines and a `narwhal serve` router."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

import aiohttp
import pytest

from tests.metrics_text import samples
from tests.processes import NarwhalProcess, narwhal_process, router_process

MODEL = "narwhal-sim"


@contextmanager
def sim_process(*flags: str) -> Iterator[NarwhalProcess]:
    with narwhal_process(["sim", "--port", "0", "--model", MODEL, *flags]) as process:
        yield process


def fleet_config(engines: list[tuple[str, NarwhalProcess, str]], **sections: Any) -> dict[str, Any]:
    """A router configuration for (name, process, dialect) engines, role both."""
    config: dict[str, Any] = {
        "model": MODEL,
        "engines": [
            {"name": name, "url": proc.url, "dialect": dialect, "role": "both"}
            for name, proc, dialect in engines
        ],
        "admission": {"mode": "open"},
    }
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value}
    return config


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as s:
        yield s


Start = Callable[[AbstractContextManager[NarwhalProcess]], NarwhalProcess]


@pytest.fixture
def start(stack: ExitStack) -> Start:
    """Start a process for the length of the test."""
    return stack.enter_context


def chat(content: str = "Hello there", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


def completion(prompt: str = "Once upon a time", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, **fields}


def path_for(body: dict[str, Any]) -> str:
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


class Reply:
    def __init__(self, status: int, headers: Any, raw: bytes) -> None:
        self.status = status
        self.headers = headers
        self.raw = raw

    def json(self) -> Any:
        return json.loads(self.raw)

    def events(self) -> list[Any]:
        """The SSE data payloads, decoded ("[DONE]" kept as the string)."""
        out: list[Any] = []
        for block in self.raw.replace(b"\r\n", b"\n").split(b"\n\n"):
            for line in block.split(b"\n"):
                if line.startswith(b"data:"):
                    data = line[5:].strip()
                    out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
        return out


async def send(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None, timeout: float = 30
) -> Reply:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        async with session.post(url + path_for(body), json=body, headers=headers) as resp:
            return Reply(resp.status, resp.headers.copy(), await resp.read())


async def metrics_of(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        return samples(await resp.text())


async def settle(
    url: str, check: Callable[[dict[str, float]], bool], timeout: float = 10
) -> dict[str, float]:
    """Poll /metrics until `check` holds (or the time is up); the last values."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        values = await metrics_of(url)
        if check(values) or loop.time() > end:
            return values
        await asyncio.sleep(0.05)


def router_with(config: dict[str, Any]) -> AbstractContextManager[NarwhalProcess]:
    return router_process(config)
