"""Start `narwhal` subcommands as real processes on ephemeral loopback ports, for tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import yaml

_URL = re.compile(rb"listening on (https?://[^\s\"]+)")


class NarwhalProcess:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, reader: threading.Thread) -> None:
        self.proc = proc
        self._reader = reader
        self.url = url
        self.pid = proc.pid

    def terminate(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


def _drain(stream: Any) -> None:
    for _ in iter(stream.readline, b""):
        pass


@contextmanager
def narwhal_process(
    args: Sequence[str],
    startup_timeout: float = 30.0,
    env: Mapping[str, str] | None = None,
    stderr_path: str | os.PathLike[str] | None = None,
) -> Iterator[NarwhalProcess]:
    """Run `python -m narwhal ARGS`, wait for its 'listening on URL' line, stop it afterwards.
    `env`: variables to set in the child's environment, besides this process's.
    `stderr_path`: a file to write the child's stderr (its log) to, for the test to read;
    without it the child's stderr is this process's."""
    child_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    stderr = None if stderr_path is None else open(stderr_path, "wb")  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "narwhal", *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=child_env,
        )
    finally:
        if stderr is not None:
            stderr.close()  # the child has its own descriptor for the file
    assert proc.stdout is not None
    url = None
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        match = _URL.search(line)
        if match:
            url = match.group(1).decode()
            break
    if url is None:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        raise RuntimeError(f"narwhal {' '.join(args)} did not start (exit {proc.returncode})")
    # Keep reading stdout so the child never blocks on a full pipe.
    reader = threading.Thread(target=_drain, args=(proc.stdout,), daemon=True)
    reader.start()
    process = NarwhalProcess(proc, url, reader)
    try:
        yield process
    finally:
        process.terminate()


def write_router_config(path: str | os.PathLike[str], config: dict[str, Any]) -> None:
    """Write a router configuration for tests: on loopback, an ephemeral port and, unless
    the test says otherwise, no shutdown delay (every test's router stops at its end)."""
    config = dict(config)
    serving = dict(config.get("serving", {}))
    serving.setdefault("host", "127.0.0.1")
    serving.setdefault("port", 0)
    serving.setdefault("shutdown_delay_s", 0)
    config["serving"] = serving
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f)


@contextmanager
def router_process(
    config: dict[str, Any],
    *extra: str,
    env: Mapping[str, str] | None = None,
    stderr_path: str | os.PathLike[str] | None = None,
    config_path: str | os.PathLike[str] | None = None,
) -> Iterator[NarwhalProcess]:
    """A router from a configuration mapping, on an ephemeral port (`stderr_path`: see
    narwhal_process; `config_path`: where to write the file, for a test that rewrites it,
    by default a temporary file)."""
    if config_path is not None:
        write_router_config(config_path, config)
        with narwhal_process(
            ["serve", "--config", str(config_path), *extra], env=env, stderr_path=stderr_path
        ) as process:
            yield process
        return
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        path = f.name
    write_router_config(path, config)
    try:
        with narwhal_process(
            ["serve", "--config", path, *extra], env=env, stderr_path=stderr_path
        ) as process:
            yield process
    finally:
        os.unlink(path)
