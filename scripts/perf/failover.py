"""Failover: how long a standby Narwhal takes to serve once the active one is lost.

One etcd (a real one from `tests/etcd_server.py`: heartbeat 50 ms, election timeout
250 ms, temporary data directory), one `narwhal sim`, and three `narwhal serve` routers
with `ha.backend: etcd` campaigning for one leader key (unique to the run and the TTL).
Each router reaches etcd through its own `tests/faultproxy.py` proxy, so one router can
be cut off from etcd alone. For every TTL in --ttls (renewal interval and fencing margin
at their defaults, max(ttl/3, 0.6 s) and max(0.1, ttl/10)) and every fault, --rounds failovers:

- kill: SIGKILL the leader (no resignation: its lease must expire); once a standby
  serves, a replacement router is started, so there are always three.
- pause: SIGSTOP the leader; once a standby serves, and the leader has been stopped for
  more than the TTL (a takeover may come sooner: the lease counts from the last renewal,
  before the SIGSTOP), a GET /ready is sent to the stopped router, then it gets SIGCONT.
  Every answer it gives to a request sent after the SIGSTOP (that one first) must be
  "not ready": a violation otherwise.
- partition: blackhole the leader's proxy (connections stay open, nothing flows); once a
  standby serves, heal it. The old leader's first "fenced" answer is timed too.

Takeover time: from the monotonic clock read just before the signal or the blackhole, to
the arrival of the first 200 from a standby's GET /ready. Every router is polled every
10 ms from a thread of its own (one kept-alive connection), so one slow or stopped router
never delays the others' polls; the figure includes up to one poll interval. The bound
is the issue's: lease TTL + one renewal interval. Meanwhile a sampler sends GET /ready to
all routers at once every 20 ms (100 ms timeout); a sample round in which two routers
answer ready counts as two-active (must be 0). The script also watches the leader key
itself, so each takeover splits into fault -> etcd deletes the key (lease expiry) and
deletion -> a standby serves (watch, campaign, operator state, first poll).

Before the failovers, "etcd expiry lag" measures etcd alone: leases of each TTL, granted
53 ms apart with a key each and never renewed; how long after grant + TTL etcd deletes
the key. etcd's lessor looks for expired leases every 500 ms, so the lag runs from ~0 to
~0.5 s: a takeover would overshoot TTL + renewal interval if that interval were below
~0.5 s, which is why narwhal renews no more often than every 0.6 s (at TTL 1, ttl/3
would be 0.33 s).

Between rounds the script waits until exactly one router is active and the others are
standbys again, then 0.5 s plus a random 0 to TTL s (seeded by --seed). Without that
jitter the rounds would sample one phase only: a leader wins just after one of the
lessor's passes (the one that deleted the old key) and renews at one interval from then on, so
its renewals, and hence its lease's expiry, keep one phase against those 500 ms passes,
which repeats every TTL.

    python scripts/perf/failover.py [--ttls 1,2,3] [--rounds 8] [--renew-interval S]
                                    [--seed 0] [--json OUT] [--quick]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import itertools
import json
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import harness
from harness import HOST, MODEL, EngineSpec, Processes, Server, fmt, median, table

from narwhal.config import HAConfig

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.etcd_server import EtcdServer  # noqa: E402
from tests.faultproxy import FaultProxy  # noqa: E402

FAULTS = ("kill", "pause", "partition")
ROUTERS = 3
POLL_S = 0.01  # each router's /ready poller
POLL_TIMEOUT_S = 0.5
SAMPLE_EVERY_S = 0.02  # the all-routers sample rounds
SAMPLE_TIMEOUT_S = 0.1
SETTLE_S = 0.5  # between rounds, after one router is active and the others standbys (+ jitter)
STEADY_TIMEOUT_S = 30.0
TAKEOVER_GRACE_S = 5.0  # give up on a takeover at bound + this
LAG_LEASES = 10  # expiry-lag calibration: leases per TTL
LAG_SPACING_S = 0.053


# --- HTTP: /ready and etcd's JSON gateway -------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One GET /ready: when it was sent and answered, and what it said."""

    sent: float
    received: float
    status: int | None  # None: no answer (refused, reset, timed out)
    reason: str | None  # "active" for a 200, else the body's reason

    @property
    def ready(self) -> bool:
        return self.status == 200


