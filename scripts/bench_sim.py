"""Benchmark `narwhal sim` itself: streamed SSE events per second at time-scale 0.

Starts `python -m narwhal sim --time-scale 0 --port 0` as a subprocess, drives it
with a lightweight aiohttp client (streaming chat, ignore_eos, fixed max_tokens),
and prints events/s, requests/s and the sim's CPU per request (from /proc/PID/stat).
The client counts events by their `\\n\\n` terminators instead of parsing JSON, so
it stays cheap next to the server on a small machine. Bounded: --requests requests,
and --timeout seconds at most.

    python scripts/bench_sim.py [--requests 2000] [--concurrency 64] [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

import aiohttp


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _drive(url: str, requests: int, concurrency: int, tokens: int) -> tuple[int, int]:
    body = {
        "model": "narwhal-sim",
        "messages": [{"role": "user", "content": "Tell me a story about a narwhal."}],
        "stream": True,
        "max_tokens": tokens,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    events = done = 0
    remaining = iter(range(requests))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal events, done
            for _ in remaining:
                async with session.post(f"{url}/v1/chat/completions", json=body) as response:
                    if response.status != 200:
                        raise RuntimeError(f"status {response.status}: {await response.text()}")
                    async for chunk in response.content.iter_any():
                        events += chunk.count(b"\n\n")
                done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return events, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    sim = subprocess.Popen(
        [sys.executable, "-m", "narwhal", "sim", "--time-scale", "0", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sim.stdout is not None
        line = sim.stdout.readline().strip()
        if not line.startswith("narwhal sim listening on "):
            print(f"unexpected first line from the sim: {line!r}", file=sys.stderr)
            return 1
        url = line.rsplit(" ", 1)[1]
        # Warm up (imports, caches) so the figures are about steady state.
        asyncio.run(_drive(url, 50, 8, args.tokens))
        cpu_before = _cpu_seconds(sim.pid)
        started = time.perf_counter()
        events, done = asyncio.run(
            asyncio.wait_for(
                _drive(url, args.requests, args.concurrency, args.tokens), args.timeout
            )
        )
        elapsed = time.perf_counter() - started
        cpu = _cpu_seconds(sim.pid) - cpu_before
    finally:
        sim.terminate()
        sim.wait(timeout=10)
    print(f"requests          {done} (concurrency {args.concurrency}, {args.tokens} tokens each)")
    print(f"elapsed           {elapsed:.2f} s")
    print(f"events/s          {events / elapsed:,.0f}  ({events} SSE events, usage/[DONE] too)")
    print(f"req/s             {done / elapsed:,.1f}")
    print(f"sim CPU/request   {cpu / max(done, 1) * 1000:.3f} ms  ({cpu:.2f} s total)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
