"""Prefix-cache-aware placement: Narwhal against round robin, load and the peers' own
cache-aware policies, on one fleet of simulated engines with vLLM's prefix caching.

A fleet of 4 `narwhal sim` engines (time-scale 1; automatic prefix caching in 16-token
blocks, `--kv-capacity-tokens` of KV each, so that one engine cannot keep every
conversation's history; prefill at `--prefill-tokens-per-s`) is offered the multi-turn
workload of `narwhal bench` in open loop (conversations arrive as a Poisson process;
each turn sends the whole history, the replies received included, plus a new user
message; a shared system prompt of 8 opens every conversation) at 50% and 90% of the
fleet's capacity, once per placement:

    round_robin, load, cache_aware   Narwhal (`fleet.policy`), predictive admission with
                                     the TTFT SLO as its budget (so it refuses what would
                                     miss it), and cache_aware again with admission open
                                     (placement alone, as the peers do it)
    sglang-router                    `--policy cache_aware` (approximate radix tree of the
                                     text sent to each worker; load balancing when
                                     imbalanced), PyPI sglang-router 0.3.2
    vllm-router                      `--policy cache_aware`, PyPI vllm-router 0.1.17

Fresh engines for every run (a cold cache each time), the same seed for every run (the
same conversations, lengths and arrival times). Reported per run, from the engines' own
counters (`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total`, summed over
the fleet) and the bench: the fleet's prefix-cache hit ratio, TTFT p50/p99 of the
requests served, goodput (requests served within the TTFT SLO, a second), refusals, and
the load imbalance (the busiest engine's requests over the mean). Then the same fleet
with prefix caching off on every engine, `load` against `cache_aware` at 90%: the
cache-aware placement should cost nothing there.

Capacity is the sims' model for this workload with every turn finding its history
cached (the best any placement can do): each request prefills its new user message and
the previous reply (plus the template and a partial block), so the fleet serves
`engines x prefill_tokens_per_s / (uncached tokens + per-request overhead)` requests a
second; a policy that loses the history pays the whole prompt again and falls behind.

The peers come from ../shared/peers/setup_peers.sh (PEERS_DIR, default /tmp/peers);
a peer that is not installed is skipped with a note. Client, router and engines share
the host's cores: the sims run at nice 10 (as GPUs would not compete for the router's
CPU), and the "other load" column is host CPU that no process of the run accounts for.

    python scripts/perf/prefix.py [--seconds 60] [--levels 0.5,0.9] [--json OUT]
    python scripts/perf/prefix.py --quick        # 25 s runs, Narwhal's policies only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from harness import Processes, Server, fmt, log, table

ENGINES = 4
BLOCK_TOKENS = 16
SYSTEM_PROMPTS = 8
SYSTEM_PROMPT_TOKENS = 1500
SUFFIX_TOKENS = (200, 600)  # each turn's new user message
OUTPUT_TOKENS = (64, 192)
TURNS = (4, 8)
THINK_S = (0.5, 1.5)
TEMPLATE_TOKENS = 12  # the sim's chat template, per turn's two new messages
PREFILL_OVERHEAD_S = 0.002  # the sim's per-prefill cost
PEERS_DIR = Path(os.environ.get("PEERS_DIR", "/tmp/peers"))
NARWHAL_POLICIES = (
    ("round_robin", "predictive"),
    ("load", "predictive"),
    ("cache_aware", "predictive"),
    ("cache_aware", "open"),
)
PEERS = ("sglang-router", "vllm-router")


@dataclass
class Result:
    target: str
    level: float
    rate: float
    caching: bool
    summary: dict[str, Any]
    hits: float
    queries: float
    engine_requests: list[float]
    outcomes: dict[str, int] = field(default_factory=dict)
    other_cores: float = 0.0

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def imbalance(self) -> float:
        mean = sum(self.engine_requests) / len(self.engine_requests)
        return max(self.engine_requests) / mean if mean else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "level": self.level,
            "rate": self.rate,
            "caching": self.caching,
            "hit_ratio": self.hit_ratio,
            "hits": self.hits,
            "queries": self.queries,
            "engine_requests": self.engine_requests,
            "imbalance": self.imbalance,
            "outcomes": self.outcomes,
            "other_cores": self.other_cores,
            "summary": self.summary,
        }


def capacity(prefill_tokens_per_s: float) -> float:
    """Requests a second the fleet serves when every turn finds its history cached."""
    uncached = sum(SUFFIX_TOKENS) / 2 + sum(OUTPUT_TOKENS) / 2 + TEMPLATE_TOKENS
    uncached += BLOCK_TOKENS / 2  # the partial block a prompt ends in is not cached
    # A conversation's first turn also prefills its system prompt on an engine that has
    # not seen it yet: with 8 prompts and 4 engines, once per pair at most; ignored.
    return ENGINES / (uncached / prefill_tokens_per_s + PREFILL_OVERHEAD_S)


def sim_flags(args: argparse.Namespace, caching: bool) -> list[str]:
    flags = [
        *("--time-scale", "1", "--block-size", str(BLOCK_TOKENS)),
        *("--prefill-tokens-per-s", f"{args.prefill_tokens_per_s:g}"),
        *("--kv-capacity-tokens", str(args.kv_tokens)),
        "--enable-prompt-tokens-details",
    ]
    if not caching:
        flags.append("--no-enable-prefix-caching")
    return flags


def renice(pid: int, nice: int) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def start_fleet(
    procs: Processes, tag: str, args: argparse.Namespace, caching: bool
) -> list[Server]:
    sims = [
        procs.sim(f"sim{i}-{tag}", *sim_flags(args, caching), "--seed", str(i))
        for i in range(ENGINES)
    ]
    for sim in sims:
        renice(sim.pid, args.engines_nice)
    return sims


def narwhal_config(
    path: Path, sims: Sequence[Server], policy: str, admission: str, slo: float
) -> Path:
    generous = harness.GENEROUS_LIMIT
    config = {
        "model": harness.MODEL,
        "serving": {"host": harness.HOST, "port": 0, "max_retained": generous},
        "admission": {
            "mode": admission,
            "ttft_target_s": slo,
            "queue_limit": generous,
            "wait_timeout_s": 600,
            "phase_concurrency": {"prefill": generous, "decode": generous},
        },
        "engines": [
            {"name": f"e{i}", "url": sim.url, "dialect": "vllm"} for i, sim in enumerate(sims)
        ],
        "fleet": {"policy": policy},
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


@contextlib.contextmanager
def peer(procs: Processes, name: str, sims: Sequence[Server], port: int) -> Iterator[str]:
    """A peer router in front of the sims with its cache-aware policy; its base URL."""
    workers = [sim.url for sim in sims]
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"}
    if name == "sglang-router":
        command = [
            str(PEERS_DIR / "sglang/bin/python"),
            *("-m", "sglang_router.launch_router", "--host", harness.HOST, "--port", str(port)),
            "--worker-urls",
            *workers,
            *("--policy", "cache_aware", "--log-level", "warn"),
            *("--prometheus-host", harness.HOST, "--prometheus-port", str(port + 1)),
        ]
    else:
        command = [
            str(PEERS_DIR / "vllmrouter/bin/vllm-router"),
            *("--host", harness.HOST, "--port", str(port), "--worker-urls", *workers),
            *("--policy", "cache_aware", "--log-level", "warning"),
            *("--prometheus-host", harness.HOST, "--prometheus-port", str(port + 1)),
        ]
    log_path = procs.log_dir / f"{name}-{port}.log"
    with open(log_path, "wb") as out:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
    url = f"http://{harness.HOST}:{port}"
    try:
        server = Server(name, process, url, log_path)
        _wait_serving(url, server)
        yield url
    finally:
        procs.stop_process(process)


def _wait_serving(url: str, server: Server, timeout_s: float = 60.0) -> None:
    """A peer is ready when it answers a completion (its /health may come first)."""
    body = json.dumps(
        {"model": harness.MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    ).encode()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        server.check_alive()
        request = urllib.request.Request(
            url + "/v1/chat/completions", body, {"Content-Type": "application/json"}
        )
        with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=5):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{url} not serving after {timeout_s} s:\n{harness.tail(server.log_path)}")


def engine_counters(sim: Server) -> tuple[float, float, float]:
    """(prefix-cache hits, queries, completed requests) from the sim's own /metrics."""
    hits = queries = requests = 0.0
    for line in harness.http_get_text(f"{sim.url}/metrics").splitlines():
        if line.startswith("vllm:prefix_cache_hits_total"):
            hits += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prefix_cache_queries_total"):
            queries += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:request_success_total"):
            requests += float(line.rsplit(" ", 1)[1])
    return hits, queries, requests


