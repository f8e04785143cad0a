"""One router on N cores: relay workers and their decision process (`serving.workers`).

`narwhal serve` with `serving.workers` above 1 becomes this supervisor. It starts:

- the decision process (`serve --role decision`): the whole router but its client port
  (every decision, the fleet monitor, the profiler, HA, `/admin`, `/ready` and the merged
  `/metrics`), serving its core to the workers on a Unix socket (`narwhal.transport`)
  and its HTTP routes on another, in a directory of this process's own (mode 0700);
- N relay workers (`serve --role worker`, `narwhal.relay_worker`), each bound to the
  client port with SO_REUSEPORT (the kernel spreads connections over them) once it has
  reached the decision process.

The port is bound here first and held, never listening, so that port 0 means one free
port for all of them and nobody takes it between their binds. The router is announced
(`narwhal listening on ...`) once every worker is connected.

It then watches them: a worker or the decision process that exits is started again (a
dead worker loses its own streams, and the decision process releases what they held; a
dead decision process stops admission, the workers answering 503 until it is back, while
their streams run on). One that exits before the router was first announced ends the
start: everything stops, with its exit status (a configuration error says why itself).
SIGTERM and SIGINT go to every process, which shut down as a single router does;
SIGHUP too: the decision process reloads the file for the router (and answers for it),
each worker takes what it needs of it (limits, a connection to each engine added).
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Final

from narwhal.api.listen import bind_sockets, listening_url
from narwhal.config import Config
from narwhal.observability.logs import announcement

log = logging.getLogger("narwhal.supervisor")

# How long the decision process may take to start (its engines' first round and, with
# predictive admission, their first profiles) and the workers to connect.
START_WAIT_S: Final = 180.0
_RESTART_S: Final = (0.1, 0.5, 1.0, 2.0, 5.0)
_POLL_S: Final = 0.05


def core_socket_in(runtime_dir: str) -> str:
    return os.path.join(runtime_dir, "core.sock")


def admin_socket_in(runtime_dir: str) -> str:
    return os.path.join(runtime_dir, "admin.sock")


@dataclass
class _Child:
    role: str
    index: int
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = field(default=0.0)

    @property
    def name(self) -> str:
        return "decision process" if self.role == "decision" else f"relay worker {self.index}"


def run_supervisor(args: argparse.Namespace, config: Config) -> int:
    serving = config.serving
    held = bind_sockets(serving.host, serving.port, reuse_port=True)
    port = int(held[0].getsockname()[1])
    runtime = tempfile.mkdtemp(prefix="narwhal-")
    try:
        return _Supervisor(args, config, runtime, port).run()
    finally:
        for sock in held:
            sock.close()
        shutil.rmtree(runtime, ignore_errors=True)


class _Supervisor:
    def __init__(self, args: argparse.Namespace, config: Config, runtime: str, port: int) -> None:
        self._config = config
        self._runtime = runtime
        self._port = port
        self._command = [sys.executable, "-m", "narwhal", "serve", *_flags(args, port)]
        self._decision = _Child("decision", 0)
        self._workers = [_Child("worker", i) for i in range(config.serving.workers)]
        self._stopping = False
        self._announced = False

    @property
    def _children(self) -> list[_Child]:
        return [self._decision, *self._workers]

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        signal.signal(signal.SIGHUP, self._reload)
        self._start(self._decision)
        status = self._wait_for(lambda: os.path.exists(admin_socket_in(self._runtime)))
        if status is None:
            for worker in self._workers:
                self._start(worker)
            status = self._wait_for(lambda: self._connected() >= len(self._workers))
        if status is not None:
            self._stop_all()
            return status
        if self._stopping:
            return self._stop_all()
        self._announce()
        while not self._stopping:
            time.sleep(_POLL_S)
            for child in self._children:
                if child.proc is not None and child.proc.poll() is not None:
                    self._restart(child)
        return self._stop_all()

    # --- the children -------------------------------------------------------------------

    def _start(self, child: _Child) -> None:
        command = [*self._command, "--role", child.role, "--runtime-dir", self._runtime]
        child.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        child.started_at = time.monotonic()

    def _restart(self, child: _Child) -> None:
        assert child.proc is not None
        code = child.proc.returncode
        pause = _RESTART_S[min(child.restarts, len(_RESTART_S) - 1)]
        if time.monotonic() - child.started_at > 60.0:
            child.restarts = 0  # it had run a while: not a crash loop
            pause = _RESTART_S[0]
        log.error("%s exited (status %s): starting it again in %g s", child.name, code, pause)
        time.sleep(pause)
        if not self._stopping:
            child.restarts += 1
            self._start(child)

    def _wait_for(self, ready: Callable[[], bool]) -> int | None:
        """Until `ready()` or START_WAIT_S; the exit status of a child that ended first
        (or 2 when the wait ran out), None when ready or stopping."""
        deadline = time.monotonic() + START_WAIT_S
        while not self._stopping:
            if ready():
                return None
            for child in self._children:
                if child.proc is not None and child.proc.poll() is not None:
                    log.error("%s exited while the router started", child.name)
                    return child.proc.returncode or 2
            if time.monotonic() > deadline:
                log.error("the router did not start within %g s", START_WAIT_S)
                return 2
            time.sleep(_POLL_S)
        return None

    def _connected(self) -> int:
        """Relay workers connected to the decision process now (0 while unknown)."""
        connection = _UnixHTTP(admin_socket_in(self._runtime))
        try:
            connection.request("GET", "/_narwhal/workers")
            answer = connection.getresponse()
            return int(json.loads(answer.read()).get("connected", 0))
        except (OSError, ValueError, http.client.HTTPException):
            return 0
        finally:
            connection.close()

    def _announce(self) -> None:
        config = self._config
        url = listening_url(config.serving.host, self._port, config.serving.tls_cert is not None)
        log.info(
            "relay workers: %d, under one decision process (serving.workers)",
            len(self._workers),
        )
        print(
            announcement(f"narwhal listening on {url}", config.logging.format, url=url), flush=True
        )
        self._announced = True

    # --- signals ------------------------------------------------------------------------

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping:
            self._signal_all(signum)  # a second signal hurries every process, as in one
            return
        self._stopping = True
        self._signal_all(signum)

    def _reload(self, signum: int, frame: FrameType | None) -> None:
        self._signal_all(signal.SIGHUP)

    def _signal_all(self, signum: int) -> None:
        for child in self._children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signum)

    def _stop_all(self) -> int:
        """Every process told to stop (if not yet) and waited for; the exit status."""
        if self._announced:
            fmt = self._config.logging.format
            print(announcement("narwhal draining", fmt), flush=True)
        self._signal_all(signal.SIGTERM)
        serving = self._config.serving
        deadline = time.monotonic() + serving.shutdown_delay_s + serving.drain_timeout_s + 30
        for child in self._children:
            proc = child.proc
            if proc is None:
                continue
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("%s did not stop in time: killed", child.name)
                proc.kill()
                proc.wait()
        return 0


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("decision", timeout=2.0)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(2.0)
        sock.connect(self._path)
        self.sock = sock


def _flags(args: argparse.Namespace, port: int) -> list[str]:
    """The command line's flags again, for every process, with the port resolved."""
    flags = ["--config", args.config, "--port", str(port)]
    if args.host is not None:
        flags += ["--host", args.host]
    if args.log_level is not None:
        flags += ["--log-level", args.log_level]
    if args.log_format is not None:
        flags += ["--log-format", args.log_format]
    if args.no_access_log:
        flags.append("--no-access-log")
    if args.otlp_endpoint is not None:
        flags += ["--otlp-endpoint", args.otlp_endpoint]
    return flags
