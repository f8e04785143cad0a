"""The fleet monitor against engines on real loopback sockets.

Intervals are 0.05-0.2 s so the tests are quick; time bounds are generous where the
behaviour allows it (the test machine is small and shared), and exact where the brief
makes a promise: a stopped engine leaves placement within (interval + timeout) x 2.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from narwhal.config import EngineConfig, FleetConfig
from narwhal.fleet.monitor import FleetMonitor
from narwhal.fleet.probe import check_health
from narwhal.fleet.scrape import EngineScrape
from narwhal.fleet.state import HealthCheck, MetricsFailure
from tests.fleet.conftest import MonitorFactory
from tests.fleet.fake_engine import FakeEngine, wait_for

# Probes every 10 s: the tests drive what they check. Their timeout is generous, so that a
# loaded machine (CI runs three test processes beside a real vLLM) does not time out a
# fake engine's answer; the tests of the timeout set their own.
SLOW = FleetConfig(probe_interval_s=10.0, stale_after_s=30.0, probe_timeout_s=2.0)


def engine(name: str, url: str, dialect: str = "vllm") -> EngineConfig:
    return EngineConfig(name=name, url=url, dialect=dialect)  # type: ignore[arg-type]


def fleet(interval: float = 0.1, timeout: float = 0.2, stale: float = 1.0) -> FleetConfig:
    return FleetConfig(probe_interval_s=interval, probe_timeout_s=timeout, stale_after_s=stale)


def fleet_tasks() -> set[asyncio.Task[object]]:
    """Tasks running the monitor's code: its probe loops and their probe requests."""
    found = set()
    for task in asyncio.all_tasks():
        code = getattr(task.get_coro(), "cr_code", None)
        filename = code.co_filename if code is not None else ""
        if task.get_name().startswith("fleet-probe-") or "narwhal/fleet/" in filename:
            found.add(task)
    return found


class Changes:
    """A subscriber that counts calls and records placeability at each."""

    def __init__(self, monitor: FleetMonitor, name: str) -> None:
        self.seen: list[bool] = []
        monitor.subscribe(lambda: self.seen.append(monitor.is_placeable(name)))


async def test_start_checks_every_engine_before_returning(
    make_monitor: MonitorFactory, fake_engine: FakeEngine
) -> None:
    monitor = make_monitor([engine("e0", fake_engine.url + "/")], SLOW)
    assert not monitor.is_placeable("e0")  # unknown until checked
    await monitor.start()
    assert monitor.is_placeable("e0")
    state = monitor.health("e0")
    assert state.last_scrape == EngineScrape(running=5.0, waiting=5.0, kv_usage=0.375)
    report = monitor.report("e0", time.monotonic())
    assert report["scrape_age_s"] is not None and 0 <= report["scrape_age_s"] < 5
    report["scrape_age_s"] = None
    assert report == {
        "health": "up",
        "consecutive_failures": 0,
        "last_scrape": {"running": 5.0, "waiting": 5.0, "kv_usage": 0.375},
        "scrape_age_s": None,
        "metrics": "ok",
        "serves_model": None,  # no model configured for this monitor: not checked
        "max_model_len": None,
        "credentials_refused": False,
        "version": None,  # this engine has no /version
        "supplies_token_ids": None,
        "oversized_answers": {},  # every answer within fleet.max_probe_answer_bytes
    }
    assert not monitor.monitoring_degraded()


async def test_start_is_bounded_by_the_probe_timeout(
    make_monitor: MonitorFactory, fake_engine: FakeEngine, closed_port: int
) -> None:
    fake_engine.health = "hang"
    fake_engine.metrics = "hang"
    monitor = make_monitor(
        [engine("slow", fake_engine.url), engine("gone", f"http://127.0.0.1:{closed_port}")],
        FleetConfig(probe_interval_s=10.0, stale_after_s=30.0, probe_timeout_s=0.2),
    )
    start = time.monotonic()
    await monitor.start()
    assert time.monotonic() - start < 1.0  # probe_timeout_s is 0.2
    # One timeout is not yet a verdict; a refused connection is.
    assert monitor.report("slow", time.monotonic())["health"] == "unknown"
    assert monitor.report("gone", time.monotonic())["health"] == "down"
    assert not monitor.is_placeable("slow") and not monitor.is_placeable("gone")


