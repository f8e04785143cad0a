"""Concurrency scale: 100, 1,000 and 5,000 concurrent streams through Narwhal (one process,
or with `--workers N` its relay workers, their decision process and supervisor: CPU and
peak RSS are then all of them, the RSS their peaks summed).

For each level, a fresh simulated engine and a fresh router (so VmHWM is that level's
peak) serve the same closed-loop load twice: straight to the engine ("direct"), then
through Narwhal. Streaming chat, --tokens output tokens with ignore_eos, warm-up = the
concurrency (every keep-alive connection is open before timing), then 2x the concurrency
measured requests: the first wave starts at once, a burst of `c` new streams.

The engine is configured so it is not the limit on concurrency: room for 8,192 running
sequences and 10^8 KV tokens, prefill 10^7 tokens/s with no per-request overhead (so a
burst of 5,000 prompts does not queue for seconds). Decode keeps the sim's step model
(6 ms + --per-seq-ms per running sequence), which caps the engine's aggregate rate at
about 1/per-seq-ms events per second whatever the concurrency; the default 0.1 ms keeps
it near 10,000 events/s, which this 2-core box (client, router and engine on the same two
cores) can carry, so TTFT measures queueing, not a saturated CPU.

Reported per level: events/s (and the ratio to direct), TTFT p50/p99 direct and through
Narwhal, added TTFT p99, the peak of running requests the engine reported (to show the
concurrency was reached), the router's CPU per request and its peak RSS (VmHWM).

    python scripts/perf/scale.py [--levels 100,1000,5000] [--tokens 64] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import harness
from harness import BenchRun, EngineSpec, Processes, Server, fmt, table

# Descriptors: the router holds a client socket and an engine socket per stream, plus its
# own listening sockets, probes and Python's files; the client and the engine one each.
FDS_PER_STREAM_ROUTER = 2
FD_HEADROOM = 256


def _sim_flags(per_seq_ms: float) -> list[str]:
    return [
        "--time-scale",
        "1",
        "--max-num-seqs",
        "8192",
        "--kv-capacity-tokens",
        "100000000",
        "--max-num-batched-tokens",
        "10000000",
        "--prefill-tokens-per-s",
        "10000000",
        "--prefill-overhead-ms",
        "0",
        "--decode-per-seq-ms",
        str(per_seq_ms),
    ]


def _sampler(sim: Server, router: Server | None) -> Callable[[], dict[str, float]]:
    def sample() -> dict[str, float]:
        running = harness.gauge(f"{sim.url}/metrics", "vllm:num_requests_running")
        values = {"engine_running": running}
        if router is not None:
            values["router_retained"] = harness.gauge(
                f"{router.url}/metrics", "narwhal_retained_requests"
            )
            values["router_rss_mib"] = harness.rss_mib(router.pid)
        return values

    return sample


def run_level(procs: Processes, concurrency: int, args: argparse.Namespace) -> dict[str, BenchRun]:
    requests = 2 * concurrency
    # Bounded: stop starting requests after --duration; each request at most --timeout.
    bench_args = ["-n", str(requests), "-c", str(concurrency), "--max-tokens", str(args.tokens)]
    bench_args += ["--ignore-eos", "--timeout", "300", "--duration", str(args.duration)]
    sim = procs.sim(f"sim-c{concurrency}", *_sim_flags(args.per_seq_ms))
    config = harness.write_router_config(
        procs.log_dir / f"router-c{concurrency}.yaml", [EngineSpec("e0", sim.url)]
    )
    if args.workers > 1:
        written = json.loads(config.read_text())
        written["serving"]["workers"] = args.workers
        config.write_text(json.dumps(written))
    router = procs.router(f"narwhal-c{concurrency}", config)
    runs: dict[str, BenchRun] = {}
    for target in ("direct", "narwhal"):
        via_router = target == "narwhal"
        run = harness.run_bench(
            f"c{concurrency}-{target}",
            [router.url if via_router else sim.url],
            bench_args,
            watch=[sim, router],
            router=router if via_router else None,
            warmup=concurrency,
            timeout_s=args.duration + 600,
            work_dir=procs.log_dir,
            sample=_sampler(sim, router if via_router else None),
            sample_every_s=1.0,
        )
        runs[target] = run
        s = run.summary
        harness.log(
            f"c={concurrency} {target:7}: {s['events_per_s']:9.0f} ev/s ok {s['ok']}/"
            f"{s['requests']} ttft p50 {run.ms('ttft_s', 'p50'):.1f} ms "
            f"p99 {run.ms('ttft_s', 'p99'):.1f} ms peaks {run.peaks} wall {run.wall_s:.0f} s"
        )
    procs.stop(router)
    procs.stop(sim)
    return runs


HEADERS = [
    "concurrency",
    "events/s direct",
    "events/s Narwhal (x direct)",
    "engine running peak (direct / Narwhal)",
    "TTFT p50 ms direct / Narwhal",
    "TTFT p99 ms direct",
    "TTFT p99 ms Narwhal",
    "added TTFT p99 ms",
    "router CPU ms/req",
    "router peak RSS MiB",
    "ok / requests (Narwhal)",
    "other load (cores)",
]


def _row(concurrency: int, runs: dict[str, BenchRun]) -> list[str]:
    d, n = runs["direct"], runs["narwhal"]
    d_ev, n_ev = float(d.summary["events_per_s"]), float(n.summary["events_per_s"])
    return [
        f"{concurrency:,}",
        fmt(d_ev, 0),
        f"{fmt(n_ev, 0)} ({n_ev / d_ev:.2f}x)" if d_ev else fmt(n_ev, 0),
        f"{d.peaks.get('engine_running', 0):,.0f} / {n.peaks.get('engine_running', 0):,.0f}",
        f"{fmt(d.ms('ttft_s', 'p50'))} / {fmt(n.ms('ttft_s', 'p50'))}",
        fmt(d.ms("ttft_s", "p99")),
        fmt(n.ms("ttft_s", "p99")),
        fmt(n.ms("ttft_s", "p99") - d.ms("ttft_s", "p99"), signed=True),
        fmt(n.cpu_ms_per_request(f"narwhal-c{concurrency}"), 3),
        fmt(n.peak_rss_mib.get(f"narwhal-c{concurrency}", 0.0)),
        f"{n.summary['ok']:,} / {n.summary['requests']:,}",
        f"{d.other_cores:.2f} / {n.other_cores:.2f}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="100,1000,5000", help="concurrency levels")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument(
        "--per-seq-ms", type=float, default=0.1, help="sim --decode-per-seq-ms (rate cap)"
    )
    parser.add_argument(
        "--duration", type=float, default=240, help="per run: stop starting requests after S s"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="serving.workers (RSS and CPU: every process)"
    )
    parser.add_argument("--json", metavar="OUT", help="write every raw result here")
    parser.add_argument("--keep-logs", action="store_true", help="keep process logs")
    args = parser.parse_args(argv)
    levels = [int(level) for level in args.levels.split(",")]
    started = time.monotonic()
    revision = harness.narwhal_revision()  # the code the processes load

    soft, hard = harness.nofile_limits()
    notes = [f"ulimit -n: soft {soft}, hard {hard}; children run with soft = hard = {hard}"]
    results: dict[int, dict[str, BenchRun]] = {}
    with Processes(keep_logs=args.keep_logs) as procs:
        for concurrency in levels:
            needed = FDS_PER_STREAM_ROUTER * concurrency + FD_HEADROOM
            if needed > hard:
                notes.append(
                    f"c={concurrency:,} skipped: the router needs about {needed:,} descriptors "
                    f"and the hard limit is {hard:,} (raise it: ulimit -Hn, or limits.conf)"
                )
                continue
            try:
                results[concurrency] = run_level(procs, concurrency, args)
            except RuntimeError as error:
                notes.append(f"c={concurrency:,} failed: {error}")
                harness.log(f"c={concurrency} failed: {error}")

    print(
        f"\n## Concurrency scale: streaming chat, {args.tokens} tokens (ignore_eos), "
        f"warm-up = c, N = 2c, sim decode {args.per_seq_ms} ms/seq per step"
    )
    print("\n" + harness.stamp(revision) + "\n")
    print(table(HEADERS, [_row(c, runs) for c, runs in results.items()]))
    for concurrency, runs in results.items():
        for target, run in runs.items():
            if run.errors:
                notes.append(
                    f"c={concurrency:,} {target}: {run.errors} errors "
                    f"{run.summary['error_counts']} {run.error_samples}"
                )
            if run.tcp.get("ListenOverflows"):
                notes.append(
                    f"c={concurrency:,} {target}: the kernel counted "
                    f"{run.tcp['ListenOverflows']:,} listen-queue overflows (connects waited "
                    f"for SYN retransmits; TCPTimeouts {run.tcp['TCPTimeouts']:,})"
                )
            if run.summary["requests"] < 2 * concurrency:
                notes.append(
                    f"c={concurrency:,} {target}: only {run.summary['requests']} requests "
                    f"within --duration {args.duration:.0f} s"
                )
        outcomes = runs["narwhal"].outcomes
        notes.append(f"c={concurrency:,} Narwhal outcomes: {outcomes}")
        engine_peak = runs["narwhal"].peaks.get("engine_running", 0)
        if engine_peak < 0.95 * concurrency:
            notes.append(
                f"c={concurrency:,}: the engine saw at most {engine_peak:.0f} running requests "
                f"through Narwhal (sampled once a second)"
            )
    elapsed = time.monotonic() - started
    print()
    for note in notes:
        print(f"- {note}")
    print(f"\ntotal run time {elapsed:.0f} s")
    raw: dict[str, Any] = {
        "args": vars(args),
        "notes": notes,
        "levels": {
            str(c): {t: r.to_json() for t, r in runs.items()} for c, runs in results.items()
        },
        "elapsed_s": elapsed,
    }
    harness.write_json(args.json, raw)
    return 0


if __name__ == "__main__":
    sys.exit(harness.run_main(main))