def workload(args: argparse.Namespace, rate: float) -> list[str]:
    requests = int(rate * args.seconds * 1.5) + 50  # --duration ends the run first
    return [
        *("--workload", "multi-turn", "--rate", f"{rate:.3f}", "-n", str(requests)),
        *("--turns", f"{TURNS[0]}:{TURNS[1]}", "--think-time", f"{THINK_S[0]}:{THINK_S[1]}"),
        *("--system-prompts", str(SYSTEM_PROMPTS)),
        *("--system-prompt-tokens", str(SYSTEM_PROMPT_TOKENS)),
        *("--suffix-tokens", f"{SUFFIX_TOKENS[0]}:{SUFFIX_TOKENS[1]}"),
        *("--max-tokens", f"{OUTPUT_TOKENS[0]}:{OUTPUT_TOKENS[1]}", "--ignore-eos"),
        *("--seed", str(args.seed), "--slo-ttft", f"{args.slo:g}"),
        *("--timeout", "120", "--duration", f"{args.seconds:g}"),
    ]


def run(
    procs: Processes,
    target: str,
    level: float,
    rate: float,
    args: argparse.Namespace,
    *,
    caching: bool = True,
) -> Result | None:
    tag = f"{target.replace(' ', '-').replace('/', '-')}-x{level:g}-{time.monotonic_ns() % 10**6}"
    sims = start_fleet(procs, tag, args, caching)
    before = [engine_counters(sim) for sim in sims]
    router: Server | None = None
    try:
        with contextlib.ExitStack() as stack:
            if target in PEERS:
                if not (
                    PEERS_DIR / ("sglang" if target == "sglang-router" else "vllmrouter")
                ).exists():
                    log(f"{target}: not installed under {PEERS_DIR} (setup_peers.sh): skipped")
                    return None
                url = stack.enter_context(peer(procs, target, sims, args.peer_port))
            else:
                policy, admission = target.split("/")
                config = narwhal_config(
                    procs.log_dir / f"router-{tag}.yaml", sims, policy, admission, args.slo
                )
                router = procs.router(f"narwhal-{tag}", config)
                url = router.url
            log(f"{tag}: {rate:.2f} req/s for {args.seconds:g} s")
            bench = harness.run_bench(
                tag,
                [url],
                workload(args, rate),
                watch=[s for s in (router, *sims) if s is not None],
                router=router,
                warmup=0,
                timeout_s=args.seconds + 300,
                work_dir=procs.log_dir,
            )
            after = [engine_counters(sim) for sim in sims]
    finally:
        if router is not None:
            procs.stop(router)
        for sim in sims:
            procs.stop(sim)
    result = Result(
        target=target,
        level=level,
        rate=rate,
        caching=caching,
        summary=bench.summary,
        hits=sum(a[0] - b[0] for a, b in zip(after, before, strict=True)),
        queries=sum(a[1] - b[1] for a, b in zip(after, before, strict=True)),
        engine_requests=[a[2] - b[2] for a, b in zip(after, before, strict=True)],
        outcomes=bench.outcomes,
        other_cores=bench.other_cores,
    )
    log(
        f"{tag}: hit ratio {100 * result.hit_ratio:.1f}%, ttft p99 "
        f"{1e3 * result.summary['ttft_s']['p99']:.0f} ms, goodput "
        f"{result.summary['goodput_per_s']:.2f}/s, imbalance {result.imbalance:.2f}"
    )
    return result


