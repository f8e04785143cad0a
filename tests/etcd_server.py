"""A real etcd for tests: one member on free loopback ports, in a temporary data directory.

Started with short heartbeat and election timeouts so that etcd accepts the lease TTLs
of 1-3 s the tests use (etcd's minimum TTL follows its election timeout). It can be
stopped and started again on the same ports and data, or paused with SIGSTOP.

Where the `etcd` binary is missing, tests that need it are skipped, except in CI (the
`CI` environment variable set), where a missing etcd is a failure: `.ci/run` installs it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def etcd_binary() -> str:
    found = shutil.which("etcd")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("etcd is not installed (Debian: apt-get install etcd-server)")
        pytest.skip("etcd is not installed (Debian: apt-get install etcd-server)")
    return found


class EtcdServer:
    def __init__(self, binary: str, data_dir: str) -> None:
        self._binary = binary
        self._data_dir = data_dir
        self.client_port = _free_port()
        self.peer_port = _free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        self._proc = subprocess.Popen(
            [
                self._binary,
                "--name=test",
                f"--data-dir={self._data_dir}",
                f"--listen-client-urls={self.url}",
                f"--advertise-client-urls={self.url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=test={peer}",
                "--heartbeat-interval=50",
                "--election-timeout=250",
                "--log-level=error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self._proc.returncode}")
            if self.healthy():
                return
            time.sleep(0.05)
        raise RuntimeError("etcd did not become healthy")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=0.5) as response:
                return b'"true"' in response.read()
        except (OSError, urllib.error.URLError):
            return False

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def pause(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)


@contextmanager
def etcd_server() -> Iterator[EtcdServer]:
    binary = etcd_binary()
    with tempfile.TemporaryDirectory(prefix="narwhal-etcd-") as data_dir:
        server = EtcdServer(binary, data_dir)
        server.start()
        try:
            yield server
        finally:
            server.stop()
