"""High availability against a real etcd: one active router, standbys, fencing, failover.

Every router here is a real `narwhal serve` process and etcd a real etcd on loopback.
The safety property is checked where it matters: the engine (a `narwhal sim` that logs
every request's arrival on the host's monotonic clock) must never receive requests from
two routers interleaved, and no sample of every router's /ready may show two admitting.
The liveness property is the takeover bound: a standby serves within lease TTL + one
renewal interval of the leader's death, pause or partition.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.conftest import MODEL
from tests.etcd_server import EtcdServer, etcd_server
from tests.faultproxy import FaultProxy, fault_proxy
from tests.metrics_text import samples
from tests.processes import NarwhalProcess, narwhal_process, router_process

TTL = 2
RENEW = TTL / 3
BOUND = TTL + RENEW  # the takeover bound the issue sets
POLL = 0.02


# --- plain HTTP, from threads --------------------------------------------------------------


def get(url: str, timeout: float = 1.0) -> tuple[int, dict[str, Any], dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), dict(e.headers)


def post(
    url: str, body: dict[str, Any], timeout: float = 5.0, request_id: str | None = None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    headers = {"Content-Type": "application/json"}
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), dict(e.headers)


def ready(router: NarwhalProcess) -> dict[str, Any] | None:
    """The router's /ready body, or None when it does not answer (dead or paused)."""
    try:
        return get(router.url + "/ready", timeout=0.3)[1]
    except OSError:
        return None


def wait_until(predicate: Callable[[], bool], within: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < within:
        if predicate():
            return time.monotonic() - started
        time.sleep(POLL)
    raise AssertionError(f"not within {within} s: {what}")


def chat(max_tokens: int = 2) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
    }


# --- the fleet -------------------------------------------------------------------------------


def ha_config(engine_url: str, etcd_url: str, key: str, **ha: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "engines": [{"name": "e0", "url": engine_url, "role": "both"}],
        "admission": {"mode": "open"},
        "ha": {"backend": "etcd", "endpoints": [etcd_url], "key": key, "lease_ttl_s": TTL, **ha},
    }


@dataclass
class Fleet:
    """etcd, one sim engine logging arrivals, and routers started and killed at will."""

    etcd: EtcdServer
    engine: NarwhalProcess
    arrivals: Path
    stack: ExitStack
    key: str
    routers: dict[str, NarwhalProcess] = field(default_factory=dict)
    proxies: dict[str, FaultProxy] = field(default_factory=dict)

    def start_router(
        self,
        name: str,
        via_proxy: bool = False,
        admission: dict[str, Any] | None = None,
        serving: dict[str, Any] | None = None,
        **ha: Any,
    ) -> NarwhalProcess:
        etcd_url = self.etcd.url
        if via_proxy:
            proxy = self.stack.enter_context(fault_proxy("127.0.0.1", self.etcd.client_port))
            self.proxies[name] = proxy
            etcd_url = proxy.url
        config = ha_config(self.engine.url, etcd_url, self.key, id=name, **ha)
        config["admission"].update(admission or {})
        if serving is not None:
            config["serving"] = serving
        router = self.stack.enter_context(router_process(config))
        self.routers[name] = router
        return router

    def active(self) -> list[str]:
        return [n for n, r in self.routers.items() if (ready(r) or {}).get("ready") is True]

    def wait_for_one_active(self, within: float = 10.0) -> str:
        wait_until(lambda: len(self.active()) == 1, within, "one active router")
        (name,) = self.active()
        return name

    def kill(self, name: str) -> None:
        self.routers[name].proc.kill()
        self.routers[name].proc.wait()
        del self.routers[name]

    def arrivals_by_router(self) -> list[tuple[float, str]]:
        """(monotonic time, router) for every completion the engine received, in order."""
        out = []
        for line in self.arrivals.read_text().splitlines():
            at, request_id = line.split()
            router = request_id.split("-")[0]
            out.append((float(at), router))
        return sorted(out)


@contextmanager
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    arrivals = tmp_path / "arrivals.log"
    arrivals.touch()
    with ExitStack() as stack:
        etcd = stack.enter_context(etcd_server())
        engine = stack.enter_context(
            narwhal_process(
                ["sim", "--port", "0", "--model", MODEL, "--arrival-log", str(arrivals)]
            )
        )
        yield Fleet(etcd, engine, arrivals, stack, key=f"/test/{os.getpid()}/leader")


