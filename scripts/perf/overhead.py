"""Router overhead: the same load straight to a simulated engine and through Narwhal.

Throughput (engine never sleeps: `narwhal sim --time-scale 0`): streaming and non-streaming
chat, 64 output tokens with ignore_eos, closed loop at --concurrency, --requests per run,
warm-up = concurrency (every keep-alive connection opened before timing). Direct and
Narwhal runs alternate (the order flips every repetition) so a noisy neighbour hits both;
each figure is the median over --reps, and every ratio or difference is the median of the
per-repetition pairs. CPU per request is a process's CPU over the whole run (warm-up
included) divided by the requests sent; the client's is the bench's own figure.

Latency (`--time-scale 1`, the sim's default performance model, so TTFT and TPOT are
realistic): streaming, concurrency 256 → the TTFT and latency Narwhal adds when it is not
the bottleneck.

    python scripts/perf/overhead.py [--requests 2000] [--concurrency 64] [--reps 3]
                                    [--json OUT] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import harness
from harness import BenchRun, EngineSpec, Processes, Server, fmt, median, table

TOKENS = 64
TARGETS = ("direct", "narwhal")


def _bench_args(requests: int, concurrency: int, stream: bool, duration_s: float) -> list[str]:
    args = ["-n", str(requests), "-c", str(concurrency), "--max-tokens", str(TOKENS)]
    args += ["--ignore-eos", "--timeout", "120", "--duration", str(duration_s)]
    if not stream:
        args.append("--no-stream")
    return args


def _alternating(
    procs: Processes,
    sim: Server,
    router: Server,
    args: list[str],
    *,
    warmup: int,
    reps: int,
    tag: str,
    timeout_s: float,
) -> dict[str, list[BenchRun]]:
    runs: dict[str, list[BenchRun]] = {t: [] for t in TARGETS}
    for rep in range(reps):
        order = TARGETS if rep % 2 == 0 else TARGETS[::-1]
        for target in order:
            url = sim.url if target == "direct" else router.url
            run = harness.run_bench(
                f"{tag}-{target}-{rep}",
                [url],
                args,
                watch=[sim, router],
                router=router if target == "narwhal" else None,
                warmup=warmup,
                timeout_s=timeout_s,
                work_dir=procs.log_dir,
            )
            runs[target].append(run)
            s = run.summary
            harness.log(
                f"{tag} rep {rep + 1}/{reps} {target:7}: {s['requests_per_s']:8.1f} req/s "
                f"{s['events_per_s']:9.0f} ev/s ttft p50 {run.ms('ttft_s', 'p50'):7.2f} ms "
                f"p99 {run.ms('ttft_s', 'p99'):7.2f} ms errors {run.errors} "
                f"router {run.cpu_ms_per_request('narwhal'):.3f} ms/req"
            )
    return runs


def _paired(runs: dict[str, list[BenchRun]], value: Callable[[BenchRun, BenchRun], float]) -> float:
    """Median over repetitions of value(narwhal run, direct run)."""
    return median([value(n, d) for n, d in zip(runs["narwhal"], runs["direct"], strict=True)])


def _ratio(metric: str) -> Callable[[BenchRun, BenchRun], float]:
    def ratio(n: BenchRun, d: BenchRun) -> float:
        base = float(d.summary[metric])
        return float(n.summary[metric]) / base if base else float("nan")

    return ratio


def _added(metric: str, quantile: str) -> Callable[[BenchRun, BenchRun], float]:
    return lambda n, d: n.ms(metric, quantile) - d.ms(metric, quantile)


def _med(runs: Sequence[BenchRun], value: Callable[[BenchRun], float]) -> float:
    return harness.median_of(runs, value)


def throughput_rows(label: str, runs: dict[str, list[BenchRun]]) -> list[list[str]]:
    rows = []
    for target in TARGETS:
        rs = runs[target]
        is_router = target == "narwhal"
        req_s = _med(rs, lambda r: float(r.summary["requests_per_s"]))
        ev_s = _med(rs, lambda r: float(r.summary["events_per_s"]))
        req_ratio = _paired(runs, _ratio("requests_per_s")) if is_router else 1.0
        ev_ratio = _paired(runs, _ratio("events_per_s")) if is_router else 1.0
        rows.append(
            [
                f"{label}: {target}",
                f"{fmt(req_s)} ({req_ratio:.2f}x)",
                f"{fmt(ev_s, 0)} ({ev_ratio:.2f}x)" if ev_s else "-",
                fmt(_med(rs, lambda r: r.cpu_ms_per_request("narwhal")), 3) if is_router else "-",
                fmt(_med(rs, lambda r: r.cpu_ms_per_request("sim")), 3),
                fmt(_med(rs, lambda r: 1e3 * float(r.summary["client_cpu_per_request_s"])), 3),
                fmt(_med(rs, lambda r: r.ms("ttft_s", "p50")), 2),
                fmt(_med(rs, lambda r: r.ms("ttft_s", "p99")), 2),
                fmt(_paired(runs, _added("ttft_s", "p50")), 2, signed=True) if is_router else "-",
                fmt(_paired(runs, _added("ttft_s", "p99")), 2, signed=True) if is_router else "-",
                fmt(_paired(runs, _added("latency_s", "p50")), 2, signed=True)
                if is_router
                else "-",
                str(sum(r.errors for r in rs)),
                fmt(max(r.other_cores for r in rs), 2),
            ]
        )
    return rows


THROUGHPUT_HEADERS = [
    "scenario",
    "req/s (x direct)",
    "events/s (x direct)",
    "router CPU ms/req",
    "engine CPU ms/req",
    "client CPU ms/req",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "added TTFT p50 ms",
    "added TTFT p99 ms",
    "added latency p50 ms",
    "errors",
    "other load (cores, max)",
]


def latency_rows(runs: dict[str, list[BenchRun]]) -> list[list[str]]:
    rows = []
    for target in TARGETS:
        rs = runs[target]
        is_router = target == "narwhal"
        rows.append(
            [
                target,
                fmt(_med(rs, lambda r: float(r.summary["requests_per_s"]))),
                fmt(_med(rs, lambda r: r.ms("ttft_s", "p50")), 1),
                fmt(_med(rs, lambda r: r.ms("ttft_s", "p99")), 1),
                fmt(_med(rs, lambda r: r.ms("tpot_s", "p50")), 2),
                fmt(_med(rs, lambda r: r.ms("latency_s", "p50")), 1),
                fmt(_paired(runs, _added("ttft_s", "p50")), 1, signed=True) if is_router else "-",
                fmt(_paired(runs, _added("ttft_s", "p99")), 1, signed=True) if is_router else "-",
                fmt(_paired(runs, _added("latency_s", "p50")), 1, signed=True)
                if is_router
                else "-",
                fmt(_med(rs, lambda r: r.cpu_ms_per_request("narwhal")), 3) if is_router else "-",
                str(sum(r.errors for r in rs)),
                fmt(max(r.other_cores for r in rs), 2),
            ]
        )
    return rows


LATENCY_HEADERS = [
    "target",
    "req/s",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "TPOT p50 ms",
    "latency p50 ms",
    "added TTFT p50 ms",
    "added TTFT p99 ms",
    "added latency p50 ms",
    "router CPU ms/req",
    "errors",
    "other load (cores, max)",
]


def _outcomes(runs: dict[str, list[BenchRun]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for run in runs["narwhal"]:
        for outcome, count in run.outcomes.items():
            total[outcome] = total.get(outcome, 0) + count
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="throughput: per run")
    parser.add_argument("--concurrency", type=int, default=64, help="throughput: in flight")
    parser.add_argument("--reps", type=int, default=3, help="runs per target (median)")
    parser.add_argument("--latency-requests", type=int, default=2000)
    parser.add_argument("--latency-concurrency", type=int, default=256)
    parser.add_argument("--json", metavar="OUT", help="write every raw result here")
    parser.add_argument("--quick", action="store_true", help="tiny counts: a smoke check")
    parser.add_argument("--keep-logs", action="store_true", help="keep process logs")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.concurrency, args.reps = 200, 16, 1
        args.latency_requests, args.latency_concurrency = 64, 32
    started = time.monotonic()
    revision = harness.narwhal_revision()  # the code the processes load
    raw: dict[str, Any] = {"args": vars(args)}

    with Processes(keep_logs=args.keep_logs) as procs:
        # (a) throughput, engine without delays.
        sim = procs.sim("sim", "--time-scale", "0")
        config = harness.write_router_config(
            procs.log_dir / "router-throughput.yaml", [EngineSpec("e0", sim.url)]
        )
        router = procs.router("narwhal", config)
        throughput: dict[str, dict[str, list[BenchRun]]] = {}
        for mode, stream in (("streaming", True), ("non-streaming", False)):
            throughput[mode] = _alternating(
                procs,
                sim,
                router,
                _bench_args(args.requests, args.concurrency, stream, duration_s=120),
                warmup=args.concurrency,
                reps=args.reps,
                tag=mode,
                timeout_s=300,
            )
        procs.stop(router)
        procs.stop(sim)

        # Latency: realistic engine timings, concurrency where the router is not the limit.
        sim = procs.sim("sim", "--time-scale", "1")
        config = harness.write_router_config(
            procs.log_dir / "router-latency.yaml", [EngineSpec("e0", sim.url)]
        )
        router = procs.router("narwhal", config)
        latency = _alternating(
            procs,
            sim,
            router,
            _bench_args(
                args.latency_requests, args.latency_concurrency, stream=True, duration_s=180
            ),
            warmup=args.latency_concurrency,
            reps=args.reps,
            tag="latency",
            timeout_s=400,
        )

    print(
        f"\n## Router overhead: `narwhal sim --time-scale 0`, chat, {TOKENS} tokens (ignore_eos), "
        f"c={args.concurrency}, N={args.requests}, warm-up {args.concurrency}, "
        f"median of {args.reps}"
    )
    print("\n" + harness.stamp(revision) + "\n")
    rows = throughput_rows("stream", throughput["streaming"])
    rows += throughput_rows("non-stream", throughput["non-streaming"])
    print(table(THROUGHPUT_HEADERS, rows))
    print(
        f"\n## Added latency: `narwhal sim --time-scale 1` (default model), streaming, "
        f"{TOKENS} tokens, c={args.latency_concurrency}, N={args.latency_requests}, "
        f"median of {args.reps}\n"
    )
    print(table(LATENCY_HEADERS, latency_rows(latency)))
    outcomes = {name: _outcomes(runs) for name, runs in {**throughput, "latency": latency}.items()}
    print(f"\nNarwhal outcomes (narwhal_outcomes_total over the runs): {outcomes}")
    elapsed = time.monotonic() - started
    print(f"total run time {elapsed:.0f} s")

    raw["throughput"] = {
        mode: {t: [r.to_json() for r in rs] for t, rs in runs.items()}
        for mode, runs in throughput.items()
    }
    raw["latency"] = {t: [r.to_json() for r in rs] for t, rs in latency.items()}
    raw["elapsed_s"] = elapsed
    harness.write_json(args.json, raw)
    return 0


if __name__ == "__main__":
    sys.exit(harness.run_main(main))
