"""A router bug on a completion route is answered 500 and counted `internal_error`
(DESIGN.md §3), never as an engine's `upstream_error`. The router runs in this process,
its service replaced by one that fails the way a bug does."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import aiohttp
import pytest

from narwhal.config import Config
from narwhal.router import Router
from tests.in_process import serve_app
from tests.metrics_text import samples

MODEL = "m"
INTERNAL = 'narwhal_outcomes_total{outcome="internal_error"}'
UPSTREAM = 'narwhal_outcomes_total{outcome="upstream_error"}'


async def test_a_router_bug_is_a_500_counted_internal_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = Router(Config(model=MODEL, engines=()))

    async def serve(*args: Any) -> NoReturn:
        raise RuntimeError("a bug")

    router.dispatcher.serve = serve  # type: ignore[method-assign]
    runner, base = await serve_app(router.app)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/metrics") as resp:
                before = samples(await resp.text())
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            with caplog.at_level(logging.ERROR, logger="narwhal.api.completions"):
                async with session.post(base + "/v1/chat/completions", json=body) as resp:
                    status, answer = resp.status, await resp.json()
            async with session.get(base + "/metrics") as resp:
                after = samples(await resp.text())
    finally:
        await runner.cleanup()
    assert before[INTERNAL] == 0
    assert status == 500
    assert answer["error"]["type"] == "server_error" and answer["error"]["code"] is None
    assert (after[INTERNAL], after[UPSTREAM]) == (1, 0)
    assert after["narwhal_offered_total"] == 1
    assert any("failed unexpectedly" in r.getMessage() for r in caplog.records)
