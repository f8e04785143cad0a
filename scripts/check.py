"""Run the project's checks in order: ruff, mypy, pytest. Extra arguments go to pytest.

pytest runs in parallel processes (pytest-xdist, `--dist loadgroup`: each real-engine
group of tests stays on one worker, which owns its engines), NARWHAL_TEST_WORKERS of them
(default 3: most tests wait on sockets and timers, not on the two cores; a fourth, beside
a real vLLM, slowed the machine enough to make timing-bound tests flake), then the tests
marked `alone` (they measure their own wall-clock timing) in one process with nothing
beside them. Arguments that choose the workers or marks themselves (-n, -p no:xdist, -m)
make it one pytest run, as given. The parallel run keeps the collection's order
(--no-loadscope-reorder), in which tests/conftest.py puts the real engines' groups
after the end-to-end tests.

With --engines-rc FILE first (scripts/test, which starts scripts/install_engines.sh before
anything else, its output in .venv-engines.log; FILE is where it writes its exit status),
pytest does not wait for the install: the tests that need no real engine run beside it,
and the real-engine tests wait for FILE themselves (NARWHAL_ENGINES_RC,
tests/real/engines.py), so the minutes of the install overlap the suite instead of coming
before it. The install's end is reported after pytest; one that failed does not stop the
run: the real-engine tests then fail under CI=true and are skipped elsewhere.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINES_LOG = ROOT / ".venv-engines.log"


def run(*cmd: str) -> None:
    print("+", " ".join(cmd), flush=True)
    code = subprocess.call([sys.executable, "-m", *cmd])
    if code != 0:
        sys.exit(code)


def wait_engines_rc(rc_file: Path, started: float) -> None:
    """Wait for the exit status of the install scripts/test started."""
    while not rc_file.exists() or not rc_file.read_text().strip():
        time.sleep(0.5)
    code = int(rc_file.read_text())
    # (The log may be missing or empty: the engines installed by hand, say.)
    log = ENGINES_LOG.read_text(errors="replace") if ENGINES_LOG.exists() else ""
    lines = log.splitlines() or ["(no output)"]
    if code == 0:
        print(f"+ engines ready ({time.monotonic() - started:.0f}s): {lines[-1]}", flush=True)
        return
    print(f"! the engines' install failed (exit {code}); the end of {ENGINES_LOG.name}:")
    print("\n".join(lines[-30:]), flush=True)


def pytest_runs(args: list[str]) -> list[list[str]]:
    """The pytest runs for `args`: the tests in parallel workers, then those marked `alone`
    (they time themselves) in this process; one run as given when the arguments choose the
    workers or the marks themselves."""
    chooses_workers = any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in args)
    if chooses_workers or "no:xdist" in args or any(a.startswith("-m") for a in args):
        return [args]
    workers = os.environ.get("NARWHAL_TEST_WORKERS", "3")
    return [
        ["-n", workers, "--dist", "loadgroup", "--no-loadscope-reorder", "-m", "not alone", *args],
        ["-n", "0", "-m", "alone", *args],
    ]


def run_pytest(args: list[str]) -> None:
    """Each run in turn; a run that selected no test (exit 5) is fine while another ran some."""
    codes = []
    for run_args in pytest_runs(args):
        cmd = ["pytest", *run_args]
        print("+", " ".join(cmd), flush=True)
        codes.append(subprocess.call([sys.executable, "-m", *cmd]))
    failed = [c for c in codes if c not in (0, 5)]
    if failed:
        sys.exit(failed[0])
    if all(c == 5 for c in codes):
        sys.exit(5)


args = sys.argv[1:]
rc_file = None
started = time.monotonic()
if args[:1] == ["--engines-rc"]:
    rc_file, args = ROOT / args[1], args[2:]
run("ruff", "check", "src", "tests", "scripts")
run("ruff", "format", "--check", "src", "tests", "scripts")
run("mypy")
if rc_file is not None:
    os.environ["NARWHAL_ENGINES_RC"] = str(rc_file)
    if not rc_file.exists():
        print("+ the engines' install goes on beside the tests (the real ones wait)", flush=True)
try:
    run_pytest(args)
finally:
    if rc_file is not None:
        wait_engines_rc(rc_file, started)
