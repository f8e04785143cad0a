"""A bounded soak: mixed traffic, hostile clients and engine restarts, then the books.

Used by `tests/e2e/test_soak.py` (60 s in CI) and `scripts/perf/soak.py` (10 minutes,
with a report). Two `narwhal sim` engines on fixed loopback ports (so one can be killed
and started again where the router expects it) sit behind one `narwhal serve` in its
default predictive mode. Workers send streaming and non-streaming requests; some clients
disconnect after the first event, some read slowly, some give up before the answer. A
few times during the run an engine is killed and restarted. Meanwhile the router's RSS,
open file descriptors and asyncio tasks are sampled.

At the end, once the router is quiescent, `check()` asserts what a production router
owes: every request counted once (offered equals the sum of outcomes), no slot, queue
place or retained request left, no task, connection or descriptor leaked, RSS flat after
warm-up, and no request both served to its client and counted as failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.metrics_text import samples
from tests.processes import NarwhalProcess, router_process

MODEL = "narwhal-sim"
FAILED_OUTCOMES = ("upstream_error", "internal_error", "expired", "unavailable", "invalid")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RestartableSim:
    """A `narwhal sim` on a fixed port, killed and started again at will."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "narwhal", "sim", "--port", str(self.port), "--model", MODEL],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            time.sleep(0.05)
        raise RuntimeError("the sim did not start")

    def kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class Sample:
    at: float
    rss_mib: float
    fds: int
    tasks: float


