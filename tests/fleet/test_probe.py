"""One probe against real sockets: every way it can go, as an outcome, never an exception."""

from __future__ import annotations

import time

import aiohttp
import pytest

from narwhal.fleet.probe import check_health, scrape_metrics
from narwhal.fleet.scrape import EngineScrape
from narwhal.fleet.state import HealthCheck, MetricsFailure
from narwhal.protocol.dialects import capabilities
from tests.fleet.exposition import SGLANG_PAGE
from tests.fleet.fake_engine import FakeEngine

TIMEOUT = aiohttp.ClientTimeout(total=0.2)


@pytest.mark.parametrize(
    ("behaviour", "outcome"),
    [
        ("ok", HealthCheck.OK),
        ("503", HealthCheck.UNHEALTHY),
        ("500", HealthCheck.BAD_STATUS),
        ("404", HealthCheck.BAD_STATUS),
        ("hang", HealthCheck.TIMEOUT),
    ],
)
async def test_health_outcomes(
    fake_engine: FakeEngine,
    session: aiohttp.ClientSession,
    behaviour: str,
    outcome: HealthCheck,
) -> None:
    fake_engine.health = behaviour
    assert await check_health(session, fake_engine.url, TIMEOUT) is outcome


async def test_health_with_transformers_body(
    fake_engine: FakeEngine, session: aiohttp.ClientSession
) -> None:
    fake_engine.health_body = '{"status":"ok"}'
    assert await check_health(session, fake_engine.url, TIMEOUT) is HealthCheck.OK


async def test_timeout_is_bounded(fake_engine: FakeEngine, session: aiohttp.ClientSession) -> None:
    fake_engine.health = "hang"
    start = time.monotonic()
    await check_health(session, fake_engine.url, TIMEOUT)
    assert time.monotonic() - start < 1.0


async def test_closed_port_is_unreachable(closed_port: int, session: aiohttp.ClientSession) -> None:
    url = f"http://127.0.0.1:{closed_port}"
    assert await check_health(session, url, TIMEOUT) is HealthCheck.UNREACHABLE
    assert (
        await scrape_metrics(session, url, capabilities("vllm"), TIMEOUT)
        is MetricsFailure.UNREACHABLE
    )


async def test_dropped_connection_is_an_error(
    dropping_server: str, session: aiohttp.ClientSession
) -> None:
    assert await check_health(session, dropping_server, TIMEOUT) is HealthCheck.ERROR
    assert (
        await scrape_metrics(session, dropping_server, capabilities("vllm"), TIMEOUT)
        is MetricsFailure.ERROR
    )


async def test_scrape_reads_the_page(
    fake_engine: FakeEngine, session: aiohttp.ClientSession
) -> None:
    assert await scrape_metrics(
        session, fake_engine.url, capabilities("vllm"), TIMEOUT
    ) == EngineScrape(5.0, 5.0, 0.375)
    fake_engine.metrics_text = SGLANG_PAGE
    assert await scrape_metrics(
        session, fake_engine.url, capabilities("sglang"), TIMEOUT
    ) == EngineScrape(7.0, 2.0, 0.42)


@pytest.mark.parametrize(
    ("behaviour", "outcome"),
    [
        ("404", MetricsFailure.ABSENT),
        ("500", MetricsFailure.BAD_STATUS),
        ("503", MetricsFailure.BAD_STATUS),
        ("hang", MetricsFailure.TIMEOUT),
    ],
)
async def test_scrape_failures(
    fake_engine: FakeEngine,
    session: aiohttp.ClientSession,
    behaviour: str,
    outcome: MetricsFailure,
) -> None:
    fake_engine.metrics = behaviour
    assert await scrape_metrics(session, fake_engine.url, capabilities("vllm"), TIMEOUT) is outcome


@pytest.mark.parametrize(
    ("dialect", "outcome"),
    [("vllm", MetricsFailure.UNREADABLE), ("openai", MetricsFailure.ABSENT)],
)
async def test_page_without_load_metrics(
    fake_engine: FakeEngine,
    session: aiohttp.ClientSession,
    dialect: str,
    outcome: MetricsFailure,
) -> None:
    # A vLLM engine must have its metrics; a generic server's process metrics say nothing.
    fake_engine.metrics_text = "# TYPE process_open_fds gauge\nprocess_open_fds 6.0\n"
    assert await scrape_metrics(session, fake_engine.url, capabilities(dialect), TIMEOUT) is outcome


async def test_session_raise_for_status_is_overridden(fake_engine: FakeEngine) -> None:
    fake_engine.health = "503"
    async with aiohttp.ClientSession(raise_for_status=True) as strict:
        assert await check_health(strict, fake_engine.url, TIMEOUT) is HealthCheck.UNHEALTHY
