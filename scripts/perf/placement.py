"""Placement: Narwhal's load-aware policy against round robin on an uneven P/D fleet.

Two prefill and two decode simulated engines (`narwhal sim --role prefill|decode`,
time-scale 1, so every duration is the sim's performance model in real time), one of each
role slower than its twin:

    p-fast  --prefill-tokens-per-s 20000     d-fast  --decode-base-ms 6
    p-slow  --prefill-tokens-per-s 10000     d-slow  --decode-base-ms 12

One open-loop Poisson workload (`narwhal bench --rate R --seed S`, mixed prompt and output
lengths, ignore_eos so both runs generate the same tokens) is sent through Narwhal twice
at the same rate and seed: once with `fleet: {policy: load}`, once with
`fleet: {policy: round_robin}`. Each run gets fresh engines and a fresh router, so neither
inherits the other's queues or KV leases. Reported: TTFT and TPOT p50/p99, SLO attainment
(both objectives met) and goodput, and how each policy spread the work over the engines
(requests and tokens each engine reports in its own /metrics).

The rate should load the fleet well without overloading it. `--try-rates 4,7,10` runs a
short stage per rate and policy and prints that table. The default, 8 req/s, came from it:
prompts average 2,100 tokens, so the fleet's prefill capacity is about 14 req/s (20,000 +
10,000 tokens/s). At 8 req/s that is ~56% overall, and round robin's half share puts p-slow
at ~84%: loaded, not saturated. At 10 req/s round robin saturates p-slow (5 req/s x 2,100
tokens > 10,000 tokens/s), so its TTFT grows with the run's length rather than measuring
placement; at 4 req/s both policies meet every SLO and the comparison says little.

    python scripts/perf/placement.py [--rate 8] [--requests 800] [--seed 0] [--json OUT]
    python scripts/perf/placement.py --try-rates 4,7,10 [--try-requests 200]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import harness
from harness import BenchRun, EngineSpec, Processes, Server, fmt, table

POLICIES = ("load", "round_robin")


@dataclass(frozen=True)
class SimSpec:
    name: str
    role: str
    flags: tuple[str, ...]

    @property
    def describe(self) -> str:
        return " ".join(self.flags)


FLEET = (
    SimSpec("p-fast", "prefill", ("--prefill-tokens-per-s", "20000")),
    SimSpec("p-slow", "prefill", ("--prefill-tokens-per-s", "10000")),
    SimSpec("d-fast", "decode", ("--decode-base-ms", "6")),
    SimSpec("d-slow", "decode", ("--decode-base-ms", "12")),
)
# What each engine reports having done (Prometheus counters of the vLLM-shaped sim).
ENGINE_COUNTERS = {
    "requests": "vllm:request_success_total",
    "prompt tokens": "vllm:prompt_tokens_total",
    "generated tokens": "vllm:generation_tokens_total",
}


def _start_fleet(procs: Processes, tag: str) -> list[Server]:
    return [
        procs.sim(f"{spec.name}-{tag}", "--time-scale", "1", "--role", spec.role, *spec.flags)
        for spec in FLEET
    ]


def _engine_counters(sims: Sequence[Server]) -> dict[str, dict[str, float]]:
    return {
        spec.name: {
            label: harness.gauge(f"{sim.url}/metrics", metric)
            for label, metric in ENGINE_COUNTERS.items()
        }
        for spec, sim in zip(FLEET, sims, strict=True)
    }


def run_policy(
    procs: Processes,
    policy: str,
    rate: float,
    requests: int,
    args: argparse.Namespace,
    tag: str,
) -> tuple[BenchRun, dict[str, dict[str, float]]]:
    sims = _start_fleet(procs, tag)
    engines = [
        EngineSpec(spec.name, sim.url, spec.role) for spec, sim in zip(FLEET, sims, strict=True)
    ]
    config = harness.write_router_config(
        procs.log_dir / f"router-{tag}.yaml", engines, policy=policy
    )
    router = procs.router(f"narwhal-{tag}", config)
    # Open loop, bounded: --duration stops arrivals (they should end by themselves at
    # requests/rate), --timeout bounds each request.
    duration = 1.5 * requests / rate + 30
    bench_args = [
        "--rate",
        str(rate),
        "-n",
        str(requests),
        "--seed",
        str(args.seed),
        "--prompt-tokens",
        args.prompt_tokens,
        "--max-tokens",
        args.max_tokens,
        "--ignore-eos",
        "--slo-ttft",
        str(args.slo_ttft),
        "--slo-tpot",
        str(args.slo_tpot),
        "--timeout",
        "120",
        "--duration",
        f"{duration:.0f}",
    ]
    before = _engine_counters(sims)
    run = harness.run_bench(
        tag,
        [router.url],
        bench_args,
        watch=[*sims, router],
        router=router,
        warmup=args.warmup,
        timeout_s=duration + 300,
        work_dir=procs.log_dir,
    )
    after = _engine_counters(sims)
    spread = {
        name: {label: after[name][label] - before[name][label] for label in after[name]}
        for name in after
    }
    s = run.summary
    harness.log(
        f"{tag}: {s['requests_per_s']:.2f} req/s ok {s['ok']}/{s['requests']} "
        f"ttft p50 {run.ms('ttft_s', 'p50'):.0f} p99 {run.ms('ttft_s', 'p99'):.0f} ms "
        f"tpot p50 {run.ms('tpot_s', 'p50'):.1f} p99 {run.ms('tpot_s', 'p99'):.1f} ms "
        f"attainment {100 * s['attainment']:.1f}% lag {run.stage['max_lag_s']:.3f} s "
        f"other load {run.other_cores:.2f} cores"
    )
    procs.stop(router)
    for sim in reversed(sims):
        procs.stop(sim)
    return run, spread


HEADERS = [
    "policy",
    "rate req/s",
    "ok / requests",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "TPOT p50 ms",
    "TPOT p99 ms",
    "SLO attainment",
    "goodput req/s",
    "other load (cores)",
]


def _row(policy: str, rate: float, run: BenchRun) -> list[str]:
    s = run.summary
    return [
        policy,
        fmt(rate, 1),
        f"{s['ok']} / {s['requests']}",
        fmt(run.ms("ttft_s", "p50"), 0),
        fmt(run.ms("ttft_s", "p99"), 0),
        fmt(run.ms("tpot_s", "p50"), 1),
        fmt(run.ms("tpot_s", "p99"), 1),
        f"{100 * float(s['attainment']):.1f}%",
        fmt(float(s["goodput_per_s"]), 2),
        fmt(run.other_cores, 2),
    ]


def _spread_table(spreads: dict[str, dict[str, dict[str, float]]]) -> str:
    headers = ["engine", "role", "setting"]
    for policy in spreads:
        headers += [f"{policy}: requests", f"{policy}: tokens (P: prompt, D: generated)"]
    rows = []
    for spec in FLEET:
        row = [spec.name, spec.role, spec.describe]
        token_label = "prompt tokens" if spec.role == "prefill" else "generated tokens"
        for spread in spreads.values():
            counters = spread[spec.name]
            row += [fmt(counters["requests"], 0), fmt(counters[token_label], 0)]
        rows.append(row)
    return table(headers, rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=8.0, help="Poisson arrivals per second")
    parser.add_argument("--requests", type=int, default=800, help="requests per policy")
    parser.add_argument("--warmup", type=int, default=16, help="unmeasured requests first")
    parser.add_argument("--seed", type=int, default=0, help="prompts, lengths and arrivals")
    parser.add_argument("--prompt-tokens", default="200:4000", help="N or A:B (uniform)")
    parser.add_argument("--max-tokens", default="32:256", help="N or A:B (uniform)")
    parser.add_argument("--slo-ttft", type=float, default=1.0, help="TTFT objective, s")
    parser.add_argument("--slo-tpot", type=float, default=0.025, help="TPOT objective, s")
    parser.add_argument("--try-rates", help="R1,R2,...: short runs per rate and policy")
    parser.add_argument("--try-requests", type=int, default=200, help="requests per try")
    parser.add_argument("--json", metavar="OUT", help="write every raw result here")
    parser.add_argument("--keep-logs", action="store_true", help="keep process logs")
    args = parser.parse_args(argv)
    started = time.monotonic()
    revision = harness.narwhal_revision()  # the code the processes load
    trials = [float(r) for r in args.try_rates.split(",")] if args.try_rates else [args.rate]
    requests = args.try_requests if args.try_rates else args.requests

    runs: list[tuple[str, float, BenchRun]] = []
    spreads: dict[str, dict[str, dict[str, float]]] = {}
    with Processes(keep_logs=args.keep_logs) as procs:
        for rate in trials:
            for policy in POLICIES:
                tag = f"{policy}-r{rate:g}"
                run, spread = run_policy(procs, policy, rate, requests, args, tag)
                runs.append((policy, rate, run))
                spreads[tag] = spread

    print(
        f"\n## Placement: 2 prefill + 2 decode sims (one of each slower), Poisson arrivals, "
        f"prompts {args.prompt_tokens} tokens, max_tokens {args.max_tokens} (ignore_eos), "
        f"seed {args.seed}, N={requests} per run, warm-up {args.warmup}; "
        f"SLO TTFT <= {args.slo_ttft:g} s and TPOT <= {1e3 * args.slo_tpot:g} ms"
    )
    print("\n" + harness.stamp(revision) + "\n")
    print(table(HEADERS, [_row(policy, rate, run) for policy, rate, run in runs]))
    print("\nWork per engine (each engine's /metrics over the run, warm-up included):\n")
    print(_spread_table(spreads))
    notes = []
    for policy, rate, run in runs:
        if run.errors:
            notes.append(f"{policy} @ {rate:g}: errors {run.summary['error_counts']}")
        if run.outcomes.keys() - {"completed"}:
            notes.append(f"{policy} @ {rate:g}: Narwhal outcomes {run.outcomes}")
        if run.stage["max_lag_s"] > 0.1:
            notes.append(
                f"{policy} @ {rate:g}: the client fell {run.stage['max_lag_s']:.2f} s behind "
                f"its arrival schedule (offered rate not met)"
            )
    for note in notes:
        print(f"- {note}")
    elapsed = time.monotonic() - started
    print(f"\ntotal run time {elapsed:.0f} s")
    raw: dict[str, Any] = {
        "args": vars(args),
        "fleet": [{"name": s.name, "role": s.role, "flags": s.flags} for s in FLEET],
        "runs": [{"policy": p, "rate": r, **run.to_json()} for p, r, run in runs],
        "spread": spreads,
        "notes": notes,
        "elapsed_s": elapsed,
    }
    harness.write_json(args.json, raw)
    return 0


if __name__ == "__main__":
    sys.exit(harness.run_main(main))
