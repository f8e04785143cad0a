"""Shared harness of the performance scripts: processes, router configs, bench runs, tables.

Every process is a subprocess of this interpreter (`sys.executable -m narwhal ...`), bound
to 127.0.0.1 on an ephemeral port (read from its `... listening on http://HOST:PORT` line),
started in its own session so a terminal's Ctrl-C reaches only this script, and stopped by
PID (SIGTERM, then SIGKILL) when the `Processes` context exits: on success, on error, on
Ctrl-C and on SIGTERM (turned into `SystemExit` by `install_signal_handlers`).

CPU time is utime+stime from /proc/PID/stat of the process and its live descendants, plus
the time of children it has already reaped (cutime+cstime). Peak memory is VmHWM from
/proc/PID/status (the resident high-water mark since the process started, so start a fresh
process for each figure you want a peak of).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

HOST = "127.0.0.1"
MODEL = "narwhal-sim"
NARWHAL = (sys.executable, "-m", "narwhal")
# Admission open and limits far above any load these scripts offer: the router only routes.
GENEROUS_LIMIT = 100_000
_LISTENING = re.compile(r"listening on (http://[0-9.]+:\d+)")
_CLK_TCK = os.sysconf("SC_CLK_TCK")
# Other work on the host above this many cores during a run makes its figures suspect.
OTHER_LOAD_WARNING = 0.25


def log(message: str) -> None:
    """Progress on stderr, so stdout keeps only the tables."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def install_signal_handlers() -> None:
    """SIGTERM and SIGHUP exit through `finally` blocks, as Ctrl-C does.

    SIGINT gets Python's KeyboardInterrupt handler even when the script inherited it
    ignored (a shell's background job), so `kill -INT` stops it too.
    """

    def _exit(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGHUP, _exit)


def run_main(main: Callable[[], int]) -> int:
    """Run a script's main; Ctrl-C ends it with 130 and no traceback (processes are
    already stopped by then: `Processes.__exit__` ran on the way out)."""
    install_signal_handlers()
    try:
        return main()
    except KeyboardInterrupt:
        log("interrupted")
        return 130


def nofile_limits() -> tuple[int, int]:
    """(soft, hard) RLIMIT_NOFILE of this process; children get the hard one as soft."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def _raise_nofile() -> None:
    # Runs in the child between fork and exec: every socket of every stream is a descriptor.
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def narwhal_revision() -> str:
    """The commit of the narwhal being measured (`+dirty` with uncommitted src changes)."""
    probe = "import narwhal, pathlib; print(pathlib.Path(narwhal.__file__).resolve().parent)"
    try:
        package = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
        git = ["git", "-C", package]
        commit = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", "."], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit or 'unknown'}{'+dirty' if dirty else ''}"


def stamp(revision: str) -> str:
    """What was measured where: narwhal's commit, the date, cores, Python."""
    return (
        f"narwhal {revision}, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
        f"Python {sys.version.split()[0]}"
    )


# --- /proc ----------------------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    """pid and every live descendant (via /proc/PID/task/TID/children)."""
    found = [pid]
    index = 0
    while index < len(found):
        current = found[index]
        index += 1
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                path = f"/proc/{current}/task/{task}/children"
                with contextlib.suppress(OSError), open(path) as f:
                    found.extend(int(child) for child in f.read().split())
    return found


def cpu_seconds(pid: int) -> float:
    """utime+stime of pid and its live descendants, plus their reaped children's."""
    ticks = 0
    for each in _descendants(pid):
        with contextlib.suppress(OSError):
            with open(f"/proc/{each}/stat") as f:
                # The command name may hold spaces and parentheses: split after the last ')'.
                fields = f.read().rsplit(")", 1)[1].split()
            # fields[0] is field 3 (state): utime, stime, cutime, cstime are fields 14-17.
            ticks += sum(int(value) for value in fields[11:15])
    return ticks / _CLK_TCK


def host_busy_seconds() -> float:
    """CPU seconds all cores spent busy (not idle or iowait) since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(value) for value in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already inside user)
    return (sum(fields[:8]) - fields[3] - fields[4]) / _CLK_TCK


def children_cpu_seconds() -> float:
    """CPU of this process's reaped children (the bench, once waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def self_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tcp_counters() -> dict[str, int]:
    """The kernel's TcpExt counters (/proc/net/netstat), e.g. ListenOverflows."""
    counters: dict[str, int] = {}
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:") and values.startswith("TcpExt:"):
            counters.update(zip(names.split()[1:], map(int, values.split()[1:]), strict=True))
    return counters


