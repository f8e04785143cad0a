"""Overload: refusals stay cheap, admitted requests complete, the loop and ops endpoints keep up.

A fleet of simulated engines (`narwhal sim`, both roles, time-scale 1: the sim's
performance model in real time) behind one `narwhal serve` in predictive admission with a
TTFT budget (default 2 s) is offered open-loop Poisson load at multiples of its capacity
(default 2x and 5x, `--seconds` each). Capacity and workload are admission.py's
(`admission.fleet_capacity`, prompts 256-4096 tokens, outputs 32-256): prefill-bound,
derived from the sims' model. Each level gets a fresh fleet and router, a short closed-loop
warm-up (so the router has seen first tokens before the level) and a 2 s idle look at the
ops endpoints; the level's figures count only its own open-loop run.

While a level runs, one thread per endpoint GETs /health, /ready and /metrics every
100 ms, each on a fresh connection (connect to the whole body), and records its latency
and status. Reported per level:

- offered rate (asked and generated), admitted, refused by 429 code, 503, other errors;
- refusal latency p50/p99/max at the client (`narwhal bench`: send to the whole 429) and
  the router's own p99 (arrival to the 429, `narwhal_refusal_latency_seconds`' buckets);
- admitted requests completed (count and share) and the books: the router's
  narwhal_offered_total over the level against the sum of narwhal_outcomes_total, and
  the engines' own completed count;
- TTFT p50/p99 of the admitted; the event loop's lag p99, mean and largest bucket
  (`narwhal_event_loop_lag_seconds` over the level) and its peak task count
  (`narwhal_event_loop_tasks`, read from the sampler's /metrics bodies);
- /health, /ready and /metrics latency p50/p99/max, with their idle figures beside.

Then a PASS/FAIL line per target: refusal p99 < 10 ms, every ops answer 200 within
100 ms, every admitted request completed with the books balanced, and lag p99 < 50 ms
(`--lag-target-ms`); the exit status is 1 when any line says FAIL. Client, router and
engines share the host's cores; the "other load" column is host CPU that no process of
the run accounts for (above ~0.25 cores, rerun before trusting a figure).

    python scripts/perf/overload.py [--levels 2,5] [--seconds 40] [--budget 2] [--json OUT]
    python scripts/perf/overload.py --quick          # 10 s per level
"""

from __future__ import annotations

import argparse
import http.client
import math
import os
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import harness
from harness import BenchRun, Processes, Server, fmt, log, table

import admission
from narwhal.models.profile import PROBE_PROMPTS

ENDPOINTS = ("/health", "/ready", "/metrics")
SAMPLE_EVERY_S = 0.1
SAMPLE_TIMEOUT_S = 2.0
SCHED_EVERY_S = 0.02
IDLE_S = 2.0
REFUSAL_TARGET_MS = 10.0
OPS_TARGET_MS = 100.0
REQUEST_TIMEOUT_S = 60  # per request: bounds the drain of a level if an engine stalls
# Warm-up: more prompts than the router's sizing needs to learn its estimate's bounds (32
# engine counts, `sizing.calibration.MIN_SAMPLES`), short outputs.
WARMUP_REQUESTS = 48
WARMUP_OUTPUTS = "16:64"
_TASKS = re.compile(r"^narwhal_event_loop_tasks\s+(\S+)", re.M)
_OUTCOME = re.compile(r'^narwhal_outcomes_total\{outcome="([^"]+)"\}$')
LAG = "narwhal_event_loop_lag_seconds"
REFUSAL = "narwhal_refusal_latency_seconds"


# --- the ops sampler ----------------------------------------------------------------------


@dataclass
class Probe:
    """One GET: when it started (s into the sampling), its latency, its status (0: none)."""

    at_s: float
    ms: float
    status: int
    error: str = ""


@dataclass(frozen=True)
class Sched:
    """/proc/PID/schedstat of a process's main thread (the router's event loop): seconds
    on a CPU and seconds runnable but waiting for one, at `at_s` into the sampling."""

    at_s: float
    cpu_s: float
    wait_s: float


