"""Relay workers (Step 16): events/s and router CPU per request for `serving.workers` 1
and 2, with the router confined to one core and to two.

Streaming chat through the router to `--sims` `narwhal sim` engines at time-scale 0 (no
delays: the router is the work), `--requests` requests of `--tokens` tokens each (`ignore_eos`),
`--concurrency` in flight, per configuration `--reps` times (median). The router's
processes (with workers: the supervisor, the decision process and the workers) are
pinned with `sched_setaffinity` to the cores named (`--cores`, as `taskset -c` takes
them); the sim and the client are not pinned, and on a 2-core machine they share the
cores with the router, so read the ratios between configurations of one run, not the
rates. Admission is open (the decision is the cheap part here: `scripts/perf/decision.py`
prices the core and its transport alone).

    python scripts/perf/workers.py [--requests 2000] [--concurrency 64] [--tokens 64]
        [--cores 0 0,1] [--workers 1 2] [--reps 3] [--json OUT]

Figures, not assertions (README "Current figures").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import harness
from harness import EngineSpec, Processes

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def pin(pid: int, cores: set[int]) -> int:
    """Every thread of `pid` and its descendants on `cores`; how many processes."""
    pinned = 0
    for each in harness._descendants(pid):
        with contextlib.suppress(OSError):
            for thread in os.listdir(f"/proc/{each}/task"):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(thread), cores)
            pinned += 1
    return pinned


def cores_of(text: str) -> set[int]:
    found: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--cores", nargs="+", default=["0", "0,1"])
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sims", type=int, default=2, help="engines (narwhal sim)")
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args()
    revision = harness.narwhal_revision()
    rows: list[list[str]] = []
    raw: list[dict[str, Any]] = []
    started = time.monotonic()
    bench_args = ["-n", str(args.requests), "-c", str(args.concurrency)]
    bench_args += ["--max-tokens", str(args.tokens), "--ignore-eos"]
    bench_args += ["--timeout", "120", "--duration", "120"]
    with Processes(keep_logs=args.keep_logs) as procs:
        sims = [procs.sim(f"sim{i}", "--time-scale", "0") for i in range(args.sims)]
        engines = [EngineSpec(f"e{i}", sim.url) for i, sim in enumerate(sims)]
        for cores in args.cores:
            for workers in args.workers:
                path = procs.log_dir / f"router-{workers}.yaml"
                harness.write_router_config(path, engines)
                config = json.loads(path.read_text())
                config["serving"]["workers"] = workers
                path.write_text(json.dumps(config))
                router = procs.router(f"narwhal-w{workers}-c{cores}", path)
                pinned = pin(router.process.pid, cores_of(cores))
                runs = []
                for rep in range(args.reps):
                    runs.append(
                        harness.run_bench(
                            f"w{workers}-c{cores}-{rep}",
                            [router.url],
                            bench_args,
                            watch=[router],
                            router=router,
                            warmup=args.concurrency,
                            timeout_s=300,
                            work_dir=procs.log_dir,
                        )
                    )
                procs.stop(router)
                rate = harness.median([float(r.summary["requests_per_s"]) for r in runs])
                cpu = harness.median([r.cpu_ms_per_request(router.name) for r in runs])
                ttft = harness.median([r.ms("ttft_s", "p50") for r in runs])
                errors = sum(r.errors for r in runs)
                rows.append(
                    [
                        cores,
                        str(workers),
                        str(pinned),
                        f"{rate:,.0f}",
                        f"{rate * args.tokens:,.0f}",
                        f"{cpu:.3f}",
                        f"{ttft:.1f}",
                        str(errors),
                    ]
                )
                raw.append(
                    {
                        "cores": cores,
                        "workers": workers,
                        "runs": [r.to_json() for r in runs],
                    }
                )
    print(
        f"## Relay workers: {args.requests} streamed requests of {args.tokens} tokens, "
        f"c={args.concurrency}, median of {args.reps}\n"
    )
    print(harness.stamp(revision) + "\n")
    print(
        harness.table(
            [
                "router cores",
                "workers",
                "router processes",
                "req/s",
                "events/s",
                "router CPU ms/request",
                "TTFT p50 ms",
                "errors",
            ],
            rows,
        )
    )
    print(f"\ntotal run time {time.monotonic() - started:.0f} s")
    if args.json:
        harness.write_json(args.json, {"args": vars(args), "runs": raw})
    return 0


if __name__ == "__main__":
    sys.exit(harness.run_main(main))
