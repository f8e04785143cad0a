"""Running the README's shell snippets as a reader would: in a directory that looks like the
checkout, with `narwhal` on the PATH, bounded in time, and with nothing left running.

A snippet runs under `bash -e` in a process group of its own, so that every process it
starts in the background (`narwhal sim ... &`) can be found afterwards: a snippet must stop
what it started, and whatever is still there once it has had time to drain is killed and
reported.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import narwhal

REPO = Path(__file__).resolve().parent.parent
_PORT = re.compile(r"(?:--port[ =]|127\.0\.0\.1:|localhost:)(\d{2,5})\b")
_NOT_LINKED = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


@dataclass(frozen=True)
class ShellRun:
    returncode: int
    stdout: str
    stderr: str
    left_running: bool  # processes of the snippet were still alive after it ended

    def describe(self) -> str:
        return (
            f"exit status {self.returncode}\n--- stdout\n{self.stdout[-6000:]}\n"
            f"--- stderr\n{self.stderr[-6000:]}"
        )


def checkout_like(directory: Path) -> Path:
    """A directory holding links to the checkout's files (examples/, scripts/, ...), where
    a snippet may write what it likes without touching the checkout."""
    directory.mkdir(parents=True, exist_ok=True)
    for entry in REPO.iterdir():
        if entry.name not in _NOT_LINKED:
            (directory / entry.name).symlink_to(entry)
    return directory


def environment_with_narwhal(bin_dir: Path) -> dict[str, str]:
    """This process's environment with a `narwhal` command first on the PATH that runs the
    narwhal under test, whichever way it is installed (editable, or sources on
    PYTHONPATH)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    command = bin_dir / "narwhal"
    command.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m narwhal "$@"\n', encoding="utf-8")
    command.chmod(0o755)
    source_root = str(Path(narwhal.__file__).resolve().parent.parent)
    python_path = os.pathsep.join(filter(None, [source_root, os.environ.get("PYTHONPATH")]))
    return dict(
        os.environ,
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH=python_path,
        PYTHONUNBUFFERED="1",
    )


def ports_named(text: str) -> set[int]:
    """The loopback ports a snippet listens on or connects to, as it writes them."""
    return {int(port) for port in _PORT.findall(text)}


def busy(ports: Iterable[int]) -> list[int]:
    """Those of `ports` that something on this machine listens on now. SO_REUSEADDR as
    Narwhal's own sockets have it, so a port a finished test left in TIME_WAIT is free."""
    taken = []
    for port in sorted(ports):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                taken.append(port)
    return taken


def run_shell(
    script: str,
    cwd: Path,
    env: Mapping[str, str],
    *,
    timeout: float,
    drain: float = 15.0,
) -> ShellRun:
    """Run `script` with `bash -e -o pipefail` in `cwd` (exit status -1: still running
    after `timeout` seconds); after it ends, give what it left `drain` seconds to exit (a
    router stopped by the snippet drains first), then kill its process group."""
    path = cwd / ".snippet.sh"
    path.write_text(script, encoding="utf-8")
    out_path, err_path = cwd / ".snippet.out", cwd / ".snippet.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", str(path)],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    group = proc.pid
    try:
        returncode = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        returncode = -1  # everything is killed at once below
    left_running = returncode != -1 and _group_alive(group) and not _wait_group(group, drain)
    _kill_group(group)
    proc.wait()
    return ShellRun(
        returncode=returncode,
        stdout=out_path.read_text(encoding="utf-8", errors="replace"),
        stderr=err_path.read_text(encoding="utf-8", errors="replace"),
        left_running=left_running,
    )


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a reused id that is not ours
        return False
    return True


def _wait_group(group: int, seconds: float) -> bool:
    """Whether every process of `group` exits within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _group_alive(group):
            return True
        time.sleep(0.1)
    return not _group_alive(group)


def _kill_group(group: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _group_alive(group):
            return
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        _wait_group(group, 5.0)
