"""Priority classes and tenant fairness under overload, through Narwhal (and SMG beside it).

A fleet of simulated engines (`narwhal sim`, time-scale 1, vLLM's V1 scheduler) gets
mixed traffic in open loop (Poisson arrivals): 20% `critical`, 50% `standard`, 30%
`sheddable`, from two tenants of equal weight. `polite` sends POLITE_SHARE of the
fleet's capacity (under its fair half); `flood` sends the rest of each level's load, 1x,
2x and 3x the capacity in all (1.5 to 6.5 times what `polite` sends). A baseline run has
`polite` alone. Capacity is measured first: closed-loop load straight on the sims.

Reported per router and level, per class: offered, admitted, refused, attainment of the
admitted (first token within the budget), refused share; per tenant: goodput (requests a
second whose first token came within the budget) and `polite`'s goodput against its
baseline; and how many `sheddable` requests were admitted within COINCIDENT_S of a
`critical` one being refused. Targets (Step 15): `critical` at least 99% attainment and
at most 1% refused up to 3x; `polite` loses at most 10% of its goodput; no `sheddable`
admitted at the moment a `critical` one is refused.

With `--smg PATH` (the `smg` executable of the PyPI package `smg`), the same traffic goes
through SMG too, side by side in the same sitting: its priority scheduler
(`x-smg-priority`) and tenant rate limits, as `smg_launch` below starts it.

    python scripts/perf/priority.py [--duration 30] [--levels 1,2,3] [--json OUT]
    python scripts/perf/priority.py --smg /path/to/venv/bin/smg
    python scripts/perf/priority.py --discipline serial   # one prompt at a time
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import harness
from harness import HOST, MODEL, Processes, Server, table

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from narwhal.bench.workload import PromptText

CLASSES = {"critical": 0.2, "standard": 0.5, "sheddable": 0.3}
TENANTS = ("polite", "flood")
KEYS = {"polite": "sk-polite-0123456789", "flood": "sk-flood-0123456789"}
POLITE_SHARE = 0.4
LEVELS = (1.0, 2.0, 3.0)
PROMPTS = (256, 2048)
OUTPUTS = (16, 64)
SIM_FLAGS = ["--time-scale", "1", "--prefill-tokens-per-s", "10000", "--decode-base-ms", "12"]
BASE_SIM_FLAGS = len(SIM_FLAGS)
COINCIDENT_S = 0.05
CAPACITY_CONCURRENCY_PER_ENGINE = 12


@dataclass(slots=True)
class Result:
    tenant: str
    cls: str
    sent: float  # seconds from the run's start
    status: int
    ttft: float | None = None  # seconds to the first content, for a 200
    latency: float = 0.0  # seconds to the answer's end (a refusal's answer)


@dataclass(slots=True)
class Run:
    router: str
    level: float
    duration: float
    results: list[Result] = field(default_factory=list)

    def of(self, *, cls: str | None = None, tenant: str | None = None) -> list[Result]:
        return [
            r
            for r in self.results
            if (cls is None or r.cls == cls) and (tenant is None or r.tenant == tenant)
        ]

    def goodput(self, budget: float, tenant: str) -> float:
        good = [r for r in self.of(tenant=tenant) if r.ttft is not None and r.ttft <= budget]
        return len(good) / self.duration

    def coincident(self) -> int:
        """Sheddable requests admitted within COINCIDENT_S of a critical one refused."""
        refused = sorted(r.sent for r in self.of(cls="critical") if r.status in (429, 503))
        count = 0
        for r in self.of(cls="sheddable"):
            if r.status != 200:
                continue
            if any(abs(r.sent - t) <= COINCIDENT_S for t in refused):
                count += 1
        return count


Headers = Callable[[str, str], dict[str, str]]


def narwhal_headers(tenant: str, cls: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}", "X-Narwhal-Priority": cls}


async def one_request(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any],
    result: Result,
    started: float,
) -> None:
    try:
        async with session.post(url, json=body, headers=headers) as response:
            result.status = response.status
            if response.status != 200:
                await response.read()
                return
            async for line in response.content:
                # The first event with content (a role chunk's "" is not a token).
                content = line.startswith(b"data:") and b'"content":"' in line
                if result.ttft is None and content and b'"content":""' not in line:
                    result.ttft = time.monotonic() - started
    except (TimeoutError, aiohttp.ClientError):
        result.status = 599
    finally:
        result.latency = time.monotonic() - started


def request_body(rng: random.Random, text: PromptText, n: int) -> dict[str, Any]:
    tokens = rng.randint(*PROMPTS)
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text.take(n, tokens)}],
        "max_tokens": rng.randint(*OUTPUTS),
        "ignore_eos": True,
        "stream": True,
    }


async def open_loop(
    url: str, rates: dict[str, float], duration: float, headers: Headers, seed: int
) -> list[Result]:
    """Poisson arrivals per tenant at `rates` (requests a second) for `duration` s."""
    rng = random.Random(seed)
    text = PromptText(seed, PROMPTS[1])
    arrivals: list[tuple[float, str]] = []
    for tenant, rate in rates.items():
        t = rng.expovariate(rate) if rate > 0 else duration
        while t < duration:
            arrivals.append((t, tenant))
            t += rng.expovariate(rate)
    arrivals.sort()
    names, weights = list(CLASSES), list(CLASSES.values())
    results: list[Result] = []
    tasks: list[asyncio.Task[None]] = []
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        start = time.monotonic()
        for n, (at, tenant) in enumerate(arrivals):
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            cls = rng.choices(names, weights)[0]
            result = Result(tenant, cls, time.monotonic() - start, 0)
            results.append(result)
            body = request_body(rng, text, n)
            tasks.append(
                asyncio.create_task(
                    one_request(
                        session,
                        url + "/v1/chat/completions",
                        headers(tenant, cls),
                        body,
                        result,
                        time.monotonic(),
                    )
                )
            )
        await asyncio.gather(*tasks)
    return results


async def closed_loop(urls: Sequence[str], concurrency: int, duration: float) -> float:
    """Requests a second completed with `concurrency` in flight per URL, straight on it."""
    rng = random.Random(7)
    text = PromptText(7, PROMPTS[1])
    done = 0
    end = time.monotonic() + duration

    async def worker(session: aiohttp.ClientSession, url: str, k: int) -> None:
        nonlocal done
        n = k * 100_000
        while time.monotonic() < end:
            n += 1
            result = Result("-", "-", 0.0, 0)
            body = request_body(rng, text, n)
            await one_request(session, url, {}, body, result, time.monotonic())
            if result.status == 200 and time.monotonic() < end:
                done += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(
            *(
                worker(session, url + "/v1/chat/completions", i * concurrency + j)
                for i, url in enumerate(urls)
                for j in range(concurrency)
            )
        )
    return done / duration


def narwhal_config(path: Path, sims: Sequence[Server], budget: float) -> Path:
    config = {
        "model": MODEL,
        "serving": {
            "host": HOST,
            "port": 0,
            "max_retained": harness.GENEROUS_LIMIT,
            "api_keys": [{"key": KEYS[t], "tenant": t} for t in TENANTS],
        },
        "admission": {
            "mode": "predictive",
            "ttft_target_s": budget,
            "queue_limit": harness.GENEROUS_LIMIT,
            "phase_concurrency": {
                "prefill": harness.GENEROUS_LIMIT,
                "decode": harness.GENEROUS_LIMIT,
            },
        },
        "tenants": {t: {"weight": 1} for t in TENANTS},
        "engines": [
            {"name": f"s{i}", "url": sim.url, "dialect": "vllm"} for i, sim in enumerate(sims)
        ],
        "logging": {"access_log": False},
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def run_level(
    procs: Processes,
    name: str,
    start_router: Callable[[Sequence[Server]], tuple[Server, Headers]],
    engines: int,
    level: float,
    capacity: float,
    duration: float,
    seed: int,
) -> Run:
    """Fresh engines and a fresh router; `level` 0: the baseline (polite alone)."""
    sims = [procs.sim(f"{name}-{level:g}-s{i}", *SIM_FLAGS) for i in range(engines)]
    router, headers = start_router(sims)
    polite = POLITE_SHARE * capacity
    rates = {"polite": polite, "flood": max(0.0, level * capacity - polite)}
    harness.log(
        f"{name} at {level:g}x: polite {rates['polite']:.1f}, flood {rates['flood']:.1f} req/s"
    )
    try:
        results = asyncio.run(open_loop(router.url, rates, duration, headers, seed))
    finally:
        for server in (router, *sims):
            procs.stop(server)
    return Run(name, level, duration, results)


def class_rows(run: Run, budget: float) -> list[list[str]]:
    rows = []
    for cls in CLASSES:
        results = run.of(cls=cls)
        by_tenant = {
            t: sum(r.status in (429, 503) for r in run.of(cls=cls, tenant=t)) for t in TENANTS
        }
        admitted = [r for r in results if r.status == 200]
        # Refused: 429 (Narwhal's refusals, SMG's full queue) or 503 (SMG's queue timeout).
        refused = [r for r in results if r.status in (429, 503)]
        within = [r for r in admitted if r.ttft is not None and r.ttft <= budget]
        rows.append(
            [
                run.router,
                f"{run.level:g}x" if run.level else "baseline",
                cls,
                str(len(results)),
                str(len(admitted)),
                str(len(refused)),
                f"{100 * len(within) / len(admitted):.1f}%" if admitted else "-",
                f"{100 * len(refused) / len(results):.1f}%" if results else "-",
                " / ".join(str(by_tenant[t]) for t in TENANTS),
            ]
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--budget", type=float, default=1.0, help="TTFT budget, seconds")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds a run")
    parser.add_argument("--levels", default=",".join(f"{x:g}" for x in LEVELS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--discipline",
        default="chunked",
        help="the sims' prefill discipline (narwhal sim --prefill-discipline)",
    )
    parser.add_argument("--capacity", type=float, default=None, help="req/s (default: measure)")
    parser.add_argument("--smg", default=None, help="the smg executable, to run beside it")
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None, help="write the figure here (a .png; matplotlib)")
    args = parser.parse_args(argv)
    levels = [float(x) for x in args.levels.split(",")]
    SIM_FLAGS[:] = [*SIM_FLAGS[:BASE_SIM_FLAGS], "--prefill-discipline", args.discipline]
    runs: list[Run] = []
    with Processes() as procs:
        capacity = args.capacity
        if capacity is None:
            sims = [procs.sim(f"capacity-s{i}", *SIM_FLAGS) for i in range(args.engines)]
            capacity = asyncio.run(
                closed_loop([s.url for s in sims], CAPACITY_CONCURRENCY_PER_ENGINE, 20.0)
            )
            for sim in sims:
                procs.stop(sim)
            harness.log(f"capacity measured: {capacity:.2f} req/s")
        routers: dict[str, Callable[[Sequence[Server]], tuple[Server, Headers]]] = {}

        def narwhal(sims: Sequence[Server]) -> tuple[Server, Headers]:
            tag = f"narwhal-{time.monotonic_ns()}"
            path = narwhal_config(procs.log_dir / f"{tag}.yaml", sims, args.budget)
            return procs.router(tag, path), narwhal_headers

        routers["narwhal"] = narwhal
        if args.smg is not None:
            routers["smg"] = smg_router(procs, args.smg, args.budget)
        for name, start in routers.items():
            for level in [0.0, *levels]:
                runs.append(
                    run_level(
                        procs, name, start, args.engines, level, capacity, args.duration, args.seed
                    )
                )
    report(runs, args.budget, capacity)
    if args.plot:
        plot(runs, args.budget, capacity, args.plot)
    if args.json:
        harness.write_json(
            args.json,
            {
                "capacity": capacity,
                "budget": args.budget,
                "runs": [
                    {
                        "router": run.router,
                        "level": run.level,
                        "duration": run.duration,
                        "results": [
                            [r.tenant, r.cls, round(r.sent, 4), r.status, r.ttft, r.latency]
                            for r in run.results
                        ],
                    }
                    for run in runs
                ],
            },
        )
    return 0


def report(runs: list[Run], budget: float, capacity: float) -> None:
    stamp = harness.stamp(harness.narwhal_revision())
    print(f"\ncapacity {capacity:.2f} req/s; TTFT budget {budget:g} s; {stamp}")
    rows = [row for run in runs for row in class_rows(run, budget)]
    print(
        table(
            [
                "router",
                "level",
                "class",
                "offered",
                "admitted",
                "refused",
                "attainment",
                "refused %",
                "refused polite / flood",
            ],
            rows,
        )
    )
    tenant_rows = []
    baselines = {run.router: run for run in runs if run.level == 0}
    for run in runs:
        base = baselines.get(run.router)
        polite = run.goodput(budget, "polite")
        kept = (
            f"{100 * polite / base.goodput(budget, 'polite'):.1f}%" if base and run.level else "-"
        )
        tenant_rows.append(
            [
                run.router,
                f"{run.level:g}x" if run.level else "baseline",
                f"{polite:.2f}",
                f"{run.goodput(budget, 'flood'):.2f}",
                kept,
                str(run.coincident()),
            ]
        )
    print(
        table(
            [
                "router",
                "level",
                "polite goodput/s",
                "flood goodput/s",
                "polite vs baseline",
                "sheddable admitted as critical refused",
            ],
            tenant_rows,
        )
    )


def plot(runs: list[Run], budget: float, capacity: float, path: str) -> None:
    """Per router against the level: each class's attainment (its admitted requests whose
    first token met the budget) and refused share, and the polite tenant's goodput as a
    share of its goodput alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(13, 4.2))
    styles = {"narwhal": "-", "smg": "--"}
    colors = {"critical": "tab:red", "standard": "tab:blue", "sheddable": "tab:gray"}
    for router in sorted({run.router for run in runs}):
        loaded = sorted((r for r in runs if r.router == router and r.level), key=lambda r: r.level)
        base = next((r for r in runs if r.router == router and not r.level), None)
        levels = [run.level for run in loaded]
        style = styles.get(router, ":")
        for cls in CLASSES:
            attained, refused = [], []
            for run in loaded:
                results = run.of(cls=cls)
                admitted = [r for r in results if r.status == 200]
                within = [r for r in admitted if r.ttft is not None and r.ttft <= budget]
                attained.append(100 * len(within) / len(admitted) if admitted else float("nan"))
                gone = sum(r.status in (429, 503) for r in results)
                refused.append(100 * gone / len(results) if results else float("nan"))
            label = f"{router}: {cls}"
            left.plot(levels, attained, style, color=colors[cls], marker="o", label=label)
            middle.plot(levels, refused, style, color=colors[cls], marker="o", label=label)
        if base is not None and base.goodput(budget, "polite"):
            alone = base.goodput(budget, "polite")
            kept = [100 * run.goodput(budget, "polite") / alone for run in loaded]
            right.plot(levels, kept, style, color="black", marker="o", label=router)
    left.axhline(99, color="tab:green", linewidth=0.8, label="99% target")
    right.axhline(90, color="tab:green", linewidth=0.8, label="90% target")
    left.set(title="attainment of admitted requests", ylabel="% within the TTFT budget")
    middle.set(title="refused (429, 503)", ylabel="% of the class's offered requests")
    right.set(title="the polite tenant while the other floods", ylabel="% of its goodput alone")
    for axes in (left, middle, right):
        axes.set_xlabel(f"offered load (x capacity, {capacity:.1f} req/s)")
        axes.grid(alpha=0.3)
    left.legend(fontsize=7)
    right.legend(fontsize=8)
    fig.suptitle(
        f"Priority classes and tenants: 20% critical, 50% standard, 30% sheddable; TTFT budget "
        f"{budget:g} s; {harness.stamp(harness.narwhal_revision())}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# Narwhal's classes as SMG's (system > interactive > default > bulk; `system` may preempt).
SMG_CLASSES = {"critical": "interactive", "standard": "default", "sheddable": "bulk"}


def smg_headers(tenant: str, cls: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}", "x-smg-priority": SMG_CLASSES[cls]}


def smg_router(
    procs: Processes, executable: str, budget: float
) -> Callable[[Sequence[Server]], tuple[Server, Headers]]:
    """SMG with its priority scheduler: per class a queue waiting at most the TTFT budget
    (a request that would wait longer is refused, 503, as the budget is gone), both
    tenants allowed every class; its tenant rate limiter is on too, with limits far above
    this traffic (it applies to gRPC workers only in 1.13.0: over HTTP it passes
    everything). Slots: SMG's default of 64 per worker."""
    timeout = max(1, round(budget))
    policy = {
        "classes": {
            name: {
                "reserved_floor": 0,
                "queue_size": 256,
                "queue_timeout_secs": timeout,
                "starvation_threshold_secs": 30,
                "can_preempt": False,
            }
            for name in ("system", "interactive", "default", "bulk")
        },
        "tenant_policies": {f"auth:{t}": {"max_class": "interactive"} for t in TENANTS},
    }
    limits = {"default_policy": {"tokens_per_minute": 10**9, "requests_per_minute": 10**6}}
    scheduler = procs.log_dir / "smg-priority.yaml"
    scheduler.write_text(json.dumps(policy, indent=2) + "\n")
    rate_limits = procs.log_dir / "smg-rate-limits.yaml"
    rate_limits.write_text(json.dumps(limits, indent=2) + "\n")

    def start(sims: Sequence[Server]) -> tuple[Server, Headers]:
        port, metrics_port = free_port(), free_port()
        argv = [
            executable, "launch",
            "--host", HOST, "--port", str(port),
            "--prometheus-host", HOST, "--prometheus-port", str(metrics_port),
            "--worker-urls", *[sim.url for sim in sims],
            "--policy", "round_robin",
            "--priority-scheduler-enabled",
            "--priority-scheduler-config", str(scheduler),
            "--tenant-rate-limit-enabled",
            "--tenant-rate-limit-config", str(rate_limits),
            *[a for t in TENANTS for a in ("--tenant-api-key", f"{t}:{KEYS[t]}")],
        ]  # fmt: skip
        name = f"smg-{time.monotonic_ns()}"
        server = procs.start_foreign(name, argv, f"http://{HOST}:{port}", "/readiness")
        return server, smg_headers

    return start


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


if __name__ == "__main__":
    sys.exit(harness.run_main(main))
