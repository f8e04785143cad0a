"""The TTFT projection and its bound against every prefill discipline, in virtual time.

Narwhal's decision core (registry, model book, placement learning, projecting scorer,
predictive check, admission controller: what `narwhal.router` builds) drives each engine's
step model (`narwhal.sim.model`, `--prefill-discipline` chunked with a large and a small
step budget, a CPU-vLLM-like chunked engine, serial, sglang, sequential) on one virtual
clock (tests/closed_loop.py): minutes of load in seconds, with no host noise, so the
model is measured against behaviour it was not designed on, at every level, many times.
HTTP, sizing and retries are not in it; `scripts/perf/admission.py` measures those with
real processes.

Per engine, capacity is measured (requests per second it completes with 64 in flight),
then each policy (`open`; `queue`: open with a bounded queue, its depth tuned at 1x to the
deepest that keeps 99% within budget; `predictive`) is offered open-loop Poisson load at
0.5x, 1x, 2x and 3x and a step from 0.2x (10 s) to 3x (30 s). Reported per run: offered,
admitted, refused, admitted within budget, goodput in requests and in tokens (prompt plus
output of requests within budget, per second), refused share by prompt class, TTFT
p50/p99 of the admitted, and the share whose TTFT exceeded the projection's bound.

    python scripts/perf/projection.py [--budget 0.6] [--seconds 60] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from narwhal.sim.options import SimOptions
from tests.closed_loop import (
    DISCIPLINES,
    OUTPUTS,
    PROMPTS,
    ClosedLoop,
    Record,
    capacity,
    poisson,
)

ENGINES = DISCIPLINES
LEVELS: tuple[float | str, ...] = (0.5, 1.0, 2.0, 3.0, "step")
CLASSES = ((0, 1024, "short"), (1024, 2048, "medium"), (2048, 1 << 30, "long"))
QUEUE_PREFILL = 4  # prompts in flight under the queue policy (a step's worth)
QUEUE_DEPTHS = (1, 2, 4, 8, 16, 32)


def arrivals(rate: float, level: float | str, seconds: float, start: float, seed: int) -> list:
    if level == "step":
        return poisson(0.2 * rate, 10.0, PROMPTS, OUTPUTS, seed=seed, start=start) + poisson(
            3.0 * rate, seconds / 2, PROMPTS, OUTPUTS, seed=seed + 1, start=start + 10.0
        )
    assert isinstance(level, float)
    return poisson(level * rate, seconds, PROMPTS, OUTPUTS, seed=seed, start=start)


def run(
    options: SimOptions,
    policy: str,
    level: float | str,
    rate: float,
    args: argparse.Namespace,
    depth: int = 0,
) -> dict[str, Any]:
    limits = {}
    if policy == "queue":
        limits = {"prefill_limit": QUEUE_PREFILL, "queue_limit": depth}
    loop = ClosedLoop(
        [options],
        budget=args.budget,
        policy="open" if policy == "queue" else policy,  # type: ignore[arg-type]
        **limits,
    )
    loop.profile()
    start = loop.now + 1.0
    offered = arrivals(rate, level, args.seconds, start, args.seed)
    records = loop.run(offered)
    seconds = 10.0 + args.seconds / 2 if level == "step" else args.seconds
    result = report(records, args.budget, seconds)
    if level == "step":
        first = [r for r in records if start + 10.0 <= r.arrival.at < start + 20.0]
        result["first_10s"] = report(first, args.budget, 10.0)
    return result


def report(records: list[Record], budget: float, seconds: float) -> dict[str, Any]:
    admitted = [r for r in records if r.outcome == "admitted"]
    ttfts = sorted(r.ttft if r.ttft is not None else math.inf for r in admitted)
    within = [r for r in admitted if r.ttft is not None and r.ttft <= budget]
    bounded = [r for r in admitted if r.checked_upper is not None]
    over = [r for r in bounded if (r.ttft or math.inf) > (r.checked_upper or 0.0)]
    refused_by_class = {}
    for low, high, name in CLASSES:
        in_class = [r for r in records if low <= r.arrival.prompt_tokens < high]
        refused = [r for r in in_class if r.outcome.startswith("refused")]
        refused_by_class[name] = len(refused) / len(in_class) if in_class else 0.0
    tokens = sum(r.arrival.prompt_tokens + r.arrival.output_tokens for r in within)
    return {
        "offered": len(records),
        "admitted": len(admitted),
        "refused": sum(r.outcome.startswith("refused") for r in records),
        "rejected": sum(r.outcome == "rejected" for r in records),
        "within": len(within) / len(admitted) if admitted else 1.0,
        "goodput": len(within) / seconds,
        "goodput_tokens": tokens / seconds,
        "refused_by_class": refused_by_class,
        "ttft_p50": _quantile(ttfts, 0.5),
        "ttft_p99": _quantile(ttfts, 0.99),
        "over_bound": len(over) / len(bounded) if bounded else None,
    }


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def tune_queue(options: SimOptions, rate: float, args: argparse.Namespace) -> int:
    """The deepest queue whose admitted requests meet the budget 99% of the time at 1x."""
    best = QUEUE_DEPTHS[0]
    for depth in QUEUE_DEPTHS:
        if run(options, "queue", 1.0, rate, args, depth)["within"] >= 0.99:
            best = depth
    return best


def row(engine: str, policy: str, level: float | str, r: dict[str, Any]) -> str:
    over = "-" if r["over_bound"] is None else f"{r['over_bound']:.2%}"
    classes = "/".join(f"{v:.0%}" for v in r["refused_by_class"].values())
    text = (
        f"| {engine} | {policy} | {level if level == 'step' else f'{level:g}x'} | "
        f"{r['offered']} | {r['admitted']} | {r['refused'] + r['rejected']} | {r['within']:.2%} | "
        f"{r['goodput']:.2f} | {r['goodput_tokens']:.0f} | {classes} | "
        f"{r['ttft_p50'] * 1e3:.0f} / {r['ttft_p99'] * 1e3:.0f} | {over} |"
    )
    if "first_10s" in r:
        f = r["first_10s"]
        text += f" first 10 s: {f['admitted']} admitted, {f['within']:.2%} within |"
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=0.6, help="TTFT budget, seconds")
    parser.add_argument("--seconds", type=float, default=60.0, help="each level's length")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated")
    parser.add_argument("--policies", default="open,queue,predictive")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    args = parser.parse_args()
    results: dict[str, Any] = {"budget": args.budget, "seconds": args.seconds, "runs": []}
    print(
        "| engine | policy | load | offered | admitted | refused (429) | within budget | "
        "goodput req/s | goodput tok/s | refused short/medium/long | TTFT p50 / p99 ms | "
        "over bound |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    started = time.monotonic()
    for engine in args.engines.split(","):
        options = ENGINES[engine]
        rate = capacity(options, PROMPTS, OUTPUTS)
        print(f"| {engine} | capacity {rate:.2f} req/s (measured) | | | | | | | | | | |")
        for policy in args.policies.split(","):
            depth = tune_queue(options, rate, args) if policy == "queue" else 0
            for level in LEVELS:
                r = run(options, policy, level, rate, args, depth)
                name = f"queue ({depth})" if policy == "queue" else policy
                print(row(engine, name, level, r), flush=True)
                results["runs"].append(
                    {"engine": engine, "policy": policy, "level": level, "capacity": rate, **r}
                )
    print(f"({time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
