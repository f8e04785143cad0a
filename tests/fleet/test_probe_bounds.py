"""Every probe answer is read within its bound, over real sockets (fleet/probe.py,
engines/answers.py): the bound itself is read, a byte past it is not, whether the answer
says its length or not; a stall mid-body is the probe's timeout; JSON that is odd in its
size, its depth or its fields makes a probe unsure, never an exception. The monitor keeps
the reason of an oversized answer, logs it once, and forgets it once the engine answers
within the bounds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from narwhal.config import EngineConfig, FleetConfig
from narwhal.fleet.probe import (
    MAX_MODELS,
    Oversized,
    check_health,
    engine_version,
    list_models,
    scrape_metrics,
)
from narwhal.fleet.scrape import EngineScrape
from narwhal.fleet.state import HealthCheck, MetricsFailure
from narwhal.protocol.dialects import capabilities
from tests.fleet.conftest import MonitorFactory
from tests.fleet.exposition import VLLM_PAGE
from tests.fleet.fake_engine import FakeEngine, wait_for
from tests.hostile_engine import HostileEngine, ProbeAnswer, Script

TIMEOUT = aiohttp.ClientTimeout(total=0.5)
PAGE = VLLM_PAGE.encode()


def no_completions(body: dict[str, Any]) -> Script:
    raise AssertionError("no completion is asked of a probed engine here")


@contextlib.asynccontextmanager
async def probed(path: str, answer: ProbeAnswer) -> AsyncIterator[str]:
    """The URL of an engine that answers GET `path` with `answer`."""
    async with HostileEngine(no_completions, probes={path: answer}) as engine:
        yield engine.urls[0]


@pytest.mark.parametrize("claimed", [True, False], ids=["content-length", "chunked"])
async def test_an_answer_of_the_bound_is_read_and_one_byte_longer_is_not(
    session: aiohttp.ClientSession, claimed: bool
) -> None:
    answer = ProbeAnswer(PAGE, claimed=len(PAGE) if claimed else None, content_type="text/plain")
    async with probed("/metrics", answer) as url:
        scrape = await scrape_metrics(
            session, url, capabilities("vllm"), TIMEOUT, max_bytes=len(PAGE)
        )
        assert isinstance(scrape, EngineScrape)
        refused = await scrape_metrics(
            session, url, capabilities("vllm"), TIMEOUT, max_bytes=len(PAGE) - 1
        )
        assert refused is MetricsFailure.TOO_LARGE


async def test_a_huge_claimed_length_is_refused_at_once_and_unread(
    session: aiohttp.ClientSession,
) -> None:
    # 4 GB said, 64 KiB sent, then silence: refused on the head, long before the timeout.
    answer = ProbeAnswer(b"x" * 65536, claimed=4 << 30, stall=True)
    async with probed("/health", answer) as url:
        started = time.monotonic()
        assert await check_health(session, url, TIMEOUT, max_bytes=8192) is HealthCheck.TOO_LARGE
        assert time.monotonic() - started < TIMEOUT.total / 2  # type: ignore[operator]


async def test_a_stall_mid_body_within_the_bound_is_the_probe_timeout(
    session: aiohttp.ClientSession,
) -> None:
    answer = ProbeAnswer(b"{", claimed=1000, stall=True)
    async with probed("/health", answer) as url:
        started = time.monotonic()
        assert await check_health(session, url, TIMEOUT) is HealthCheck.TIMEOUT
        assert time.monotonic() - started < 2 * TIMEOUT.total  # type: ignore[operator]


@pytest.mark.parametrize(
    ("body", "models"),
    [
        # A card without a usable id is skipped; a context length that is not one is None.
        (
            b'{"data":[{"id":5},{"id":"m","max_model_len":true},'
            b'{"id":"n","max_model_len":4096,"permission":[{"x":[[[]]]}]}]}',
            {"m": None, "n": 4096},
        ),
        (b'{"data":[{"id":"m"},' + b"[" * 100_000 + b"]" * 100_000 + b"]}", None),
        (b'{"data":[{"id":"m","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}]}", None),
        (b"[" * 100_000 + b"]" * 100_000, None),
        (b'{"data":{"id":"m"}}', None),
        (b'{"data":[' + b",".join([b'{"id":"m"}'] * (MAX_MODELS + 1)) + b"]}", "over"),
        (b'{"data":[{"id":"m"}' + b",{}" * (8 * MAX_MODELS) + b"]}", "over"),
    ],
    ids=["odd cards", "deep card", "deep field", "deep list", "not a list", "cards", "objects"],
)
async def test_a_models_list_is_read_within_its_bounds(
    session: aiohttp.ClientSession, body: bytes, models: object
) -> None:
    async with probed("/v1/models", ProbeAnswer(body)) as url:
        found = await list_models(session, url, TIMEOUT)
    if models == "over":
        assert found == Oversized(f"/v1/models answer lists over {MAX_MODELS} models")
    else:
        assert found == models


async def test_an_oversized_or_odd_version_is_not_a_version(
    session: aiohttp.ClientSession,
) -> None:
    async with probed("/version", ProbeAnswer(b'{"version":"0.11.0"}' + b" " * 5000)) as url:
        assert await engine_version(session, url, TIMEOUT) == "0.11.0"
        assert await engine_version(session, url, TIMEOUT, max_bytes=4096) == Oversized(
            "/version answer over fleet.max_probe_answer_bytes (4096 bytes)"
        )
    for body in (b'{"version":["0.11.0"]}', b'{"version":' + b"[" * 100_000 + b"}"):
        async with probed("/version", ProbeAnswer(body)) as url:
            assert await engine_version(session, url, TIMEOUT) is None


async def test_the_monitor_says_an_oversized_answer_once_and_forgets_it_once_answered(
    make_monitor: MonitorFactory, fake_engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    bound = len(VLLM_PAGE.encode()) + 100
    fake_engine.metrics_text = VLLM_PAGE + "#" * 200  # 100 bytes over the bound
    fleet = FleetConfig(probe_interval_s=0.05, probe_timeout_s=0.5, max_probe_answer_bytes=bound)
    monitor = make_monitor([EngineConfig(name="e0", url=fake_engine.url, dialect="vllm")], fleet)
    reason = f"/metrics answer over fleet.max_probe_answer_bytes ({bound} bytes)"
    with caplog.at_level(logging.INFO, logger="narwhal.fleet.monitor"):
        await monitor.start()
        state = monitor.health("e0")
        assert state.oversized == {"/metrics": reason}
        assert monitor.report("e0", time.monotonic())["oversized_answers"] == {"/metrics": reason}
        assert state.last_scrape is None and state.healthy  # a failed scrape, /health fine
        scrapes = fake_engine.hits["/metrics"]
        await wait_for(lambda: fake_engine.hits["/metrics"] >= scrapes + 3, within=5)
        assert caplog.text.count(reason) == 1  # said once, not once a round
        fake_engine.metrics_text = VLLM_PAGE
        await wait_for(lambda: not state.oversized, within=5)
        assert isinstance(state.last_scrape, EngineScrape)
        await asyncio.sleep(0)
    assert "engine e0 answers /metrics within the bounds again" in caplog.text