async def test_start_twice_is_an_error(make_monitor: MonitorFactory) -> None:
    monitor = make_monitor([], SLOW)
    await monitor.start()
    with pytest.raises(RuntimeError):
        await monitor.start()


async def test_stopped_engine_leaves_placement_and_comes_back(
    make_monitor: MonitorFactory, fake_engine: FakeEngine
) -> None:
    config = fleet(interval=0.1, timeout=0.2)
    monitor = make_monitor([engine("e0", fake_engine.url)], config)
    changes = Changes(monitor, "e0")
    await monitor.start()
    assert monitor.is_placeable("e0")

    await fake_engine.stop()
    bound = (config.probe_interval_s + config.probe_timeout_s) * 2
    left_after = await wait_for(lambda: not monitor.is_placeable("e0"), within=bound)
    assert monitor.report("e0", time.monotonic())["health"] == "down"

    await fake_engine.start()  # the same port
    # Backoff is capped at 4 intervals (+10% jitter), then one probe round.
    back_after = await wait_for(lambda: monitor.is_placeable("e0"), within=3.0)
    assert changes.seen == [True, False, True]
    print(f"left placement after {left_after:.3f} s, back after {back_after:.3f} s")


async def test_an_engine_coming_up_is_placeable_only_once_checked_and_announced(
    make_monitor: MonitorFactory, fake_engine: FakeEngine
) -> None:
    # What a vLLM engine serves is asked when it comes up (here /version, slowly):
    # placement must not see it up before that answer, nor before the subscribers
    # (the router's /ready) have heard.
    fake_engine.version = "0.11.0"
    fake_engine.version_delay_s = 0.3
    config = fleet(interval=0.05, timeout=1.0)
    monitor = make_monitor([engine("e0", fake_engine.url)], config)
    changes = Changes(monitor, "e0")
    await monitor.start()
    assert changes.seen == [True]
    await fake_engine.stop()
    await wait_for(lambda: not monitor.is_placeable("e0"), within=3.0)
    fake_engine.version = "0.12.0"  # the restart brought an upgrade
    await fake_engine.start()
    checked = fake_engine.hits["/version"]

    def placeable_only_when_told() -> bool:
        if not monitor.is_placeable("e0"):
            return False
        assert changes.seen[-1] is True  # told in the same step it changed
        assert fake_engine.hits["/version"] > checked
        assert monitor.health("e0").version == "0.12.0"
        return True

    await wait_for(placeable_only_when_told, within=5.0, step=0.002)
    assert changes.seen == [True, False, True]


async def test_503_takes_an_engine_out_at_once(
    make_monitor: MonitorFactory, fake_engine: FakeEngine
) -> None:
    monitor = make_monitor([engine("e0", fake_engine.url)], fleet(interval=0.05, timeout=0.2))
    await monitor.start()
    fake_engine.health = "503"
    await wait_for(lambda: not monitor.is_placeable("e0"), within=2.0)
    state = monitor.health("e0")
    assert (state.status, state.consecutive_failures) == ("down", 1)
    fake_engine.health = "ok"
    await wait_for(lambda: monitor.is_placeable("e0"), within=2.0)


async def test_hanging_health_takes_two_timeouts(
    make_monitor: MonitorFactory, fake_engine: FakeEngine
) -> None:
    monitor = make_monitor([engine("e0", fake_engine.url)], fleet(interval=0.05, timeout=0.1))
    await monitor.start()
    fake_engine.health = "hang"
    await wait_for(lambda: monitor.health("e0").consecutive_failures >= 1, within=2.0)
    await wait_for(lambda: not monitor.is_placeable("e0"), within=2.0)
    state = monitor.health("e0")
    assert state.consecutive_failures >= 2
    assert state.last_failure is HealthCheck.TIMEOUT