def read_schedstat(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/schedstat") as f:
        on_cpu, waiting, _slices = f.read().split()
    return int(on_cpu) / 1e9, int(waiting) / 1e9


class OpsSampler:
    """GET each of ENDPOINTS every `every_s` from a thread of its own, a fresh connection
    each time (`Connection: close`), timed from before the connect to the end of the body.
    The threads start a third of a period apart. A probe that overruns its period delays
    that endpoint's next one (no catch-up burst). /metrics bodies also give the loop's
    task count (`tasks`). With `pid`, one more thread reads that process's schedstat every
    SCHED_EVERY_S (`sched`): whether a slow answer came from a busy loop or from a loop
    that was waiting for a CPU; with `client`, it also reads the schedstat of this
    script's `narwhal bench` child once one runs (`client_sched`)."""

    def __init__(
        self,
        url: str,
        every_s: float = SAMPLE_EVERY_S,
        pid: int | None = None,
        client: bool = False,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        self._host = parsed.hostname or harness.HOST
        self._port = parsed.port or 80
        self._every = every_s
        self._stop = threading.Event()
        self.probes: dict[str, list[Probe]] = {path: [] for path in ENDPOINTS}
        self.tasks: list[float] = []
        self.sched: list[Sched] = []
        self.client_sched: list[Sched] = []
        self._client = client
        self._threads = [
            threading.Thread(target=self._run, args=(path, i), daemon=True)
            for i, path in enumerate(ENDPOINTS)
        ]
        if pid is not None:
            self._threads.append(threading.Thread(target=self._sched, args=(pid,), daemon=True))
        self._origin = 0.0

    def __enter__(self) -> OpsSampler:
        self._origin = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(SAMPLE_TIMEOUT_S + 1)

    def _run(self, path: str, index: int) -> None:
        due = self._origin + index * self._every / len(ENDPOINTS)
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            self.probes[path].append(self._probe(path))
            due = max(due + self._every, time.monotonic())

    def _sched(self, pid: int) -> None:
        client: int | None = None
        while True:
            at_s = time.monotonic() - self._origin
            try:
                self.sched.append(Sched(at_s, *read_schedstat(pid)))
            except (OSError, ValueError):
                return
            if self._client and client is None:
                client = _bench_child()
            if client is not None:
                try:
                    self.client_sched.append(Sched(at_s, *read_schedstat(client)))
                except (OSError, ValueError):
                    client = None  # it ended (the next level's is another process)
            if self._stop.wait(SCHED_EVERY_S):
                return

    def _probe(self, path: str) -> Probe:
        started = time.monotonic()
        status, error, body = 0, "", b""
        connection = http.client.HTTPConnection(self._host, self._port, timeout=SAMPLE_TIMEOUT_S)
        try:
            connection.request("GET", path, headers={"Connection": "close"})
            response = connection.getresponse()
            body = response.read()
            status = response.status
        except (OSError, http.client.HTTPException) as exc:
            error = type(exc).__name__
        finally:
            connection.close()
        ms = 1e3 * (time.monotonic() - started)
        if path == "/metrics" and body:
            match = _TASKS.search(body.decode(errors="replace"))
            if match:
                self.tasks.append(float(match.group(1)))
        return Probe(started - self._origin, ms, status, error)


def latency_figures(probes: Sequence[Probe]) -> dict[str, Any]:
    """Count, failures (no 200: timeouts, errors, other statuses) and latency p50/p99/max
    (ms, of every probe that got an answer)."""
    answered = sorted(p.ms for p in probes if p.status)
    failures = [p for p in probes if p.status != 200]
    out: dict[str, Any] = {
        "samples": len(probes),
        "failures": len(failures),
        "failure_kinds": sorted({p.error or f"HTTP {p.status}" for p in failures}),
        "p50_ms": _percentile(answered, 50),
        "p99_ms": _percentile(answered, 99),
        "max_ms": answered[-1] if answered else math.nan,
        "over_target": sum(1 for p in probes if p.ms >= OPS_TARGET_MS),
    }
    slowest = max(probes, key=lambda p: p.ms, default=None)
    out["slowest_at_s"] = slowest.at_s if slowest else math.nan
    return out


def _percentile(sorted_values: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (as `narwhal bench` computes them)."""
    if not sorted_values:
        return math.nan
    rank = (len(sorted_values) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


def _bench_child() -> int | None:
    """The PID of this script's running `narwhal bench` child, if any."""
    for pid in harness._descendants(os.getpid())[1:]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"narwhal" in args and b"bench" in args:
            return pid
    return None


def sched_window(samples: Sequence[Sched], start_s: float, end_s: float) -> Sched | None:
    """On-CPU and waiting seconds of the loop thread over the samples that bracket
    [start_s, end_s] (`at_s` is the bracket's length); None without samples around it."""
    before = [x for x in samples if x.at_s <= start_s]
    after = [x for x in samples if x.at_s >= end_s]
    if not before or not after:
        return None
    first, last = before[-1], after[0]
    return Sched(last.at_s - first.at_s, last.cpu_s - first.cpu_s, last.wait_s - first.wait_s)


def sched_figures(samples: Sequence[Sched], window_s: float = 0.1) -> dict[str, float]:
    """Over the whole sampling: the loop thread's cores on a CPU and waiting for one, and
    the most it waited in any `window_s` (ms)."""
    if len(samples) < 2:
        return {}
    whole = sched_window(samples, samples[0].at_s, samples[-1].at_s)
    assert whole is not None
    worst_wait, worst_at = 0.0, math.nan
    j = 0
    for i, first in enumerate(samples):
        j = max(j, i + 1)
        while j < len(samples) and samples[j].at_s < first.at_s + window_s:
            j += 1
        if j == len(samples):
            break
        wait = samples[j].wait_s - first.wait_s
        if wait > worst_wait:
            worst_wait, worst_at = wait, first.at_s
    return {
        "cpu_cores": whole.cpu_s / whole.at_s,
        "wait_cores": whole.wait_s / whole.at_s,
        "worst_wait_ms": 1e3 * worst_wait,
        "worst_wait_at_s": worst_at,
    }


def slowest_probe(
    probes: dict[str, list[Probe]], samples: Sequence[Sched]
) -> dict[str, Any] | None:
    """The slowest ops answer and what the loop thread did meanwhile."""
    every = [(path, p) for path, mine in probes.items() for p in mine]
    if not every:
        return None
    path, probe = max(every, key=lambda item: item[1].ms)
    out: dict[str, Any] = {"endpoint": path, "ms": probe.ms, "at_s": probe.at_s}
    window = sched_window(samples, probe.at_s, probe.at_s + probe.ms / 1e3)
    if window is not None:
        out.update(
            window_ms=1e3 * window.at_s,
            loop_cpu_ms=1e3 * window.cpu_s,
            loop_wait_ms=1e3 * window.wait_s,
        )
    return out


# --- one level ----------------------------------------------------------------------------


@dataclass
class Level:
    level: float
    rate: float
    bench: BenchRun
    metrics: dict[str, float]  # router counters over the level (deltas)
    lag: list[tuple[float, float]]  # (upper bound, cumulative count) over the level
    lag_sum_s: float
    refusal_histogram: list[tuple[float, float]]
    ops: dict[str, dict[str, Any]]
    idle_ops: dict[str, dict[str, Any]]
    tasks_idle: float
    tasks_peak: float
    tasks_after: float
    engine_completed: int  # the engines' own count: client requests and profiling probes
    router_name: str
    drift: dict[str, float] = field(default_factory=dict)  # narwhal_engine_drift at the end
    prediction_error: list[tuple[float, float]] = field(default_factory=list)
    sched: dict[str, float] = field(default_factory=dict)  # the loop thread's CPU and waits
    client_sched: dict[str, float] = field(default_factory=dict)  # the bench's main thread
    slowest: dict[str, Any] | None = None  # the slowest ops answer, and the loop meanwhile
    checks: dict[str, bool] = field(default_factory=dict)

    @property
    def summary(self) -> dict[str, Any]:
        return self.bench.summary

    @property
    def admission(self) -> dict[str, Any]:
        return dict(self.summary["admission"])

    @property
    def router_offered(self) -> int:
        return round(self.metrics.get("narwhal_offered_total", 0.0))

    @property
    def router_outcomes(self) -> dict[str, int]:
        out = {}
        for key, value in self.metrics.items():
            match = _OUTCOME.fullmatch(key)
            if match and round(value):
                out[match.group(1)] = round(value)
        return out

    def lag_quantile_ms(self, q: float) -> float:
        return 1e3 * admission._histogram_quantile(self.lag, q)

    @property
    def lag_ticks(self) -> int:
        return round(self.lag[-1][1]) if self.lag else 0

    @property
    def lag_mean_ms(self) -> float:
        return 1e3 * self.lag_sum_s / self.lag_ticks if self.lag_ticks else math.nan

    @property
    def lag_max_bound_ms(self) -> float:
        """The upper bound of the highest bucket any tick fell in (inf: above 2.5 s)."""
        total = self.lag_ticks
        for bound, count in self.lag:
            if total and count >= total:
                return 1e3 * bound
        return math.nan

    def lag_ticks_over(self, bound_s: float) -> int:
        below = next((count for bound, count in self.lag if bound >= bound_s), 0.0)
        return round(self.lag_ticks - below)

    @property
    def reprofiles(self) -> dict[str, int]:
        """Re-profiles after drift over the level, by engine (each sends PROBE_PROMPTS)."""
        pattern = re.compile(r'narwhal_engine_reprofiles_total\{engine="([^"]+)"\}')
        out = {}
        for key, value in self.metrics.items():
            match = pattern.fullmatch(key)
            if match and round(value):
                out[match.group(1)] = round(value)
        return out

    @property
    def probes(self) -> int:
        """Profiling probe requests the engines served over the level (not client work)."""
        return len(PROBE_PROMPTS) * sum(self.reprofiles.values())

    def cores(self, name: str) -> float:
        """CPU of a watched process over the level's bench run, in cores."""
        return self.bench.cpu_s.get(name, math.nan) / self.bench.wall_s

    def router_refusal_ms(self, q: float) -> float:
        return 1e3 * admission._histogram_quantile(self.refusal_histogram, q)

    def errors_by(self, prefix: str) -> int:
        counts: dict[str, int] = self.summary["error_counts"]
        return sum(n for key, n in counts.items() if key.startswith(prefix))

    @property
    def other_errors(self) -> int:
        return int(self.summary["errors"]) - self.errors_by("HTTP 429") - self.errors_by("HTTP 503")


def start_router(
    procs: Processes, tag: str, args: argparse.Namespace
) -> tuple[Server, list[Server]]:
    sims = admission.start_fleet(procs, tag, [()] * args.engines)
    for sim in sims:
        renice(sim.pid, args.engines_nice)
    named = [(f"e{i}", sim, "both") for i, sim in enumerate(sims)]
    config = admission.router_config(
        procs.log_dir / f"router-{tag}.yaml", named, "predictive", args.budget
    )
    return procs.router(f"narwhal-{tag}", config), sims


def renice(pid: int, nice: int) -> None:
    """Lower every thread of `pid` to `nice` (Linux keeps a nice value per thread)."""
    if nice == 0:
        return
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def run_level(procs: Processes, level: float, capacity: float, args: argparse.Namespace) -> Level:
    tag = f"overload-x{level:g}-{time.monotonic_ns() % 10**6}"
    rate = level * capacity
    router, sims = start_router(procs, tag, args)
    # Warm-up in closed loop, so first tokens have been measured (and the projections
    # corrected by them) and prompts are sized without asking the engines before the
    # level; its own seed, not the level's.
    warm = argparse.Namespace(seed=args.seed + 1, budget=args.budget)
    warm_flags = admission.workload(
        warm, args.warmup_requests, 60, admission.PROMPTS, WARMUP_OUTPUTS
    )
    harness.run_bench(
        f"{tag}-warmup",
        [router.url],
        ["-c", "8", *warm_flags, "--timeout", "60"],
        warmup=0,
        timeout_s=180,
        work_dir=procs.log_dir,
    )
    with OpsSampler(router.url) as idle:
        time.sleep(IDLE_S)
    engines_before = sum(admission._engine_requests(sim) for sim in sims)
    before = admission.scrape(router)
    requests = int(rate * args.seconds * 1.5) + 50  # --duration ends the level first
    load = [
        *("--rate", f"{rate:.3f}"),
        *admission.workload(args, requests, args.seconds),
        *("--timeout", str(REQUEST_TIMEOUT_S)),
    ]
    log(f"{tag}: {rate:.1f} req/s for {args.seconds:g} s")
    with OpsSampler(router.url, pid=router.pid, client=True) as ops:
        run = harness.run_bench(
            tag,
            [router.url],
            load,
            watch=[router, *sims],  # so that "other load" is work outside this run
            router=router,
            warmup=0,
            timeout_s=args.seconds + REQUEST_TIMEOUT_S + 120,
            work_dir=procs.log_dir,
        )
    after = admission.scrape(router)
    engine_completed = round(sum(admission._engine_requests(sim) for sim in sims) - engines_before)
    router.check_alive()
    procs.stop(router)
    for sim in sims:
        procs.stop(sim)
    metrics = {
        key: after[key] - before.get(key, 0.0)
        for key in after
        if key.endswith("_total") or "_total{" in key
    }
    result = Level(
        level=level,
        rate=rate,
        bench=run,
        metrics=metrics,
        lag=admission.histogram_delta(LAG, before, after),
        lag_sum_s=after.get(f"{LAG}_sum", 0.0) - before.get(f"{LAG}_sum", 0.0),
        refusal_histogram=admission.histogram_delta(REFUSAL, before, after),
        ops={path: latency_figures(ops.probes[path]) for path in ENDPOINTS},
        sched=sched_figures(ops.sched),
        client_sched=sched_figures(ops.client_sched),
        slowest=slowest_probe(ops.probes, ops.sched),
        idle_ops={path: latency_figures(idle.probes[path]) for path in ENDPOINTS},
        tasks_idle=before.get("narwhal_event_loop_tasks", math.nan),
        tasks_peak=max(ops.tasks, default=math.nan),
        tasks_after=after.get("narwhal_event_loop_tasks", math.nan),
        engine_completed=engine_completed,
        router_name=router.name,
        drift={k: v for k, v in after.items() if k.startswith("narwhal_engine_drift{")},
        prediction_error=admission.histogram_delta(
            "narwhal_ttft_prediction_error_ratio", before, after
        ),
    )
    a = result.admission
    log(
        f"{tag}: offered {a['offered']} admitted {a['admitted']} refused {a['refused']} "
        f"ok {result.summary['ok']} errors {result.summary['error_counts']}; router "
        f"offered {result.router_offered} outcomes {result.router_outcomes}; lag p99 "
        f"{result.lag_quantile_ms(0.99):.1f} ms; ops max "
        + ", ".join(f"{p} {result.ops[p]['max_ms']:.0f} ms" for p in ENDPOINTS)
    )
    return result


# --- report ---------------------------------------------------------------------------------


def _ms(seconds: float | None, digits: int = 1) -> str:
    return "-" if seconds is None else fmt(1e3 * seconds, digits)


def _label(run: Level) -> str:
    return f"{run.level:g}x"


def outcomes_row(run: Level) -> list[str]:
    s, a = run.summary, run.admission
    codes = a["refused_by_code"]
    refused = ", ".join(f"{code} {n}" for code, n in codes.items() if n) or "0"
    rejected = run.errors_by("HTTP 429") - a["refused"]  # 429 without a refusal code
    if rejected:
        refused += f", other 429 {rejected}"
    offered_per_s = run.bench.stage.get("offered_per_s")
    admitted = int(a["admitted"])
    ok = int(s["ok"])
    return [
        _label(run),
        f"{run.rate:.1f} / {fmt(offered_per_s or math.nan, 1)}",
        str(a["offered"]),
        str(admitted),
        refused,
        str(run.errors_by("HTTP 503")),
        str(run.other_errors),
        f"{ok} ({fmt(100 * ok / admitted if admitted else math.nan, 1)}%)",
        f"{run.router_offered} = {sum(run.router_outcomes.values())}",
        f"{run.engine_completed - run.probes} + {run.probes}",
    ]


OUTCOME_HEADERS = [
    "load",
    "offered req/s (asked / generated)",
    "requests",
    "admitted",
    "refused (429 by code)",
    "503",
    "other errors",
    "admitted completed",
    "router offered = sum of outcomes",
    "engines completed (client + probes)",
]


def admitted_row(run: Level) -> list[str]:
    s, a = run.summary, run.admission
    ttft = s["ttft_s"]
    error = run.prediction_error
    return [
        _label(run),
        f"{_ms(ttft['p50'], 0)} / {_ms(ttft['p99'], 0)}",
        f"{fmt(100 * (a['admitted_attainment'] or 0), 1)}%",
        f"{fmt(int(a['admitted']) / s['window_s'], 1)}",
        (
            f"{fmt(100 * admission._histogram_quantile(error, 0.5), 0)}% / "
            f"{fmt(100 * admission._histogram_quantile(error, 0.9), 0)}%"
        ),
        ", ".join(f"{e} {n}" for e, n in run.reprofiles.items()) or "0",
        f"{_ms(run.bench.stage.get('max_lag_s'), 0)} / {run.bench.stage.get('client_queued', 0)}",
        fmt(run.cores(run.router_name), 2),
        fmt(sum(run.cores(name) for name in run.bench.cpu_s if name != run.router_name), 2),
        fmt(run.bench.host_busy_cores, 2),
        fmt(run.bench.other_cores, 2),
    ]


ADMITTED_HEADERS = [
    "load",
    "TTFT p50 / p99 ms (admitted)",
    "admitted within budget",
    "admitted req/s",
    "projection error p50 / p90",
    "re-profiles after drift",
    "client max lag ms / queued",
    "router CPU cores",
    "sims CPU cores",
    "host busy cores",
    "other load cores",
]


def loop_row(run: Level) -> list[str]:
    refusal = run.admission["refusal_latency_s"]
    client = "-"
    if refusal.get("count"):
        client = f"{_ms(refusal['p50'])} / {_ms(refusal['p99'])} / {_ms(refusal['max'])}"
    bound = run.lag_max_bound_ms
    largest = "> 2,500" if math.isinf(bound) else f"<= {fmt(bound, 1)}"
    return [
        _label(run),
        client,
        (
            f"{fmt(run.router_refusal_ms(0.5), 2)} / {fmt(run.router_refusal_ms(0.99), 2)}"
            if refusal.get("count")
            else "-"
        ),
        fmt(run.lag_quantile_ms(0.99), 1),
        fmt(run.lag_mean_ms, 2),
        largest,
        f"{run.lag_ticks_over(0.05)} / {run.lag_ticks}",
        f"{fmt(run.tasks_idle, 0)} / {fmt(run.tasks_peak, 0)} / {fmt(run.tasks_after, 0)}",
        f"{fmt(run.sched.get('cpu_cores', math.nan), 2)} / "
        f"{fmt(run.sched.get('wait_cores', math.nan), 2)}",
        fmt(run.sched.get("worst_wait_ms", math.nan), 0),
        f"{fmt(run.client_sched.get('cpu_cores', math.nan), 2)} / "
        f"{fmt(run.client_sched.get('wait_cores', math.nan), 2)} / "
        f"{fmt(run.client_sched.get('worst_wait_ms', math.nan), 0)}",
    ]


LOOP_HEADERS = [
    "load",
    "refusal p50 / p99 / max ms (client)",
    "refusal p50 / p99 ms (router)",
    "loop lag p99 ms",
    "lag mean ms",
    "largest lag bucket ms",
    "lag ticks > 50 ms / all",
    "tasks idle / peak / after",
    "loop thread on CPU / waiting for one (cores)",
    "its longest wait in 100 ms, ms",
    "bench client on CPU / waiting (cores) / longest wait ms",
]


def slowest_line(run: Level) -> str:
    slow = run.slowest
    if slow is None:
        return f"{_label(run)}: no ops samples"
    line = (
        f"{_label(run)}: slowest ops answer {slow['endpoint']} {slow['ms']:.0f} ms "
        f"at {slow['at_s']:.1f} s"
    )
    if "window_ms" in slow:
        line += (
            f"; over the {slow['window_ms']:.0f} ms around it the router's loop thread ran "
            f"{slow['loop_cpu_ms']:.0f} ms and waited {slow['loop_wait_ms']:.0f} ms for a CPU"
        )
    return line


def ops_rows(run: Level) -> list[list[str]]:
    rows = []
    for path in ENDPOINTS:
        f, idle = run.ops[path], run.idle_ops[path]
        rows.append(
            [
                _label(run),
                path,
                str(f["samples"]),
                str(f["failures"])
                + (f" ({', '.join(f['failure_kinds'])})" if f["failures"] else ""),
                fmt(f["p50_ms"], 1),
                fmt(f["p99_ms"], 1),
                fmt(f["max_ms"], 1),
                f"{fmt(f['slowest_at_s'], 1)}",
                f"{fmt(idle['p50_ms'], 1)} / {fmt(idle['max_ms'], 1)}",
            ]
        )
    return rows


OPS_HEADERS = [
    "load",
    "endpoint",
    "samples",
    "not 200",
    "p50 ms",
    "p99 ms",
    "max ms",
    "slowest at s",
    "idle p50 / max ms",
]


def targets(runs: Sequence[Level], lag_target_ms: float) -> list[str]:
    """One PASS/FAIL line per target and level; sets each run's `checks`."""
    lines = []
    for run in runs:
        name = f"{run.level:g}x ({run.rate:.1f} req/s)"
        refusal = run.admission["refusal_latency_s"]
        p99 = refusal.get("p99")
        ok = p99 is not None and 1e3 * p99 < REFUSAL_TARGET_MS
        run.checks["refusal_p99"] = ok
        figure = f"{_ms(p99)} ms" if p99 is not None else "no refusals"
        lines.append(
            f"{'PASS' if ok else 'FAIL'} {name}: refusal latency p99 (client) < "
            f"{REFUSAL_TARGET_MS:g} ms: {figure} over {refusal.get('count', 0)} refusals "
            f"(router's own p99 {fmt(run.router_refusal_ms(0.99), 2)} ms)"
        )
        worst = max(run.ops[p]["max_ms"] for p in ENDPOINTS)
        failures = sum(run.ops[p]["failures"] for p in ENDPOINTS)
        samples = sum(run.ops[p]["samples"] for p in ENDPOINTS)
        ok = worst < OPS_TARGET_MS and failures == 0 and samples > 0
        run.checks["ops_max"] = ok
        each = ", ".join(f"{p} {fmt(run.ops[p]['max_ms'], 1)}" for p in ENDPOINTS)
        lines.append(
            f"{'PASS' if ok else 'FAIL'} {name}: /health, /ready, /metrics all 200 within "
            f"{OPS_TARGET_MS:g} ms: max {each} ms; {failures} of {samples} not 200"
        )
        a, s = run.admission, run.summary
        outcomes = run.router_outcomes
        balanced = run.router_offered == sum(outcomes.values()) == int(a["offered"])
        completed = int(s["ok"]) == int(a["admitted"]) == outcomes.get("completed", 0)
        ok = balanced and completed and run.engine_completed - run.probes == int(s["ok"])
        run.checks["admitted_completed"] = ok
        lines.append(
            f"{'PASS' if ok else 'FAIL'} {name}: every admitted request completed: "
            f"{s['ok']} of {a['admitted']} admitted; router offered {run.router_offered}, "
            f"outcomes {outcomes} (sum {sum(outcomes.values())}), bench offered "
            f"{a['offered']}, engines completed {run.engine_completed} "
            f"({run.probes} of them profiling probes)"
        )
        lag = run.lag_quantile_ms(0.99)
        ok = lag < lag_target_ms
        run.checks["lag_p99"] = ok
        lines.append(
            f"{'PASS' if ok else 'FAIL'} {name}: event-loop lag p99 < {lag_target_ms:g} ms: "
            f"{fmt(lag, 1)} ms ({run.lag_ticks_over(0.05)} of {run.lag_ticks} ticks over 50 ms)"
        )
    return lines


def level_json(run: Level) -> dict[str, Any]:
    return {
        "level": run.level,
        "rate": run.rate,
        "bench": run.bench.to_json(),
        "router_metrics": run.metrics,
        "router_offered": run.router_offered,
        "router_outcomes": run.router_outcomes,
        "engines_completed": run.engine_completed,
        "engines_profiling_probes": run.probes,
        "reprofiles": run.reprofiles,
        "engine_drift_end": run.drift,
        "prediction_error_histogram": run.prediction_error,
        "lag_histogram": run.lag,
        "lag_sum_s": run.lag_sum_s,
        "lag_p99_ms": run.lag_quantile_ms(0.99),
        "refusal_histogram": run.refusal_histogram,
        "router_refusal_p50_ms": run.router_refusal_ms(0.5),
        "router_refusal_p99_ms": run.router_refusal_ms(0.99),
        "ops": run.ops,
        "idle_ops": run.idle_ops,
        "tasks": {"idle": run.tasks_idle, "peak": run.tasks_peak, "after": run.tasks_after},
        "loop_thread_sched": run.sched,
        "bench_client_sched": run.client_sched,
        "slowest_ops_answer": run.slowest,
        "checks": run.checks,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=2, help="sims in the fleet")
    parser.add_argument("--levels", default="2,5", help="multiples of the fleet's capacity")
    parser.add_argument("--seconds", type=float, default=40.0, help="open-loop load per level")
    parser.add_argument("--budget", type=float, default=2.0, help="admission.ttft_target_s")
    parser.add_argument(
        "--step-budget", type=int, default=8192, help="the sims' --max-num-batched-tokens"
    )
    parser.add_argument(
        "--engines-nice",
        type=int,
        default=10,
        help="nice value of the sims (0: same priority as router and client); in "
        "production the engines are GPUs, not processes competing for the router's cores",
    )
    parser.add_argument("--lag-target-ms", type=float, default=50.0, help="loop lag p99 bound")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--warmup-requests",
        type=int,
        default=WARMUP_REQUESTS,
        help="closed-loop requests before each level (not counted)",
    )
    parser.add_argument("--quick", action="store_true", help="10 s per level")
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds = 10.0
    levels = [float(x) for x in args.levels.split(",")]
    admission.STEP_BUDGET[0] = args.step_budget
    started = time.monotonic()
    revision = harness.narwhal_revision()
    capacity = admission.fleet_capacity(args.engines, args.step_budget)
    runs: list[Level] = []
    with Processes(keep_logs=args.keep_logs) as procs:
        for level in levels:
            runs.append(run_level(procs, level, capacity, args))

    print(
        f"\n## Overload: {args.engines} sims (both roles, time-scale 1) behind one Narwhal, "
        f"predictive admission, TTFT budget {args.budget:g} s; prompts {admission.PROMPTS} "
        f"tokens, outputs {admission.OUTPUTS} (ignore_eos), Poisson arrivals, "
        f"{args.seconds:g} s per level; sims at nice {args.engines_nice}"
    )
    print("\n" + harness.stamp(revision) + "\n")
    print(
        f"capacity (prefill-bound, from the sims' model, as admission.py): {capacity:.2f} req/s; "
        f"ops endpoints sampled every {1e3 * SAMPLE_EVERY_S:.0f} ms each, fresh connections\n"
    )
    print(table(OUTCOME_HEADERS, [outcomes_row(r) for r in runs]))
    print()
    print(table(ADMITTED_HEADERS, [admitted_row(r) for r in runs]))
    print()
    print(table(LOOP_HEADERS, [loop_row(r) for r in runs]))
    print()
    print(table(OPS_HEADERS, [row for r in runs for row in ops_rows(r)]))
    print()
    print("\n".join(slowest_line(r) for r in runs))
    print()
    lines = targets(runs, args.lag_target_ms)
    print("\n".join(lines))
    print(f"\ntotal run time {time.monotonic() - started:.0f} s")
    harness.write_json(
        args.json,
        {
            "revision": revision,
            "args": vars(args),
            "capacity": capacity,
            "levels": [level_json(r) for r in runs],
        },
    )
    return 0 if all(all(r.checks.values()) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(harness.run_main(main))
