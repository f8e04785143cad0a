"""Run the project's checks in order: ruff, mypy, pytest. Extra arguments go to pytest."""

import subprocess
import sys


def run(*cmd: str) -> None:
    print("+", " ".join(cmd), flush=True)
    code = subprocess.call([sys.executable, "-m", *cmd])
    if code != 0:
        sys.exit(code)


run("ruff", "check", "src", "tests", "scripts")
run("ruff", "format", "--check", "src", "tests", "scripts")
run("mypy")
run("pytest", *sys.argv[1:])