async def test_down_engine_is_probed_less_often(
    make_monitor: MonitorFactory, make_engine: Callable[[], FakeEngine]
) -> None:
    up, down = make_engine(), make_engine()
    await up.start()
    await down.start()
    down.health = "503"
    monitor = make_monitor(
        [engine("up", up.url), engine("down", down.url)], fleet(interval=0.05, timeout=0.2)
    )
    await monitor.start()
    await asyncio.sleep(1.0)
    # Healthy: about 20 rounds. Down: 0, 0.05, 0.15, 0.35, 0.55, ... (doubling, capped at 4x).
    assert down.hits["/health"] * 2 <= up.hits["/health"]
    assert down.hits["/health"] <= 9


async def test_openai_engine_without_metrics_is_placed_on_health_alone(
    make_monitor: MonitorFactory, fake_engine: FakeEngine
) -> None:
    fake_engine.metrics = "404"
    fake_engine.health_body = '{"status":"ok"}'  # transformers serve
    monitor = make_monitor(
        [engine("hf", fake_engine.url, "openai")], fleet(interval=0.05, stale=0.1)
    )
    await monitor.start()
    await wait_for(lambda: fake_engine.hits["/health"] >= 5, within=3.0)
    assert fake_engine.hits["/metrics"] == 1  # asked once; a 404 is an answer
    assert monitor.is_placeable("hf")
    report = monitor.report("hf", time.monotonic())
    assert (report["metrics"], report["last_scrape"]) == ("unsupported", None)
    assert not monitor.monitoring_degraded()


async def test_each_scrape_records_narwhals_own_requests_as_it_answered(
    make_monitor: MonitorFactory, fake_engine: FakeEngine
) -> None:
    # The engine's 5 running requests are compared with Narwhal's own count at the
    # scrape, so placement knows how many are another router's.
    own = {"e0": 2}
    monitor = make_monitor([engine("e0", fake_engine.url)], fleet(interval=0.05))
    monitor.count_own_requests(lambda name: own[name])
    await monitor.start()
    state = monitor.health("e0")
    assert state.own_at_scrape == 2
    own["e0"] = 4
    await wait_for(lambda: state.own_at_scrape == 4, within=2.0)
    fake_engine.metrics = "500"  # a failed scrape keeps the last good one's count
    own["e0"] = 7
    await wait_for(lambda: state.last_scrape_failed, within=2.0)
    assert state.own_at_scrape == 4


async def test_vllm_engine_keeps_being_scraped_after_a_404(
    make_monitor: MonitorFactory, fake_engine: FakeEngine
) -> None:
    fake_engine.metrics = "404"
    monitor = make_monitor([engine("v", fake_engine.url)], fleet(interval=0.05))
    await monitor.start()
    assert monitor.report("v", time.monotonic())["metrics"] == "unsupported"
    fake_engine.metrics = "ok"
    await wait_for(lambda: monitor.report("v", time.monotonic())["metrics"] == "ok", within=2.0)
    assert monitor.is_placeable("v")


@pytest.mark.parametrize("broken", ["500", "hang", "404"])
async def test_metrics_that_stop_working_take_the_engine_out_once_stale(
    make_monitor: MonitorFactory, fake_engine: FakeEngine, broken: str
) -> None:
    config = fleet(interval=0.05, timeout=0.1, stale=0.3)
    monitor = make_monitor([engine("e0", fake_engine.url)], config)
    changes = Changes(monitor, "e0")
    await monitor.start()
    fake_engine.metrics = broken
    await wait_for(lambda: not monitor.is_placeable("e0"), within=3.0)
    state = monitor.health("e0")
    assert state.last_scrape_at is not None
    assert time.monotonic() - state.last_scrape_at > config.stale_after_s  # not before
    assert state.healthy and state.monitoring_failed
    assert monitor.monitoring_degraded()  # the only engine, out for monitoring alone
    report = monitor.report("e0", time.monotonic())
    assert (report["health"], report["metrics"]) == ("up", "failed")
    assert report["last_scrape"] == {"running": 5.0, "waiting": 5.0, "kv_usage": 0.375}

    fake_engine.metrics = "ok"
    await wait_for(lambda: monitor.is_placeable("e0"), within=3.0)
    assert not monitor.monitoring_degraded()
    assert changes.seen == [True, False, True]