HEADERS = [
    "load",
    "placement",
    "fleet prefix-cache hit ratio (engines' counters)",
    "TTFT p50 / p99 ms (served)",
    "goodput req/s (TTFT <= SLO)",
    "served / refused / other errors",
    "busiest engine / mean (requests)",
    "other load cores",
]


def row(result: Result) -> list[str]:
    summary = result.summary
    ttft = summary["ttft_s"]
    errors = summary.get("error_counts") or {}
    refused = sum(n for code, n in errors.items() if "429" in code)
    other = sum(errors.values()) - refused
    served = int(summary["requests"]) - int(summary["errors"])
    return [
        f"{result.level:.0%} ({result.rate:.1f} req/s)",
        result.target,
        f"{100 * result.hit_ratio:.1f}%",
        f"{fmt(1e3 * ttft['p50'], 0)} / {fmt(1e3 * ttft['p99'], 0)}",
        fmt(summary["goodput_per_s"], 2),
        f"{served} / {refused} / {other}",
        fmt(result.imbalance, 2),
        fmt(result.other_cores, 2),
    ]


def verdict(results: list[Result]) -> list[str]:
    """The issue's targets, at 90% load: hit ratio within 5 points of the best peer's,
    TTFT p99 and goodput better than every peer's; with caching off, cache_aware within
    noise of load."""
    lines = []
    at90 = [r for r in results if r.caching and abs(r.level - 0.9) < 1e-9]
    ours = next((r for r in at90 if r.target == "cache_aware/predictive"), None)
    peers = [r for r in at90 if r.target in PEERS]
    if ours is not None and peers:
        best_hits = max(p.hit_ratio for p in peers)
        ok = ours.hit_ratio >= best_hits - 0.05
        lines.append(
            f"{'PASS' if ok else 'FAIL'} hit ratio at 90%: Narwhal {100 * ours.hit_ratio:.1f}% "
            f"against the best peer's {100 * best_hits:.1f}% (within 5 points)"
        )
        p99 = ours.summary["ttft_s"]["p99"]
        worst = min(p.summary["ttft_s"]["p99"] for p in peers)
        lines.append(
            f"{'PASS' if p99 < worst else 'FAIL'} TTFT p99 at 90%: Narwhal {1e3 * p99:.0f} ms "
            f"against the best peer's {1e3 * worst:.0f} ms"
        )
        goodput = ours.summary["goodput_per_s"]
        best = max(p.summary["goodput_per_s"] for p in peers)
        lines.append(
            f"{'PASS' if goodput > best else 'FAIL'} goodput at 90%: Narwhal {goodput:.2f}/s "
            f"against the best peer's {best:.2f}/s"
        )
    off = {r.target: r for r in results if not r.caching}
    if "load/predictive" in off and "cache_aware/predictive" in off:
        load, aware = off["load/predictive"], off["cache_aware/predictive"]
        ratio = aware.summary["goodput_per_s"] / max(1e-9, load.summary["goodput_per_s"])
        lines.append(
            f"{'PASS' if ratio >= 0.95 else 'FAIL'} caching off: cache_aware goodput "
            f"{aware.summary['goodput_per_s']:.2f}/s against load's "
            f"{load.summary['goodput_per_s']:.2f}/s ({ratio:.2f}x; TTFT p99 "
            f"{1e3 * aware.summary['ttft_s']['p99']:.0f} against "
            f"{1e3 * load.summary['ttft_s']['p99']:.0f} ms)"
        )
    return lines


