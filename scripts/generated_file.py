"""The command line of a script that builds a checked-in file (the Grafana dashboard, the
PrometheusRule): write it, or with `--check` say whether the checked-in copy is what the
script builds (tests/deploy runs the check, so an edit by hand cannot drift)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def write_or_check(output: Path, text: str, *, script: str, description: str) -> int:
    """The exit status: 0, or 1 when `--check` finds `output` differs from `text`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    if args.check:
        if not output.exists() or output.read_text() != text:
            print(f"{output} is not what {script} builds: run it", file=sys.stderr)
            return 1
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    return 0