async def test_a_subscriber_that_raises_breaks_nothing(
    make_monitor: MonitorFactory, fake_engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    monitor = make_monitor([engine("e0", fake_engine.url)], fleet(interval=0.05))

    def broken() -> None:
        raise RuntimeError("subscriber bug")

    monitor.subscribe(broken)
    changes = Changes(monitor, "e0")
    await monitor.start()
    fake_engine.health = "503"
    await wait_for(lambda: changes.seen == [True, False], within=2.0)
    fake_engine.health = "ok"
    await wait_for(lambda: changes.seen == [True, False, True], within=3.0)
    assert "subscriber raised" in caplog.text


async def test_an_unexpected_error_in_a_probe_is_logged_and_the_loop_goes_on(
    make_monitor: MonitorFactory,
    fake_engine: FakeEngine,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = 0

    async def flaky(*args: object, **kwargs: object) -> HealthCheck:
        nonlocal calls
        calls += 1
        if calls in (2, 3):
            raise KeyError("a bug")
        return await check_health(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("narwhal.fleet.monitor.check_health", flaky)
    monitor = make_monitor([engine("e0", fake_engine.url)], fleet(interval=0.05))
    changes = Changes(monitor, "e0")
    with caplog.at_level(logging.ERROR, logger="narwhal.fleet.monitor"):
        await monitor.start()
        await wait_for(lambda: calls >= 5 and monitor.is_placeable("e0"), within=3.0)
    # Two ERROR outcomes in a row: down, then up again when the checks pass.
    assert changes.seen == [True, False, True]
    assert "health check of engine e0 raised" in caplog.text


async def test_close_leaves_no_task_behind(
    make_monitor: MonitorFactory, fake_engine: FakeEngine, closed_port: int
) -> None:
    hanging = FakeEngine()
    await hanging.start()
    hanging.health = hanging.metrics = "hang"
    try:
        monitor = make_monitor(
            [
                engine("ok", fake_engine.url),
                engine("hang", hanging.url),
                engine("gone", f"http://127.0.0.1:{closed_port}"),
            ],
            fleet(interval=0.05, timeout=5.0),
        )
        assert not fleet_tasks()
        start_task = asyncio.create_task(monitor.start())
        await asyncio.sleep(0.2)  # "hang" holds start() in its first round
        start_task.cancel()
        await asyncio.gather(start_task, return_exceptions=True)

        monitor = make_monitor(
            [engine("ok", fake_engine.url), engine("hang", hanging.url)],
            fleet(interval=0.05, timeout=0.3),
        )
        await monitor.start()
        await asyncio.sleep(0.1)  # the "hang" engine's loop is now inside a request
        assert any(t.get_name() == "fleet-probe-hang" for t in fleet_tasks())
        started = time.monotonic()
        await monitor.close()
        assert time.monotonic() - started < 0.5
        assert not fleet_tasks()
        hits = fake_engine.hits["/health"]
        await asyncio.sleep(0.2)
        assert fake_engine.hits["/health"] == hits  # no probe after close
        await monitor.close()  # idempotent
    finally:
        await hanging.stop()


async def test_close_while_start_is_in_flight(
    make_monitor: MonitorFactory, fake_engine: FakeEngine
) -> None:
    fake_engine.health = "hang"
    monitor = make_monitor([engine("hang", fake_engine.url)], fleet(interval=0.05, timeout=0.3))
    start_task = asyncio.create_task(monitor.start())
    await asyncio.sleep(0.05)
    await monitor.close()
    await start_task  # finishes its first round, then starts nothing
    assert not fleet_tasks()


async def test_subscribers_hear_when_degradation_ends_without_a_placeability_change(
    make_monitor: MonitorFactory, make_engine: Callable[[], FakeEngine]
) -> None:
    a, b = make_engine(), make_engine()
    await a.start()
    await b.start()
    a.health = "503"
    monitor = make_monitor(
        [engine("a", a.url), engine("b", b.url)], fleet(interval=0.05, timeout=0.1, stale=0.2)
    )
    await monitor.start()
    b.metrics = "500"  # b: out for monitoring; a: out for health
    await wait_for(monitor.monitoring_degraded, within=3.0)
    calls: list[bool] = []
    monitor.subscribe(lambda: calls.append(monitor.monitoring_degraded()))
    b.health = "503"  # now both are down: the fleet is down, not its monitoring
    await wait_for(lambda: calls == [False], within=3.0)
    assert not monitor.is_placeable("b")


async def test_monitoring_degraded_needs_every_engine_out_and_one_for_monitoring(
    make_monitor: MonitorFactory,
) -> None:
    monitor = make_monitor(
        [engine("a", "http://127.0.0.1:1"), engine("b", "http://127.0.0.1:2")], SLOW
    )
    a, b = monitor.health("a"), monitor.health("b")
    scrape = EngineScrape(1.0, 0.0, 0.1)
    for state in (a, b):
        state.record_health(HealthCheck.OK, 0.0)
        state.record_scrape(scrape, 0.0)
    assert not monitor.monitoring_degraded()

    a.record_scrape(MetricsFailure.TIMEOUT, 40.0)  # a: out for monitoring (stale)
    assert not monitor.is_placeable("a")
    assert not monitor.monitoring_degraded()  # b can still take work
    b.record_health(HealthCheck.UNREACHABLE, 40.0)  # b: out for health
    assert monitor.monitoring_degraded()
    a.record_health(HealthCheck.UNREACHABLE, 41.0)  # both out for health: the fleet is down
    assert not monitor.monitoring_degraded()

    assert not make_monitor([], SLOW).monitoring_degraded()  # no engines: not this reason


async def test_duplicate_engine_names_are_refused(session: aiohttp.ClientSession) -> None:
    from prometheus_client import CollectorRegistry

    with pytest.raises(ValueError, match="duplicate"):
        FleetMonitor(
            [engine("a", "http://127.0.0.1:1"), engine("a", "http://127.0.0.1:2")],
            SLOW,
            session,
            CollectorRegistry(),
        )


@pytest.mark.parametrize(
    ("version", "supplies"),
    [
        ("0.33.0", True),
        ("0.10.2rc1", True),
        ("0.10.1.1", False),  # before return_token_ids
        ("0.9.2+cu126", False),
        ("dev-build", None),  # unreadable: its requests will tell
        ("0.0.0-mock", None),  # a placeholder, not a release
    ],
)
async def test_a_vllm_too_old_for_token_ids_is_reported(
    make_monitor: MonitorFactory,
    fake_engine: FakeEngine,
    caplog: pytest.LogCaptureFixture,
    version: str,
    supplies: bool | None,
) -> None:
    fake_engine.version = version
    monitor = make_monitor([engine("e0", fake_engine.url)], SLOW)
    with caplog.at_level(logging.WARNING, logger="narwhal.fleet.monitor"):
        await monitor.start()
    # A wrong guess must not take a working engine out of placement: it is resolved to
    # be asked for no IDs (served as a generic server is), and kept placeable.
    assert monitor.is_placeable("e0")
    report = monitor.report("e0", time.monotonic())
    assert report["version"] == version and report["supplies_token_ids"] is supplies
    resolved = monitor.health("e0").capabilities
    assert resolved is not None
    assert (resolved.token_accounting == "unavailable") is (supplies is False)
    assert ("return_token_ids" in resolved.vllm_fields) is (supplies is not False)
    warned = [r.getMessage() for r in caplog.records if "sends no token IDs" in r.getMessage()]
    assert bool(warned) is (supplies is False)
    if warned:
        assert "served without token accounting" in warned[0]


async def test_only_vllm_engines_are_asked_their_version(
    make_monitor: MonitorFactory, fake_engine: FakeEngine
) -> None:
    fake_engine.version = "0.9.2"  # an openai-dialect server may have any /version
    monitor = make_monitor([engine("e0", fake_engine.url, dialect="openai")], SLOW)
    await monitor.start()
    assert monitor.is_placeable("e0")
    assert fake_engine.hits["/version"] == 0


async def test_the_version_is_read_again_when_the_engine_comes_back(
    make_monitor: MonitorFactory, fake_engine: FakeEngine
) -> None:
    fake_engine.version = "0.9.2"
    monitor = make_monitor([engine("e0", fake_engine.url)], fleet(interval=0.05))
    await monitor.start()
    assert monitor.report("e0", time.monotonic())["supplies_token_ids"] is False
    await fake_engine.stop()
    await wait_for(lambda: monitor.health("e0").status == "down", within=5.0)
    fake_engine.version = "0.33.0"  # upgraded while it was down
    await fake_engine.start()
    await wait_for(lambda: monitor.health("e0").version == "0.33.0", within=5.0)
    assert monitor.report("e0", time.monotonic())["supplies_token_ids"] is True
    resolved = monitor.health("e0").capabilities
    assert resolved is not None and resolved.token_accounting == "token_ids"
    await monitor.close()


async def test_an_engine_added_while_running_is_placeable_once_probed(
    make_monitor: MonitorFactory, make_engine: Callable[[], FakeEngine], closed_port: int
) -> None:
    first, second = make_engine(), make_engine()
    await first.start()
    await second.start()
    registry = CollectorRegistry(auto_describe=True)
    monitor = make_monitor([engine("e0", first.url)], SLOW, registry=registry)
    await monitor.start()
    changes = Changes(monitor, "e1")
    state = monitor.add(engine("e1", second.url))
    assert not monitor.is_placeable("e1")  # not before its first round has passed
    assert state is monitor.health("e1")
    await wait_for(lambda: monitor.is_placeable("e1"), within=3.0)
    assert changes.seen == [True]  # announced, so waiting requests look again
    # Its series exist as the others' do.
    assert registry.get_sample_value("narwhal_engine_up", {"engine": "e1"}) == 1.0
    # An engine that cannot be reached is added too, and stays out.
    monitor.add(engine("gone", f"http://127.0.0.1:{closed_port}"))
    await wait_for(lambda: monitor.report("gone", time.monotonic())["health"] == "down", 3.0)
    assert not monitor.is_placeable("gone")
    with pytest.raises(ValueError, match="duplicate"):
        monitor.add(engine("e1", second.url))


async def test_an_engine_removed_is_probed_no_more(
    make_monitor: MonitorFactory, make_engine: Callable[[], FakeEngine]
) -> None:
    kept, removed = make_engine(), make_engine()
    await kept.start()
    await removed.start()
    registry = CollectorRegistry(auto_describe=True)
    monitor = make_monitor(
        [engine("kept", kept.url), engine("removed", removed.url)],
        fleet(interval=0.05),
        registry=registry,
    )
    await monitor.start()
    monitor.remove("removed")
    await asyncio.sleep(0)  # the probe task's cancellation lands
    hits = removed.hits["/health"]
    kept_hits = kept.hits["/health"]
    await wait_for(lambda: kept.hits["/health"] >= kept_hits + 3, within=3.0)
    assert removed.hits["/health"] == hits
    assert registry.get_sample_value("narwhal_engine_up", {"engine": "removed"}) is None
    assert not any(t.get_name() == "fleet-probe-removed" for t in fleet_tasks())
    assert monitor.is_placeable("kept")


async def test_an_engine_updated_in_place_is_probed_with_its_new_key(
    make_monitor: MonitorFactory, fake_engine: FakeEngine
) -> None:
    monitor = make_monitor([engine("e0", fake_engine.url)], fleet(interval=0.05))
    await monitor.start()
    assert fake_engine.authorization is None
    monitor.update(EngineConfig(name="e0", url=fake_engine.url, api_key="sk-new"))
    await wait_for(lambda: fake_engine.authorization == "Bearer sk-new", within=3.0)
    assert monitor.is_placeable("e0")  # its state is kept: still up