# Listen-queue overflows make connects wait for SYN retransmits (1 s, 3 s, ...).
_TCP_WATCHED = ("ListenOverflows", "ListenDrops", "TCPTimeouts")


def peak_rss_mib(pid: int) -> float:
    """VmHWM of pid and its live descendants in MiB, summed (a router with relay workers
    is several processes; a bound on their peak together); 0 when they are gone."""
    return sum(_status_mib(each, "VmHWM:") for each in _descendants(pid))


def _status_mib(pid: int, field: str) -> float:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return 0.0


def rss_mib(pid: int) -> float:
    """Current VmRSS of pid and its live descendants in MiB, summed."""
    return sum(_status_mib(each, "VmRSS:") for each in _descendants(pid))


# --- processes ------------------------------------------------------------------------


@dataclass
class Server:
    """One started `narwhal sim` or `narwhal serve`."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def peak_rss_mib(self) -> float:
        return peak_rss_mib(self.pid)

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(
                f"{self.name} (pid {self.pid}) exited with {self.process.returncode}; "
                f"log {self.log_path}:\n{tail(self.log_path)}"
            )


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _stop(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM the process (by PID), wait, then SIGKILL it and any descendants left."""
    if process.poll() is not None:
        return
    family = _descendants(process.pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(5)
    for pid in family[1:]:  # descendants that outlived their parent
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class Processes(contextlib.AbstractContextManager["Processes"]):
    """Owns every process the script starts; stops them (last started first) on exit."""

    def __init__(self, keep_logs: bool = False) -> None:
        self.log_dir = Path(tempfile.mkdtemp(prefix="narwhal-perf-"))
        self._keep_logs = keep_logs
        self._started: list[subprocess.Popen[bytes]] = []

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # Ctrl-C during the stop loop must not leave a process behind: ignore it meanwhile.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            while self._started:
                _stop(self._started.pop())
        finally:
            signal.signal(signal.SIGINT, previous)
        if exc_type is not None or self._keep_logs:
            log(f"logs kept in {self.log_dir}")
        else:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def start(self, name: str, args: Sequence[str], timeout_s: float = 60.0) -> Server:
        """Start `python -m narwhal ARGS`, wait for its listening line, return it."""
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "wb") as out:
            process = subprocess.Popen(
                [*NARWHAL, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the script only; it stops these
                preexec_fn=_raise_nofile,
            )
        self._started.append(process)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = _LISTENING.search(log_path.read_text(errors="replace"))
            if match:
                return Server(name, process, match.group(1), log_path)
            if process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop_process(process)
        raise RuntimeError(f"{name} did not start ({' '.join(args)}):\n{tail(log_path)}")

    def start_foreign(self, name: str, argv: Sequence[str], url: str, ready_path: str) -> Server:
        """Start another program (a peer router) that serves `url`, and wait until
        GET url + ready_path answers 200."""
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "wb") as out:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_raise_nofile,
            )
        self._started.append(process)
        server = Server(name, process, url, log_path)
        wait_http(url + ready_path, server)
        return server

    def stop(self, server: Server) -> None:
        self.stop_process(server.process)

    def stop_process(self, process: subprocess.Popen[bytes]) -> None:
        _stop(process)
        if process in self._started:
            self._started.remove(process)

    def sim(self, name: str, *flags: str) -> Server:
        """`narwhal sim --host 127.0.0.1 --port 0 FLAGS`."""
        server = self.start(name, ["sim", "--host", HOST, "--port", "0", *flags])
        wait_http(f"{server.url}/v1/models", server)
        return server

    def router(self, name: str, config: Path) -> Server:
        """`narwhal serve --config FILE`, waited for until /ready answers 200."""
        server = self.start(name, ["serve", "--config", str(config)])
        wait_http(f"{server.url}/ready", server)
        return server