class ReadyClient:
    """GET /ready over one kept-alive connection, reopened after any failure."""

    def __init__(self, url: str, timeout_s: float) -> None:
        parts = urlsplit(url)
        self._host, self._port = parts.hostname or HOST, parts.port or 80
        self._timeout = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def get(self) -> Answer:
        sent = time.monotonic()
        try:
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, self._timeout)
            conn = self._conn
            conn.request("GET", "/ready")
            response = conn.getresponse()
            body = response.read()
            status = response.status
            reason = "active" if status == 200 else str(json.loads(body).get("reason"))
        except (OSError, http.client.HTTPException, ValueError):
            self.close()
            return Answer(sent, time.monotonic(), None, None)
        return Answer(sent, time.monotonic(), status, reason)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def etcd_call(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def etcd_version(url: str) -> str:
    try:
        return str(json.loads(harness.http_get_text(url + "/version"))["etcdserver"])
    except (OSError, ValueError, KeyError):
        return "unknown"


@dataclass(frozen=True)
class KeyEvent:
    at: float  # monotonic time the event reached this script
    kind: str  # PUT | DELETE
    key: str


class KeyWatch:
    """etcd's watch on a key or a prefix, every event stamped with its arrival time."""

    def __init__(self, etcd_url: str, key: str, prefix: bool = False) -> None:
        parts = urlsplit(etcd_url)
        self._conn = http.client.HTTPConnection(parts.hostname or HOST, parts.port or 80)
        request: dict[str, Any] = {"key": _b64(key)}
        if prefix:  # keys under `key`: up to the key with its last byte incremented
            request["range_end"] = _b64(key[:-1] + chr(ord(key[-1]) + 1))
        self._conn.request("POST", "/v3/watch", json.dumps({"create_request": request}))
        self._response = self._conn.getresponse()
        self.events: list[KeyEvent] = []
        self._created = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._created.wait(5):
            self.close()
            raise RuntimeError(f"etcd did not confirm the watch on {key}")

    def _run(self) -> None:
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
            while line := self._response.readline():
                at = time.monotonic()
                result = json.loads(line).get("result", {})
                if result.get("created"):
                    self._created.set()
                for event in result.get("events", []):
                    key = base64.b64decode(event.get("kv", {}).get("key", "")).decode()
                    self.events.append(KeyEvent(at, event.get("type", "PUT"), key))

    def first(self, kind: str, after: float, key: str | None = None) -> KeyEvent | None:
        for event in list(self.events):
            if event.at >= after and event.kind == kind and key in (None, event.key):
                return event
        return None

    def close(self) -> None:
        # Shut the socket down under the reader (it sees the end of the stream), then close.
        with contextlib.suppress(OSError):
            if self._conn.sock is not None:
                self._conn.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)
        self._conn.close()


# --- etcd alone: how late after its TTL a lease's key goes ----------------------------------


def expiry_lag(etcd_url: str, ttl: int, leases: int) -> list[float]:
    """Seconds from grant + TTL (the grant's answer) to the key's deletion, per lease."""
    prefix = f"/narwhal-perf/lag-{os.getpid()}-{ttl}/"
    watch = KeyWatch(etcd_url, prefix, prefix=True)
    try:
        expires: dict[str, float] = {}
        for i in range(leases):
            grant = etcd_call(etcd_url, "/v3/lease/grant", {"TTL": ttl})
            expires[f"{prefix}{i}"] = time.monotonic() + int(grant["TTL"])
            body = {"key": _b64(f"{prefix}{i}"), "value": _b64("x"), "lease": grant["ID"]}
            etcd_call(etcd_url, "/v3/kv/put", body)
            time.sleep(LAG_SPACING_S)
        deadline = max(expires.values()) + 3.0
        while time.monotonic() < deadline:
            deleted = {e.key for e in watch.events if e.kind == "DELETE"}
            if deleted >= expires.keys():
                break
            time.sleep(0.05)
        lags = []
        for key, expiry in expires.items():
            event = watch.first("DELETE", 0.0, key)
            lags.append(event.at - expiry if event is not None else float("nan"))
        return lags
    finally:
        watch.close()


