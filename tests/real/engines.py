"""Real inference engines (vLLM's CPU build, `transformers serve`) as processes on loopback,
for the tests in tests/real: found in the venv that scripts/install_engines.sh makes, each
started in a process group of its own with its log in a file, waited for on /health within a
bound, and killed with its group (vLLM's engine core is a child process) at the end."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.real import model

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("NARWHAL_ENGINES_VENV") or ROOT / ".venv-engines")
STAMP = VENV / "narwhal-engines.stamp"
PYTHON = VENV / "bin" / "python"
# vLLM measured 18-26 s from start to /health here alone; under a parallel test run on two
# cores shared with other work it has taken 80 s and more (its imports alone).
START_TIMEOUT_S = 240.0
# Where scripts/check.py's caller (scripts/test) installs the engines while the tests run:
# the file their install writes its exit status to. The real-engine tests wait for it.
INSTALL_RC = os.environ.get("NARWHAL_ENGINES_RC")
INSTALL_WAIT_S = 1200.0  # two pip steps of install_engines.sh's 900 s at most, and more
# pytest-timeout's limit for a real-engine test: its setup may wait for the install and
# start an engine.
TEST_TIMEOUT_S = START_TIMEOUT_S + 180 + (INSTALL_WAIT_S if INSTALL_RC else 0)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def wait_for_install() -> None:
    """While the engines' install still runs beside the tests, wait for its end."""
    if not INSTALL_RC:
        return
    rc = Path(INSTALL_RC)
    deadline = time.monotonic() + INSTALL_WAIT_S
    while not (rc.is_file() and rc.read_text().strip()):
        if time.monotonic() > deadline:
            pytest.fail(f"the engines' install did not end within {INSTALL_WAIT_S:.0f} s")
        time.sleep(0.5)


def require_engines() -> None:
    """Skip (fail under CI=true: CI must run this tier) when the engines are not installed."""
    wait_for_install()
    if STAMP.is_file() and PYTHON.is_file():
        return
    reason = f"the real engines are not installed in {VENV}: run scripts/install_engines.sh"
    if in_ci():
        pytest.fail(reason + " (CI=true: scripts/test installs them; see its output)")
    pytest.skip(reason)


def built_model() -> Path:
    """The tiny test model's directory, built (once, then cached) by the engines' Python."""
    require_engines()
    return model.ensure_built(str(PYTHON))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EngineProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    started_s: float  # from start to a 200 on /health

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log, lines)


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the whole group, then SIGKILL to what is left after a grace period."""
    if proc.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(20)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # children (vLLM's engine core) too
    proc.wait()


@contextmanager
def engine_process(
    name: str,
    argv: Sequence[str],
    env: dict[str, str],
    log_dir: Path,
    port: int,
    timeout: float = START_TIMEOUT_S,
) -> Iterator[EngineProcess]:
    """Run `argv` (an engine listening on 127.0.0.1:`port`) until the end of the block; the
    start fails with the log's tail when /health is not 200 within `timeout` seconds."""
    log = log_dir / f"{name}.log"
    url = f"http://127.0.0.1:{port}"
    # Bytecode written (scripts/install_engines.sh installs without it): the modules an
    # engine imports are compiled by its first start, not by every one.
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    child_env.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env,
            start_new_session=True,  # its own group, killed whole at the end
        )
    try:
        deadline = started + timeout
        while not _healthy(url):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited ({proc.returncode}) before /health; its log ({log}):\n"
                    + tail(log)
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{name} gave no 200 on /health within {timeout:.0f}s; its log ({log}):\n"
                    + tail(log)
                )
            time.sleep(0.25)
        yield EngineProcess(proc, url, log, time.monotonic() - started)
    finally:
        _stop(proc)


def _offline_env(home: Path) -> dict[str, str]:
    """Nothing from a hub: offline, with Hugging Face's caches in the test's own folder."""
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(home / "hf"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


@contextmanager
def vllm_engine(
    model_dir: Path,
    log_dir: Path,
    *,
    served_name: str,
    core: int = 0,
    max_model_len: int = 2048,
    extra: Sequence[str] = (),
) -> Iterator[EngineProcess]:
    """vLLM's OpenAI server on one CPU core with 1 GiB of KV cache, float32, eager (the
    fastest start), with vLLM's `hermes` tool parser."""
    port = free_port()
    argv = [
        str(PYTHON), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", served_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len),
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        *extra,
    ]  # fmt: skip
    env = {
        **_offline_env(log_dir),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(core),
    }
    with engine_process(f"vllm-{port}", argv, env, log_dir, port) as engine:
        yield engine


@contextmanager
def transformers_engine(
    model_dir: Path, log_dir: Path, *, continuous_batching: bool
) -> Iterator[EngineProcess]:
    """`transformers serve` pinned to the model (its requests must name the model by its
    path, which is then the router's `model`), on CPU in float32. With continuous batching
    its KV cache is bounded here (256 blocks of 32 tokens): by default it takes a share of
    the machine's memory, 20 GiB of this one's."""
    port = free_port()
    argv = [
        str(VENV / "bin" / "transformers"), "serve", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32",
    ]  # fmt: skip
    if continuous_batching:
        argv += ["--continuous-batching", "--cb-block-size", "32", "--cb-num-blocks", "256"]
        argv += ["--cb-max-batch-tokens", "512"]
    else:
        argv.append("--no-continuous-batching")
    env = {**_offline_env(log_dir), "OMP_NUM_THREADS": "1"}
    mode = "cb" if continuous_batching else "nocb"
    with engine_process(f"transformers-{mode}-{port}", argv, env, log_dir, port) as engine:
        yield engine