def plot(results: list[Result], path: Path, revision: str) -> None:
    """Hit ratio, TTFT p99 and goodput per placement, one group of bars per load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in results if r.caching]
    levels = sorted({r.level for r in runs})
    targets = list(dict.fromkeys(r.target for r in runs))
    panels = (
        ("prefix-cache hit ratio (%)", lambda r: 100 * r.hit_ratio),
        ("TTFT p99 (ms)", lambda r: 1e3 * r.summary["ttft_s"]["p99"]),
        ("goodput (req/s, TTFT <= SLO)", lambda r: r.summary["goodput_per_s"]),
    )
    figure, axes = plt.subplots(1, len(panels), figsize=(15, 4.5))
    width = 0.8 / max(1, len(targets))
    for axis, (title, value) in zip(axes, panels, strict=True):
        for i, target in enumerate(targets):
            xs, ys = [], []
            for j, level in enumerate(levels):
                run = next((r for r in runs if r.target == target and r.level == level), None)
                if run is not None:
                    xs.append(j + i * width)
                    ys.append(value(run))
            axis.bar(xs, ys, width, label=target)
        axis.set_xticks([j + 0.4 - width / 2 for j in range(len(levels))])
        axis.set_xticklabels([f"{level:.0%} of capacity" for level in levels])
        axis.set_title(title, fontsize=10)
    axes[0].legend(fontsize=7, loc="lower left")
    figure.suptitle(
        f"{ENGINES} prefix-caching sims, multi-turn conversations, open loop (narwhal {revision})",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    log(f"plot written to {path}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="0.5,0.9", help="shares of the fleet's capacity")
    parser.add_argument("--seconds", type=float, default=60.0, help="open-loop load per run")
    parser.add_argument("--slo", type=float, default=1.0, help="TTFT SLO (and Narwhal's budget)")
    parser.add_argument("--prefill-tokens-per-s", type=float, default=5000.0)
    parser.add_argument("--kv-tokens", type=int, default=131_072, help="each sim's KV cache")
    parser.add_argument("--engines-nice", type=int, default=10)
    parser.add_argument("--peer-port", type=int, default=30_410)
    parser.add_argument(
        "--targets", help="comma-separated subset, e.g. cache_aware/predictive,vllm-router"
    )
    parser.add_argument("--no-caching-off", action="store_true", help="skip the caching-off runs")
    parser.add_argument("--quick", action="store_true", help="25 s runs, Narwhal's policies only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--plot", metavar="PNG", help="bar charts of the table (matplotlib)")
    parser.add_argument("--from-json", metavar="IN", help="report (and plot) a saved run")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds = 25.0
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        results = [_result(r) for r in saved["results"]]
        report(results, args, saved["capacity"], saved["revision"])
        if args.plot:
            plot(results, Path(args.plot), saved["revision"])
        return 0
    targets = [f"{p}/{a}" for p, a in NARWHAL_POLICIES] + ([] if args.quick else list(PEERS))
    if args.targets:
        targets = args.targets.split(",")
    levels = [float(x) for x in args.levels.split(",")]
    fleet = capacity(args.prefill_tokens_per_s)
    revision = harness.narwhal_revision()
    results: list[Result] = []
    with Processes(keep_logs=args.keep_logs) as procs:
        for level in levels:
            for target in targets:
                result = run(procs, target, level, level * fleet, args)
                if result is not None:
                    results.append(result)
        if not args.no_caching_off:
            for target in ("load/predictive", "cache_aware/predictive"):
                result = run(procs, target, 0.9, 0.9 * fleet, args, caching=False)
                if result is not None:
                    results.append(result)
    report(results, args, fleet, revision)
    harness.write_json(
        args.json,
        {"revision": revision, "capacity": fleet, "results": [r.to_json() for r in results]},
    )
    if args.plot:
        plot(results, Path(args.plot), revision)
    return 0


def _result(saved: dict[str, Any]) -> Result:
    return Result(
        target=saved["target"],
        level=saved["level"],
        rate=saved["rate"],
        caching=saved["caching"],
        summary=saved["summary"],
        hits=saved["hits"],
        queries=saved["queries"],
        engine_requests=saved["engine_requests"],
        outcomes=saved["outcomes"],
        other_cores=saved["other_cores"],
    )


def report(results: list[Result], args: argparse.Namespace, fleet: float, revision: str) -> None:
    print(
        f"\n## Prefix-cache-aware placement: {ENGINES} sims (time-scale 1, prefix caching in "
        f"{BLOCK_TOKENS}-token blocks, {args.kv_tokens} KV tokens each, prefill "
        f"{args.prefill_tokens_per_s:g} tokens/s, at nice {args.engines_nice}); multi-turn "
        f"conversations of {TURNS[0]}-{TURNS[1]} turns ({SYSTEM_PROMPTS} shared system prompts "
        f"of {SYSTEM_PROMPT_TOKENS} tokens, user messages {SUFFIX_TOKENS[0]}-{SUFFIX_TOKENS[1]} "
        f"tokens, replies {OUTPUT_TOKENS[0]}-{OUTPUT_TOKENS[1]}, think {THINK_S[0]}-{THINK_S[1]} "
        f"s), open loop, {args.seconds:g} s a run, TTFT SLO {args.slo:g} s"
    )
    print("\n" + harness.stamp(revision) + "\n")
    print(f"capacity (every turn's history cached, from the sims' model): {fleet:.1f} req/s\n")
    print(table(HEADERS, [row(r) for r in results if r.caching]))
    off = [r for r in results if not r.caching]
    if off:
        print("\nprefix caching off on every engine:\n")
        print(table(HEADERS, [row(r) for r in off]))
    print()
    for line in verdict(results):
        print(line)


if __name__ == "__main__":
    sys.exit(harness.run_main(main))