class Sampler:
    """Polls every router's /ready and sends each a completion every POLL seconds, from a
    thread; the request ids name the router, so the engine's arrival log says who sent."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ids = itertools.count()
        self.rounds: list[dict[str, bool]] = []  # per round: router -> answered ready
        self.completed: dict[str, int] = {}
        self.refused: dict[str, int] = {}

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            round_: dict[str, bool] = {}
            for name, router in list(self._fleet.routers.items()):
                body = ready(router)
                round_[name] = body is not None and body.get("ready") is True
            self.rounds.append(round_)
            for name, router in list(self._fleet.routers.items()):
                self._complete(name, router)
            time.sleep(POLL)

    def _complete(self, name: str, router: NarwhalProcess) -> None:
        try:
            status, body, headers = post(
                router.url + "/v1/chat/completions",
                chat(),
                timeout=0.5,
                request_id=f"{name}-{next(self._ids)}",
            )
        except OSError:
            return
        if status == 200:
            self.completed[name] = self.completed.get(name, 0) + 1
        else:
            assert status == 503, (status, body)
            assert body["error"]["code"] == "router_unavailable"
            assert headers.get("Retry-After") == "1"
            self.refused[name] = self.refused.get(name, 0) + 1

    def assert_never_two_admitting(self) -> None:
        both = [r for r in self.rounds if sum(r.values()) > 1]
        assert not both, f"two routers answered ready in one sample round: {both[:3]}"


def runs(arrivals: list[tuple[float, str]]) -> list[str]:
    """The routers in the order the engine heard from them, consecutive repeats merged."""
    return [router for router, _ in itertools.groupby(router for _, router in arrivals)]


# --- the tests -------------------------------------------------------------------------------


def test_one_router_is_active_and_the_others_refuse_as_standby(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        for name in ("a", "b", "c"):
            f.start_router(name)
        leader = f.wait_for_one_active()
        body = ready(f.routers[leader])
        assert body is not None and isinstance(body["revision"], int) and body["revision"] > 0
        assert body["role"] == "active"
        for name, router in f.routers.items():
            if name == leader:
                status, _, _ = post(router.url + "/v1/chat/completions", chat())
                assert status == 200
                continue
            assert get(router.url + "/ready")[:2] == (503, {"ready": False, "reason": "standby"})
            status, body, headers = post(router.url + "/v1/chat/completions", chat())
            assert status == 503 and body["error"]["code"] == "router_unavailable"
            assert headers["Retry-After"] == "1"
            metrics = samples(urllib.request.urlopen(router.url + "/metrics").read().decode())
            assert metrics['narwhal_router_state{state="standby"}'] == 1
            assert metrics['narwhal_outcomes_total{outcome="unavailable"}'] == 1
            assert metrics["narwhal_offered_total"] == 1
        metrics = samples(
            urllib.request.urlopen(f.routers[leader].url + "/metrics").read().decode()
        )
        assert metrics['narwhal_router_state{state="active"}'] == 1
        assert metrics["narwhal_router_leadership_revision"] == body_revision(f, leader)


def body_revision(f: Fleet, name: str) -> int:
    body = ready(f.routers[name])
    assert body is not None
    return int(body["revision"])


def test_repeated_failovers_never_admit_on_two_routers_and_stay_within_the_bound(
    tmp_path: Path,
) -> None:
    """Kill the leader, and pause one past the TTL, over and over, with traffic to all."""
    with fleet(tmp_path) as f:
        for name in ("r0", "r1", "r2"):
            f.start_router(name)
        leader = f.wait_for_one_active()
        spare = itertools.count(3)
        takeovers: list[float] = []
        with Sampler(f) as sampler:
            for round_ in range(6):
                time.sleep(0.3)
                old = f.routers[leader]
                paused = round_ % 2 == 1
                started = time.monotonic()
                if paused:
                    os.kill(old.pid, signal.SIGSTOP)
                else:
                    f.kill(leader)
                others = [r for n, r in f.routers.items() if n != leader]
                wait_until(
                    lambda others=others: any((ready(r) or {}).get("ready") for r in others),
                    within=BOUND + 2,
                    what="a standby takes over",
                )
                takeovers.append(time.monotonic() - started)
                if paused:
                    time.sleep(0.2)
                    os.kill(old.pid, signal.SIGCONT)
                    # Its first word after the pause is a refusal, never "ready".
                    body = ready(old)
                    assert body is not None and body["ready"] is False, body
                    assert body["reason"] in ("fenced", "standby")
                else:
                    f.start_router(f"r{next(spare)}")  # keep three routers
                leader = f.wait_for_one_active()
            time.sleep(0.3)
        sampler.assert_never_two_admitting()
        order = runs(f.arrivals_by_router())
        # One run of arrivals per leadership (a paused leader's requests in flight at the
        # pause may land after the takeover, as one more run of its own, at most).
        assert len(order) <= 1 + 6 + 3, order
        for a, b in itertools.pairwise(order):
            assert a != b
        assert sum(sampler.completed.values()) > 20
        assert sum(sampler.refused.values()) > 20
        worst = max(takeovers)
        print(f"takeovers (s): {', '.join(f'{t:.2f}' for t in takeovers)}; bound {BOUND:.2f}")
        assert worst <= BOUND + 0.1, f"takeovers {takeovers}, bound {BOUND:.2f} s"


def test_a_leader_stopped_by_sigterm_hands_over_at_once(tmp_path: Path) -> None:
    """Shutdown revokes the lease: the standby need not wait for the TTL."""
    with fleet(tmp_path) as f:
        for name in ("a", "b"):
            f.start_router(name)
        leader = f.wait_for_one_active()
        standby = f.routers[next(n for n in f.routers if n != leader)]
        started = time.monotonic()
        f.routers[leader].proc.send_signal(signal.SIGTERM)
        wait_until(lambda: (ready(standby) or {}).get("ready") is True, TTL, "handover")
        assert time.monotonic() - started < TTL / 2


def test_a_leader_cut_off_from_etcd_fences_before_a_standby_can_win(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        for name in ("a", "b"):
            f.start_router(name, via_proxy=True)
        leader = f.wait_for_one_active()
        standby = next(n for n in f.routers if n != leader)
        old, new = f.routers[leader], f.routers[standby]
        cut = time.monotonic()
        f.proxies[leader].blackhole()
        fenced_after = wait_until(
            lambda: (ready(old) or {}).get("reason") == "fenced", BOUND, "the leader fences"
        )
        took_over_after = wait_until(
            lambda: (ready(new) or {}).get("ready") is True, BOUND + 1, "the standby wins"
        )
        took_over_after += fenced_after
        # Fenced before the lease (TTL from its last confirmed renewal) could have expired.
        assert fenced_after < TTL
        assert time.monotonic() - cut <= BOUND + 0.2
        assert took_over_after > fenced_after
        status, body, _ = post(old.url + "/v1/chat/completions", chat())
        assert status == 503 and body["error"]["code"] == "router_unavailable"
        # Healed, the old leader learns the key is another's and stays a standby.
        f.proxies[leader].heal()
        wait_until(
            lambda: (ready(old) or {}).get("reason") == "standby", BOUND + 2, "back to standby"
        )
        assert f.active() == [standby]


def test_losing_etcd_fences_every_router_and_they_recover_by_themselves(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        for name in ("a", "b"):
            f.start_router(name)
        f.wait_for_one_active()
        f.etcd.stop()
        wait_until(
            lambda: all((ready(r) or {}).get("reason") == "fenced" for r in f.routers.values()),
            BOUND + 2,
            "every router fenced",
        )
        for router in f.routers.values():
            status, body, _ = post(router.url + "/v1/chat/completions", chat())
            assert status == 503 and body["error"]["code"] == "router_unavailable"
        f.etcd.start()
        leader = f.wait_for_one_active(within=BOUND + 10)
        status, _, _ = post(f.routers[leader].url + "/v1/chat/completions", chat())
        assert status == 200


def test_fencing_stops_admission_in_every_relay_worker(tmp_path: Path) -> None:
    """With `serving.workers: 2` the decision process holds the lease: fenced, it refuses
    every offer, whichever worker takes the connection (each request here is a new
    connection, which the kernel spreads over the workers)."""
    with fleet(tmp_path) as f:
        router = f.start_router("a", serving={"workers": 2})
        f.wait_for_one_active()
        ids = set()
        for _ in range(12):
            status, _, headers = post(router.url + "/v1/chat/completions", chat())
            assert status == 200
            ids.add(headers["X-Request-Id"][:16])  # a process's own prefix
        assert len(ids) == 2, "both workers answered"
        f.etcd.stop()
        wait_until(lambda: (ready(router) or {}).get("reason") == "fenced", BOUND + 2, "fenced")
        refused = set()
        for _ in range(12):
            status, body, headers = post(router.url + "/v1/chat/completions", chat())
            assert status == 503 and body["error"]["code"] == "router_unavailable"
            refused.add(headers["X-Request-Id"][:16])
        assert len(refused) == 2, "both workers refused"
        f.etcd.start()
        f.wait_for_one_active(within=BOUND + 10)
        status, _, _ = post(router.url + "/v1/chat/completions", chat())
        assert status == 200


def test_drains_and_maintenance_survive_a_failover(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        for name in ("a", "b"):
            f.start_router(name)
        leader = f.wait_for_one_active()
        url = f.routers[leader].url
        status, body, _ = post(url + "/admin/engines/e0/drain", {})
        assert (status, body) == (200, {"name": "e0", "drained": True})
        f.kill(leader)
        (leader,) = f.routers
        # The new leader drains e0 too, so it has nowhere to place: not ready, for that.
        wait_until(
            lambda: (ready(f.routers[leader]) or {}).get("reason") == "no_engines",
            BOUND + 2,
            "the standby leads, with e0 drained",
        )
        engines = get(f.routers[leader].url + "/admin/engines")[1]["engines"]
        assert [(e["name"], e["state"]) for e in engines] == [("e0", "drained")]
        status, body, _ = post(f.routers[leader].url + "/admin/engines/e0/undrain", {})
        assert status == 200
        status, _, _ = post(f.routers[leader].url + "/v1/chat/completions", chat())
        assert status == 200


def test_a_request_queued_when_the_lease_is_lost_gets_the_503_and_in_flight_work_finishes(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path) as f:
        leader_proc = f.start_router(
            "a",
            via_proxy=True,
            admission={"phase_concurrency": {"prefill": 1}, "wait_timeout_s": 10},
        )
        f.wait_for_one_active()
        # Hold the router's one prefill slot with a slow request, queue a second one.
        results: dict[str, tuple[int, dict[str, Any], dict[str, str]]] = {}

        def send(tag: str, body: dict[str, Any]) -> None:
            results[tag] = post(leader_proc.url + "/v1/chat/completions", body, timeout=20)

        slow = chat(max_tokens=3)
        slow["messages"][0]["content"] = "#sim:slow_prefill=2.5 hi"

        def gauge(name: str) -> float:
            page = urllib.request.urlopen(leader_proc.url + "/metrics").read().decode()
            return samples(page)[name]

        # Each step waits (bounded) for the state the next one needs, not for a time: on
        # a loaded machine the slow request may take longer than any fixed pause to land.
        threads = [threading.Thread(target=send, args=("slow", slow))]
        threads[0].start()
        wait_until(
            lambda: gauge("narwhal_prefill_slots_in_use") == 1,
            within=10,
            what="the slow request holds the prefill slot",
        )
        threads.append(threading.Thread(target=send, args=("queued", chat())))
        threads[1].start()
        wait_until(
            lambda: gauge("narwhal_admission_queue_depth") == 1,
            within=10,
            what="the second request waits in the queue",
        )
        f.proxies["a"].blackhole()
        for thread in threads:
            thread.join(20)
        assert results["queued"][0] == 503, results["queued"]
        assert results["queued"][1]["error"]["code"] == "router_unavailable"
        assert results["slow"][0] == 200, results["slow"]
        metrics = samples(urllib.request.urlopen(leader_proc.url + "/metrics").read().decode())
        assert metrics['narwhal_outcomes_total{outcome="unavailable"}'] == 1
        assert metrics['narwhal_outcomes_total{outcome="completed"}'] == 1
        assert metrics["narwhal_offered_total"] == 2
        assert metrics["narwhal_admission_queue_depth"] == 0


def test_without_high_availability_the_router_is_always_active() -> None:
    with narwhal_process(["sim", "--port", "0", "--model", MODEL]) as engine:
        config = {
            "model": MODEL,
            "engines": [{"name": "e0", "url": engine.url, "role": "both"}],
            "admission": {"mode": "open"},
            "ha": {"backend": "none"},
        }
        with router_process(config) as router:
            wait_until(lambda: (ready(router) or {}).get("ready") is True, 10, "ready")
            assert ready(router) == {"ready": True, "role": "active", "revision": None}