def wait_http(url: str, server: Server, timeout_s: float = 30.0) -> None:
    """Poll GET url until it answers 200."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        server.check_alive()
        with (
            contextlib.suppress(OSError, urllib.error.URLError),
            urllib.request.urlopen(url, timeout=2) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout_s} s:\n{tail(server.log_path)}")


def http_get_text(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        body: bytes = response.read()
    return body.decode()


# --- router configuration ---------------------------------------------------------------


@dataclass(frozen=True)
class EngineSpec:
    name: str
    url: str
    role: str = "both"  # both | prefill | decode


def write_router_config(
    path: Path,
    engines: Sequence[EngineSpec],
    *,
    policy: str = "load",
    model: str = MODEL,
) -> Path:
    """A router config: loopback, ephemeral port, admission open, generous limits."""
    config = {
        "model": model,
        "serving": {
            "host": HOST,
            "port": 0,
            "max_retained": GENEROUS_LIMIT,
            "request_timeout_s": 600,
        },
        "admission": {
            "mode": "open",
            "queue_limit": GENEROUS_LIMIT,
            "phase_concurrency": {"prefill": GENEROUS_LIMIT, "decode": GENEROUS_LIMIT},
        },
        "engines": [
            {"name": e.name, "url": e.url, "dialect": "vllm", "role": e.role} for e in engines
        ],
        "fleet": {"policy": policy},
    }
    # JSON is YAML: no second serializer needed.
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def router_outcomes(router: Server) -> dict[str, float]:
    """narwhal_outcomes_total by outcome, from the router's /metrics."""
    outcomes: dict[str, float] = {}
    pattern = re.compile(r'^narwhal_outcomes_total\{outcome="([^"]+)"\}\s+(\S+)', re.M)
    for outcome, value in pattern.findall(http_get_text(f"{router.url}/metrics")):
        outcomes[outcome] = float(value)
    return outcomes


def outcome_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """Outcomes counted between two scrapes, zero entries left out."""
    delta = {k: int(after.get(k, 0) - before.get(k, 0)) for k in after.keys() | before.keys()}
    return {k: v for k, v in sorted(delta.items()) if v}


# --- bench --------------------------------------------------------------------------------


@dataclass
class BenchRun:
    """One `narwhal bench` run and the CPU the watched processes spent during it."""

    label: str
    summary: dict[str, Any]  # the (single) stage's summary from --json
    stage: dict[str, Any]  # the stage without its per-request list
    warmup: int
    wall_s: float
    cpu_s: dict[str, float] = field(default_factory=dict)  # name -> CPU s over the run
    peak_rss_mib: dict[str, float] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)  # router outcomes over the run
    peaks: dict[str, float] = field(default_factory=dict)  # max of each sampled gauge
    # Busy cores of the whole host during the run, and the part no process of this run
    # (watched servers, the bench, this script) accounts for: other work on the machine.
    host_busy_cores: float = 0.0
    other_cores: float = 0.0
    tcp: dict[str, int] = field(default_factory=dict)  # _TCP_WATCHED counters over the run
    error_samples: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)  # per request, if kept

    @property
    def requests(self) -> int:
        return int(self.summary["requests"])

    @property
    def errors(self) -> int:
        return int(self.summary["errors"])

    def cpu_ms_per_request(self, name: str) -> float:
        """CPU of `name` over the whole run (warm-up included) per request sent."""
        return 1e3 * self.cpu_s.get(name, 0.0) / max(1, self.requests + self.warmup)

    def ms(self, metric: str, quantile: str) -> float:
        return 1e3 * float(self.summary[metric][quantile])

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "summary": self.summary,
            "stage": self.stage,
            "warmup": self.warmup,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "peak_rss_mib": self.peak_rss_mib,
            "router_outcomes": self.outcomes,
            "peaks": self.peaks,
            "host_busy_cores": self.host_busy_cores,
            "other_cores": self.other_cores,
            "tcp": self.tcp,
            "error_samples": self.error_samples,
        }