@dataclass
class SoakReport:
    duration_s: float
    sent: int = 0
    client: Counter[str] = field(default_factory=Counter)  # served / disconnected / status:N
    restarts: int = 0
    samples: list[Sample] = field(default_factory=list)
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    idle_tasks: float = 0.0

    def outcomes(self) -> dict[str, int]:
        prefix = 'narwhal_outcomes_total{outcome="'
        return {
            k[len(prefix) : -2]: int(v - self.before.get(k, 0.0))
            for k, v in self.after.items()
            if k.startswith(prefix)
        }

    def offered(self) -> int:
        return int(self.after["narwhal_offered_total"] - self.before["narwhal_offered_total"])

    def warm(self) -> list[Sample]:
        """The samples after warm-up (the first quarter of the run)."""
        start = self.samples[0].at if self.samples else 0.0
        return [s for s in self.samples if s.at - start >= self.duration_s / 4]

    def summary(self) -> dict[str, Any]:
        warm = self.warm()
        return {
            "duration_s": self.duration_s,
            "sent": self.sent,
            "client": dict(self.client),
            "offered": self.offered(),
            "outcomes": self.outcomes(),
            "restarts": self.restarts,
            "rss_mib_after_warmup": [round(warm[0].rss_mib, 1), round(warm[-1].rss_mib, 1)]
            if warm
            else None,
            "rss_mib_max": round(max(s.rss_mib for s in self.samples), 1),
            "fds": [self.samples[0].fds, max(s.fds for s in self.samples), self.samples[-1].fds],
            "tasks_idle_before_after": [self.idle_tasks, self.after["narwhal_event_loop_tasks"]],
            "loop_lag_p99_s": _histogram_quantile(
                self.after, "narwhal_event_loop_lag_seconds", 0.99
            ),
        }

    def check(self) -> None:
        """What must hold after any soak."""
        after, outcomes = self.after, self.outcomes()
        offered = self.offered()
        assert offered == sum(outcomes.values()), (offered, outcomes)
        gave_up = self.client["gave_up"]
        assert self.sent - gave_up <= offered <= self.sent, (self.sent, gave_up, offered)
        for gauge in (
            "narwhal_retained_requests",
            "narwhal_admission_queue_depth",
            "narwhal_prefill_slots_in_use",
            "narwhal_decode_slots_in_use",
        ):
            assert after[gauge] == 0, (gauge, after[gauge])
        assert outcomes.get("internal_error", 0) == 0
        assert outcomes.get("invalid", 0) == 0
        served, dropped = self.client["served"], self.client["disconnected"] + gave_up
        # Served to its client means completed at the router: never also counted failed.
        assert served <= outcomes.get("completed", 0) <= served + dropped, (self.client, outcomes)
        refused_by_client = sum(v for k, v in self.client.items() if k.startswith("status:"))
        refused_by_client += self.client["broken_stream"]  # an error event after headers
        failed = sum(outcomes.get(o, 0) for o in FAILED_OUTCOMES)
        failed += outcomes.get("rejected", 0) + outcomes.get("refused", 0)
        assert failed <= refused_by_client + dropped, (self.client, outcomes)
        # Nothing leaked: tasks back to idle, descriptors and memory flat after warm-up.
        assert after["narwhal_event_loop_tasks"] <= self.idle_tasks + 3, self.summary()
        warm = self.warm()
        assert warm, "no sample after warm-up"
        assert warm[-1].fds <= max(s.fds for s in warm[: max(1, len(warm) // 4)]) + 10
        assert warm[-1].rss_mib <= warm[0].rss_mib * 1.15 + 10, self.summary()


def _histogram_quantile(metrics: dict[str, float], name: str, q: float) -> float | None:
    buckets = sorted(
        (float(k.split('le="')[1].split('"')[0]), v)
        for k, v in metrics.items()
        if k.startswith(name + "_bucket")
    )
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    for bound, count in buckets:
        if count >= q * total:
            return bound
    return None


@contextmanager
def soak_fleet() -> Iterator[tuple[NarwhalProcess, list[RestartableSim]]]:
    sims = [RestartableSim(), RestartableSim()]
    with ExitStack() as stack:
        for sim in sims:
            sim.start()
            stack.callback(sim.kill)
        config = {
            "model": MODEL,
            "engines": [
                {"name": f"e{i}", "url": sim.url, "role": "both"} for i, sim in enumerate(sims)
            ],
            "fleet": {"probe_interval_s": 0.5, "stale_after_s": 2},
        }
        router = stack.enter_context(router_process(config))
        yield router, sims


async def _metrics(url: str) -> dict[str, float]:
    """A scrape on a connection of its own, closed after: the traffic's connections (and
    the router's task per open connection) do not enter the idle count."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.get(url + "/metrics") as response:
            return samples(await response.text())


async def _one(
    session: aiohttp.ClientSession, url: str, rng: random.Random, report: SoakReport
) -> None:
    kind = rng.choices(["stream", "whole", "disconnect", "slow", "give_up"], [45, 25, 10, 10, 10])[
        0
    ]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"soak {rng.random()}"}],
        "max_tokens": rng.randint(1, 48),
        "stream": kind != "whole",
    }
    timeout = aiohttp.ClientTimeout(total=0.02 if kind == "give_up" else 60)
    report.sent += 1
    try:
        async with session.post(
            url + "/v1/chat/completions",
            data=json.dumps(body),
            timeout=timeout,
            headers={"Content-Type": "application/json"},
        ) as response:
            if response.status != 200:
                payload = await response.json()
                assert set(payload["error"]) >= {"message", "type", "code"}, payload
                report.client[f"status:{response.status}"] += 1
                return
            if kind == "whole":
                json.loads(await response.read())
                report.client["served"] += 1
                return
            raw = b""
            async for chunk in response.content.iter_any():
                raw += chunk
                if kind == "disconnect":
                    report.client["disconnected"] += 1
                    response.close()
                    return
                if kind == "slow":
                    await asyncio.sleep(0.02)
            if raw.rstrip().endswith(b"data: [DONE]"):
                report.client["served"] += 1
            else:
                report.client["broken_stream"] += 1  # an error event after headers
    except (TimeoutError, aiohttp.ClientError):
        report.client["gave_up" if kind == "give_up" else "client_error"] += 1


async def run_soak(
    router: NarwhalProcess,
    sims: list[RestartableSim],
    duration_s: float,
    concurrency: int = 24,
    restarts: int = 3,
    seed: int = 0,
) -> SoakReport:
    report = SoakReport(duration_s)
    url = router.url
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + 30  # profiled and placeable before traffic
        while time.monotonic() < deadline:
            async with session.get(url + "/ready") as response:
                if response.status == 200:
                    break
            await asyncio.sleep(0.1)
        report.before = await _metrics(url)
        report.idle_tasks = report.before["narwhal_event_loop_tasks"]
        stop_at = time.monotonic() + duration_s

        async def worker(index: int) -> None:
            local = random.Random(seed * 1000 + index)
            while time.monotonic() < stop_at:
                await _one(session, url, local, report)

        async def sampler() -> None:
            while time.monotonic() < stop_at:
                metrics = await _metrics(url)
                report.samples.append(
                    Sample(
                        time.monotonic(),
                        rss_mib(router.pid),
                        open_fds(router.pid),
                        metrics["narwhal_event_loop_tasks"],
                    )
                )
                await asyncio.sleep(0.5)

        async def restarter() -> None:
            for i in range(restarts):
                await asyncio.sleep(duration_s / (restarts + 1))
                sim = sims[i % len(sims)]
                await asyncio.to_thread(sim.kill)
                await asyncio.sleep(0.5)
                await asyncio.to_thread(sim.start)
                report.restarts += 1

        await asyncio.gather(*(worker(i) for i in range(concurrency)), sampler(), restarter())
    # The traffic's connections are closed now: whatever the router still holds must
    # drain to nothing.
    deadline = time.monotonic() + 15
    while True:
        report.after = await _metrics(url)
        held = sum(
            report.after[g] for g in ("narwhal_retained_requests", "narwhal_admission_queue_depth")
        )
        if held == 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # let closed connections' tasks finish
    report.after = await _metrics(url)
    report.samples.append(
        Sample(
            time.monotonic(),
            rss_mib(router.pid),
            open_fds(router.pid),
            report.after["narwhal_event_loop_tasks"],
        )
    )
    return report