# --- watching the routers during a failover --------------------------------------------------


class Poller:
    """GET /ready of one router every POLL_S from a thread of its own; every answer kept."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.answers: list[Answer] = []
        self._client = ReadyClient(url, POLL_TIMEOUT_S)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"poll-{name}")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            answer = self._client.get()
            self.answers.append(answer)
            self._stop.wait(max(0.0, answer.sent + POLL_S - time.monotonic()))
        self._client.close()

    def first(self, predicate: Callable[[Answer], bool], sent_after: float) -> Answer | None:
        """The earliest-received answer to a request sent after `sent_after` that matches."""
        found = [a for a in list(self.answers) if a.sent >= sent_after and predicate(a)]
        return min(found, key=lambda a: a.received, default=None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(POLL_TIMEOUT_S * 3 + 1)


class Sampler:
    """Every SAMPLE_EVERY_S, GET /ready of every router at once; one round per sample."""

    def __init__(self, routers: dict[str, str]) -> None:
        self._clients = {name: ReadyClient(url, SAMPLE_TIMEOUT_S) for name, url in routers.items()}
        self._removed: list[ReadyClient] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=2 * ROUTERS, thread_name_prefix="sample")
        self.rounds: list[dict[str, bool]] = []  # router -> answered ready
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="sampler")
        self._thread.start()

    def add(self, name: str, url: str) -> None:
        with self._lock:
            self._clients[name] = ReadyClient(url, SAMPLE_TIMEOUT_S)

    def remove(self, name: str) -> None:
        with self._lock:  # a request in flight may still use the client: closed in stop()
            self._removed.extend(filter(None, [self._clients.pop(name, None)]))

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            with self._lock:
                clients = dict(self._clients)
            futures = {name: self._pool.submit(c.get) for name, c in clients.items()}
            self.rounds.append({name: f.result().ready for name, f in futures.items()})
            self._stop.wait(max(0.0, started + SAMPLE_EVERY_S - time.monotonic()))

    @property
    def two_active(self) -> list[dict[str, bool]]:
        return [r for r in self.rounds if sum(r.values()) > 1]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._pool.shutdown(wait=True)
        for client in [*self._clients.values(), *self._removed]:
            client.close()


# --- the fleet ---------------------------------------------------------------------------------


@dataclass
class Router:
    name: str
    server: Server
    proxy: FaultProxy

    @property
    def url(self) -> str:
        return self.server.url


@dataclass
class Fleet:
    """The routers of one TTL; every proxy is also listed in `proxies` for the final cleanup."""

    procs: Processes
    etcd: EtcdServer
    engine: Server
    ttl: int
    key: str
    proxies: list[FaultProxy]
    renew_interval_s: float | None  # None: narwhal's default (max(ttl/3, 0.6 s))
    routers: list[Router] = field(default_factory=list)
    _names: itertools.count[int] = field(default_factory=itertools.count)

    def start_router(self) -> Router:
        name = f"t{self.ttl}-r{next(self._names)}"
        proxy = FaultProxy(HOST, self.etcd.client_port)
        self.proxies.append(proxy)
        proxy.start()
        path = self.procs.log_dir / f"{name}.yaml"
        harness.write_router_config(path, [EngineSpec("e0", self.engine.url, "both")])
        config = json.loads(path.read_text())
        config["ha"] = {
            "backend": "etcd",
            "endpoints": [proxy.url],
            "key": self.key,
            "lease_ttl_s": self.ttl,
            "id": name,
        }
        if self.renew_interval_s is not None:
            config["ha"]["renew_interval_s"] = self.renew_interval_s
        path.write_text(json.dumps(config, indent=2) + "\n")
        server = self.procs.start(name, ["serve", "--config", str(path)])
        router = Router(name, server, proxy)
        self.routers.append(router)
        client = ReadyClient(router.url, 1.0)
        deadline = time.monotonic() + STEADY_TIMEOUT_S
        while client.get().status is None:  # up: answers /ready, 200 or 503
            server.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{name} does not answer /ready:\n{harness.tail(server.log_path)}"
                )
            time.sleep(0.05)
        client.close()
        return router

    def drop(self, router: Router) -> None:
        """Forget a router that is gone (killed), stop its proxy."""
        self.routers.remove(router)
        self.procs.stop(router.server)
        self.proxies.remove(router.proxy)
        router.proxy.close()

    def stop(self) -> None:
        for router in list(self.routers):
            self.drop(router)

    def wait_steady(self) -> Router:
        """Until exactly one router answers ready and every other one "standby"."""
        clients = {r.name: ReadyClient(r.url, 1.0) for r in self.routers}
        deadline = time.monotonic() + STEADY_TIMEOUT_S
        seen: dict[str, str | None] = {}
        try:
            while time.monotonic() < deadline:
                for router in self.routers:
                    router.server.check_alive()
                seen = {name: client.get().reason for name, client in clients.items()}
                active = [r for r in self.routers if seen[r.name] == "active"]
                standby = [r for r in self.routers if seen[r.name] == "standby"]
                if len(active) == 1 and len(standby) == len(self.routers) - 1:
                    return active[0]
                time.sleep(0.02)
        finally:
            for client in clients.values():
                client.close()
        raise RuntimeError(f"no steady state (one active, others standby) in 30 s: {seen}")


# --- one failover ------------------------------------------------------------------------------


@dataclass
class Outcome:
    ttl: int
    fault: str
    round: int
    old_leader: str
    new_leader: str | None
    takeover_s: float | None  # None: no standby served before bound + TAKEOVER_GRACE_S
    key_deleted_s: float | None  # etcd deleted the leader key (fault -> DELETE event)
    key_created_s: float | None  # the new leader's key (fault -> PUT event)
    fenced_s: float | None = None  # partition: the old leader's first "fenced" answer
    paused_s: float | None = None  # pause: how long the leader was stopped
    after_resume: list[str] = field(default_factory=list)  # pause: its answers after SIGCONT
    violation: bool = False  # pause: it answered ready to a request sent after SIGSTOP
    sampled_rounds: int = 0
    two_active_rounds: int = 0
    two_active_examples: list[dict[str, bool]] = field(default_factory=list)


def failover(
    fleet: Fleet, fault: str, index: int, watch: KeyWatch, bound: float, settle_s: float
) -> Outcome:
    leader = fleet.wait_steady()
    time.sleep(settle_s)
    leader = fleet.wait_steady()  # still the same one, normally
    others = [r for r in fleet.routers if r is not leader]
    pollers = {r.name: Poller(r.name, r.url) for r in fleet.routers}
    sampler = Sampler({r.name: r.url for r in fleet.routers})
    paused = False
    outcome = Outcome(fleet.ttl, fault, index, leader.name, None, None, None, None)
    try:
        time.sleep(0.05)  # the pollers' connections are open
        t0 = time.monotonic()
        if fault == "kill":
            os.kill(leader.server.pid, signal.SIGKILL)
        elif fault == "pause":
            os.kill(leader.server.pid, signal.SIGSTOP)
            paused = True
        else:
            leader.proxy.blackhole()
        deadline = t0 + bound + TAKEOVER_GRACE_S
        first: Answer | None = None
        while time.monotonic() < deadline:
            answers = [pollers[r.name].first(lambda a: a.ready, t0) for r in others]
            found = [(a, r) for a, r in zip(answers, others, strict=True) if a is not None]
            if found:
                first, new = min(found, key=lambda pair: pair[0].received)
                outcome.takeover_s = first.received - t0
                outcome.new_leader = new.name
                break
            time.sleep(0.002)
        if first is None:
            harness.log(f"  {fault} #{index}: no takeover within {bound + TAKEOVER_GRACE_S:.1f} s")
        old = pollers[leader.name]
        if fault == "kill":
            leader.server.process.wait(5)
            sampler.remove(leader.name)
            old.stop()
            fleet.drop(leader)
            replacement = fleet.start_router()
            sampler.add(replacement.name, replacement.url)
        elif fault == "pause":
            # A request sent while the router is stopped: the first it serves on waking up.
            probe: list[Answer] = []
            probe_client = ReadyClient(leader.url, 5.0)
            thread = threading.Thread(target=lambda: probe.append(probe_client.get()), daemon=True)
            thread.start()
            # Stopped past the TTL: a takeover can come sooner than TTL after the SIGSTOP
            # (the lease counts from the last renewal, before it).
            time.sleep(max(0.02, t0 + fleet.ttl + 0.05 - time.monotonic()))
            resumed = time.monotonic()
            os.kill(leader.server.pid, signal.SIGCONT)
            paused = False
            outcome.paused_s = resumed - t0
            thread.join(6)
            probe_client.close()
        else:
            fenced = None
            while fenced is None and time.monotonic() < deadline:
                fenced = old.first(lambda a: a.reason == "fenced", t0)
                time.sleep(0.005)
            leader.proxy.heal()
            if fenced is not None:
                outcome.fenced_s = fenced.received - t0
        fleet.wait_steady()
        if fault == "pause":
            after = sorted([*old.answers, *probe], key=lambda a: a.received)
            after = [a for a in after if a.sent >= t0 and a.status is not None]
            outcome.after_resume = [str(a.reason) for a in after[:3]]
            outcome.violation = any(a.ready for a in after)
    finally:
        if paused:
            os.kill(leader.server.pid, signal.SIGCONT)
        if fault == "partition":
            leader.proxy.heal()
        sampler.stop()
        for poller in pollers.values():
            poller.stop()
    deleted = watch.first("DELETE", t0)
    created = watch.first("PUT", t0)
    outcome.key_deleted_s = deleted.at - t0 if deleted else None
    outcome.key_created_s = created.at - t0 if created else None
    outcome.sampled_rounds = len(sampler.rounds)
    outcome.two_active_rounds = len(sampler.two_active)
    outcome.two_active_examples = sampler.two_active[:3]
    return outcome


def describe(o: Outcome, bound: float) -> str:
    parts = [f"ttl {o.ttl} {o.fault} #{o.round}: {o.old_leader} -> {o.new_leader}"]
    parts.append(f"takeover {fmt(o.takeover_s or float('nan'), 3)} s (bound {bound:.2f})")
    parts.append(f"key deleted {fmt(o.key_deleted_s or float('nan'), 3)} s")
    if o.fenced_s is not None:
        parts.append(f"fenced {o.fenced_s:.3f} s")
    if o.paused_s is not None:
        parts.append(f"stopped {o.paused_s:.3f} s, then {'/'.join(o.after_resume) or '?'}")
    if o.two_active_rounds:
        parts.append(f"TWO ACTIVE in {o.two_active_rounds} rounds")
    return ", ".join(parts)


# --- reporting -----------------------------------------------------------------------------------


def _values(outcomes: Sequence[Outcome], attr: str) -> list[float]:
    return [v for o in outcomes if (v := getattr(o, attr)) is not None]


def summarize(ttl: int, fault: str, outcomes: Sequence[Outcome], bound: float) -> dict[str, Any]:
    takeovers = _values(outcomes, "takeover_s")
    worst = max(takeovers) if len(takeovers) == len(outcomes) and takeovers else float("inf")
    to_active = [
        o.takeover_s - o.key_deleted_s
        for o in outcomes
        if o.takeover_s is not None and o.key_deleted_s is not None
    ]
    deleted = _values(outcomes, "key_deleted_s")
    return {
        "ttl_s": ttl,
        "fault": fault,
        "rounds": len(outcomes),
        "takeovers": len(takeovers),
        "median_s": median(takeovers),
        "worst_s": worst,
        "bound_s": bound,
        "worst_over_bound": worst / bound,
        "over_bound": sum(1 for t in takeovers if t > bound) + len(outcomes) - len(takeovers),
        "sampled_rounds": sum(o.sampled_rounds for o in outcomes),
        "two_active_rounds": sum(o.two_active_rounds for o in outcomes),
        "fenced_median_s": median(_values(outcomes, "fenced_s")),
        "key_deleted_median_s": median(deleted),
        "key_deleted_worst_s": max(deleted, default=float("nan")),
        "deleted_to_active_median_s": median(to_active),
        "violations": sum(1 for o in outcomes if o.violation) if fault == "pause" else None,
    }


HEADERS = [
    "fault",
    "rounds",
    "takeover median s",
    "worst s",
    "bound s (TTL + renew)",
    "worst / bound",
    "over bound",
    "two-active samples",
    "fenced after (median s)",
    "ready after SIGCONT",
    "key deleted after: median / worst s",
    "deleted -> active median s",
]


def _row(s: dict[str, Any]) -> list[str]:
    return [
        s["fault"],
        str(s["rounds"]),
        fmt(s["median_s"], 3),
        fmt(s["worst_s"], 3),
        fmt(s["bound_s"], 3),
        fmt(s["worst_over_bound"], 2),
        str(s["over_bound"]),
        f"{s['two_active_rounds']} of {s['sampled_rounds']:,}",
        fmt(s["fenced_median_s"], 3),
        "-" if s["violations"] is None else str(s["violations"]),
        f"{fmt(s['key_deleted_median_s'], 3)} / {fmt(s['key_deleted_worst_s'], 3)}",
        fmt(s["deleted_to_active_median_s"], 3),
    ]


# --- main ----------------------------------------------------------------------------------------


def run_ttl(
    procs: Processes,
    etcd: EtcdServer,
    engine: Server,
    proxies: list[FaultProxy],
    ttl: int,
    args: argparse.Namespace,
    rng: random.Random,
) -> tuple[HAConfig, list[Outcome]]:
    key = f"/narwhal-perf/failover-{os.getpid()}-{time.time_ns()}/ttl{ttl}/leader"
    renew = args.renew_interval
    ha = HAConfig(
        backend="etcd", endpoints=(etcd.url,), key=key, lease_ttl_s=ttl, renew_interval_s=renew
    )
    bound = ttl + ha.renew_interval
    fleet = Fleet(procs, etcd, engine, ttl, key, proxies, renew)
    watch = KeyWatch(etcd.url, key)
    outcomes: list[Outcome] = []
    try:
        for _ in range(ROUTERS):
            fleet.start_router()
        for fault in FAULTS:
            for index in range(args.rounds):
                settle = SETTLE_S + rng.uniform(0, ttl)
                outcome = failover(fleet, fault, index, watch, bound, settle)
                outcomes.append(outcome)
                harness.log("  " + describe(outcome, bound))
    finally:
        watch.close()
        fleet.stop()
    return ha, outcomes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ttls", default="1,2,3", help="lease TTLs (whole seconds) to measure")
    parser.add_argument("--rounds", type=int, default=8, help="failovers per TTL and fault")
    parser.add_argument(
        "--renew-interval",
        type=float,
        help="ha.renew_interval_s (default: narwhal's, max(ttl/3, 0.6 s))",
    )
    parser.add_argument("--seed", type=int, default=0, help="the jitter between rounds")
    parser.add_argument("--etcd", default=shutil.which("etcd") or "/usr/bin/etcd")
    parser.add_argument("--json", metavar="OUT", help="write every raw result here")
    parser.add_argument("--quick", action="store_true", help="TTLs 1 and 2, 3 rounds each")
    parser.add_argument("--keep-logs", action="store_true", help="keep process logs")
    args = parser.parse_args(argv)
    if args.quick:
        args.ttls, args.rounds = "1,2", 3
    ttls = [int(t) for t in args.ttls.split(",")]
    rng = random.Random(args.seed)
    started = time.monotonic()
    revision = harness.narwhal_revision()  # the code the processes load

    proxies: list[FaultProxy] = []
    results: dict[int, tuple[HAConfig, list[Outcome]]] = {}
    lags: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="narwhal-etcd-") as data_dir:
        etcd = EtcdServer(args.etcd, data_dir)
        try:
            etcd.start()
            version = etcd_version(etcd.url)
            harness.log(f"etcd {version} at {etcd.url}")
            for ttl in ttls:
                lags[ttl] = expiry_lag(etcd.url, ttl, LAG_LEASES)
                harness.log(
                    f"etcd expiry lag, ttl {ttl}: {', '.join(f'{x:.3f}' for x in lags[ttl])}"
                )
            with Processes(keep_logs=args.keep_logs) as procs:
                engine = procs.sim("engine", "--model", MODEL)
                for ttl in ttls:
                    harness.log(f"ttl {ttl} s: {args.rounds} rounds of {', '.join(FAULTS)}")
                    results[ttl] = run_ttl(procs, etcd, engine, proxies, ttl, args, rng)
        finally:
            for proxy in proxies:
                with contextlib.suppress(Exception):
                    proxy.close()
            etcd.stop()

    print(
        f"\n## Failover: {ROUTERS} routers on one etcd lease, {args.rounds} failovers per TTL "
        f"and fault (kill = SIGKILL, pause = SIGSTOP until a standby serves, partition = "
        f"the leader's etcd traffic blackholed)"
    )
    print("\n" + harness.stamp(revision) + f", etcd {version} (heartbeat 50 ms, election 250 ms)")
    summaries: list[dict[str, Any]] = []
    for ttl, (ha, outcomes) in results.items():
        bound = ttl + ha.renew_interval
        print(
            f"\n### TTL {ttl} s (renew every {ha.renew_interval:.3g} s, fence margin "
            f"{ha.margin:.3g} s, bound {bound:.3g} s)\n"
        )
        rows = []
        for fault in FAULTS:
            of_fault = [o for o in outcomes if o.fault == fault]
            summary = summarize(ttl, fault, of_fault, bound)
            summaries.append(summary)
            rows.append(_row(summary))
        print(table(HEADERS, rows))
    print("\netcd alone: key deleted this long after its lease's TTL ran out\n")
    lag_rows = [
        [str(ttl), str(len(values)), fmt(median(values), 3), fmt(max(values), 3)]
        for ttl, values in lags.items()
    ]
    print(table(["TTL s", "leases", "lag median s", "lag worst s"], lag_rows))
    notes = []
    for ttl, (ha, outcomes) in results.items():
        bound = ttl + ha.renew_interval
        for o in outcomes:
            if o.takeover_s is None or o.takeover_s > bound or o.two_active_rounds or o.violation:
                notes.append(describe(o, bound))
    if notes:
        print("\nOver the bound, or unsafe:\n")
        for note in notes:
            print(f"- {note}")
    elapsed = time.monotonic() - started
    print(f"\ntotal run time {elapsed:.0f} s")
    raw: dict[str, Any] = {
        "args": vars(args),
        "narwhal": revision,
        "etcd": version,
        "expiry_lag_s": {str(ttl): values for ttl, values in lags.items()},
        "summaries": summaries,
        "outcomes": [asdict(o) for _, outcomes in results.values() for o in outcomes],
        "notes": notes,
        "elapsed_s": elapsed,
    }
    harness.write_json(args.json, raw)
    return 0


if __name__ == "__main__":
    sys.exit(harness.run_main(main))
