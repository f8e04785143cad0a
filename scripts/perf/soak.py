"""Soak: ten minutes (by default) of mixed traffic, hostile clients and engine restarts.

The same soak as `tests/e2e/test_soak.py` (which runs it for 60 s in CI), for longer,
with its report printed: what clients saw, what the router counted, RSS and descriptors
over the run, tasks before and after, and the event loop's lag. It ends with the same
checks (`SoakReport.check`), so a leak fails the run.

    python scripts/perf/soak.py [--seconds 600] [--concurrency 24] [--restarts 6] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.soak import run_soak, soak_fleet


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--restarts", type=int, default=6)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()
    with soak_fleet() as (router, sims):
        report = asyncio.run(
            run_soak(router, sims, args.seconds, args.concurrency, restarts=args.restarts)
        )
    summary = report.summary()
    rss = [round(s.rss_mib, 1) for s in report.samples]
    fds = [s.fds for s in report.samples]
    summary["rss_mib_by_tenth"] = rss[:: max(1, len(rss) // 10)]
    summary["fds_by_tenth"] = fds[:: max(1, len(fds) // 10)]
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    report.check()
    print("checks passed: every request counted once, nothing held, nothing leaked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