def run_bench(
    label: str,
    urls: Sequence[str],
    args: Sequence[str],
    *,
    watch: Sequence[Server] = (),
    router: Server | None = None,
    warmup: int,
    timeout_s: float,
    work_dir: Path,
    sample: Callable[[], dict[str, float]] | None = None,
    sample_every_s: float = 1.0,
    keep_requests: bool = False,
) -> BenchRun:
    """Run `narwhal bench --url ... --warmup N ARGS --json FILE` and load its summary.

    `watch` processes are measured (CPU, VmHWM) before and after; `router` also has its
    outcome counters scraped. While the bench runs, `sample` (if given) is called every
    sample_every_s and the maximum of each value it returns is kept (`BenchRun.peaks`).
    The bench is killed after timeout_s (its own --duration and --timeout should make it
    stop well before). `keep_requests` keeps the stage's per-request records
    (`BenchRun.records`, each with `start_s` from the stage's start).
    """
    json_path = work_dir / f"bench-{label}-{time.monotonic_ns()}.json"
    log_path = json_path.with_suffix(".log")
    command = [*NARWHAL, "bench", "--model", MODEL, "--warmup", str(warmup)]
    for url in urls:
        command += ["--url", url]
    command += [*args, "--json", str(json_path)]
    for server in watch:
        server.check_alive()
    before_outcomes = router_outcomes(router) if router else {}
    cpu_before = {s.name: s.cpu_seconds() for s in watch}
    host_before = host_busy_seconds()
    tcp_before = tcp_counters()
    ours_before = children_cpu_seconds() + self_cpu_seconds()
    started = time.monotonic()
    with open(log_path, "wb") as out:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_raise_nofile,
        )
        peaks: dict[str, float] = {}
        try:
            returncode = _wait_sampling(process, started + timeout_s, sample, sample_every_s, peaks)
        except subprocess.TimeoutExpired:
            _stop(process)
            raise RuntimeError(f"bench {label} still running after {timeout_s} s") from None
        except BaseException:
            _stop(process)
            raise
    wall_s = time.monotonic() - started
    cpu_after = {s.name: s.cpu_seconds() for s in watch}
    host_s = host_busy_seconds() - host_before
    tcp_after = tcp_counters()
    ours_s = children_cpu_seconds() + self_cpu_seconds() - ours_before
    ours_s += sum(cpu_after[name] - cpu_before[name] for name in cpu_before)
    if returncode != 0 or not json_path.exists():
        raise RuntimeError(f"bench {label} failed ({returncode}):\n{tail(log_path)}")
    data = json.loads(json_path.read_text())
    if len(data["stages"]) != 1:
        raise RuntimeError(f"bench {label}: expected one stage, got {len(data['stages'])}")
    stage = data["stages"][0]
    stage_only = {k: v for k, v in stage.items() if k != "requests"}
    run = BenchRun(
        label=label,
        summary=stage["summary"],
        stage=stage_only,
        warmup=warmup,
        wall_s=wall_s,
        cpu_s={name: cpu_after[name] - cpu_before[name] for name in cpu_before},
        peak_rss_mib={s.name: s.peak_rss_mib() for s in watch},
        outcomes=outcome_delta(before_outcomes, router_outcomes(router)) if router else {},
        peaks=peaks,
        error_samples=data.get("error_samples") or {},
        host_busy_cores=host_s / wall_s,
        other_cores=max(0.0, host_s - ours_s) / wall_s,
        tcp={k: tcp_after.get(k, 0) - tcp_before.get(k, 0) for k in _TCP_WATCHED},
    )
    if keep_requests:
        began = float(stage.get("started_s") or 0.0)
        run.records = [dict(r, start_s=r["start_s"] - began) for r in stage["requests"]]
    json_path.unlink()  # per-request results are large; the summary is kept in BenchRun
    if run.errors:
        log(f"  {label}: {run.errors} errors {run.summary['error_counts']}")
    if run.tcp.get("ListenOverflows"):
        log(f"  {label}: TCP listen-queue overflows during the run: {run.tcp}")
    if run.other_cores > OTHER_LOAD_WARNING:
        log(f"  {label}: other work on the host used {run.other_cores:.2f} cores meanwhile")
    return run


def _wait_sampling(
    process: subprocess.Popen[bytes],
    deadline: float,
    sample: Callable[[], dict[str, float]] | None,
    every_s: float,
    peaks: dict[str, float],
) -> int:
    """Wait for process until deadline (TimeoutExpired after it), sampling meanwhile."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise subprocess.TimeoutExpired(process.args, 0)
        try:
            return process.wait(min(every_s, remaining))
        except subprocess.TimeoutExpired:
            pass
        if sample is not None:
            with contextlib.suppress(OSError, ValueError):
                for key, value in sample().items():
                    peaks[key] = max(value, peaks.get(key, value))


def gauge(url: str, name: str) -> float:
    """Sum of every sample of metric `name` in the Prometheus text at url."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})?\s+(\S+)", re.M)
    return sum(float(value) for value in pattern.findall(http_get_text(url, timeout_s=2)))


# --- reporting ------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def median_of(runs: Sequence[BenchRun], value: Callable[[BenchRun], float]) -> float:
    return median([value(run) for run in runs])


def fmt(value: float, digits: int = 1, signed: bool = False) -> str:
    if value != value:  # NaN
        return "-"
    return f"{value:+,.{digits}f}" if signed else f"{value:,.{digits}f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table; the first column left-aligned, the rest right-aligned."""
    align = ["---"] + ["--:"] * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(payload, indent=2) + "\n")
        log(f"raw results in {path}")


@contextlib.contextmanager
def stopwatch(what: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        log(f"{what}: {time.monotonic() - started:.1f} s")
