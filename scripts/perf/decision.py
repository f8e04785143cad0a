"""What the decision core costs per request, and its ceiling in requests per second.

Step 16 puts the decision core (`narwhal.decision.Brain`) in one process under several
relay workers; how far that scales is bounded by what one request costs the core. This
drives the core through its messages alone, in one process and with no I/O: each request
is offered, placed, gets its first token, reports its output once in a batch with the
others decoding, and finishes, with `--in-flight` requests decoding at a time (so the
decode books and the queue are as busy as a loaded router's), on a fleet of profiled
simulated engines (`tests/closed_loop.py`'s, predictive admission) or with `admission:
open` (no models). It also prices what a transport between processes would add: each
message of a request's life encoded and decoded once (pickle, the standard library's; a
msgspec encoder would cost less), and what the real transport costs
(`narwhal.transport`): request lives through a relay worker's gate over a `RemoteCore`,
to a `CoreServer` in front of the open core, on a Unix socket, both ends in this process
on one event loop (their CPU together, per request).

    python scripts/perf/decision.py [--requests 20000] [--engines 1,8] [--in-flight 64]

Figures, not assertions: they depend on the machine (README "Current figures").
"""

from __future__ import annotations

import argparse
import asyncio
import pickle
import random
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from narwhal.admission.controller import Admission
from narwhal.config import EngineConfig
from narwhal.decision.brain import Brain, BrainSettings
from narwhal.decision.messages import (
    Finished,
    FirstToken,
    Offer,
    OutputSummary,
    Placed,
    Progress,
    Queued,
)
from narwhal.ops.state import RouterState
from narwhal.scheduler.registry import EngineRegistry
from narwhal.scheduler.scheduler import Scheduler
from tests.closed_loop import DISCIPLINES, ClosedLoop

BUDGET = 2.0
PROGRESS_EVERY = 16  # requests finished between two progress batches


def predictive_brain(engines: int) -> Brain:
    loop = ClosedLoop([DISCIPLINES["chunked-8192"]] * engines, budget=BUDGET)
    loop.profile()
    return loop.brain


def open_brain(engines: int) -> Brain:
    configs = [
        EngineConfig(name=f"e{i}", url=f"http://127.0.0.1:{9000 + i}", dialect="vllm")
        for i in range(engines)
    ]
    registry = EngineRegistry(configs, lambda name: True)
    admission = Admission(
        Scheduler(registry, rng=random.Random(0)),
        max_retained=1 << 20,
        queue_limit=1 << 20,
        prefill_limit=1 << 20,
        decode_limit=1 << 20,
    )
    return Brain(BrainSettings(ttft_target_s=BUDGET), RouterState(), admission)


def drive(brain: Brain, requests: int, in_flight: int, seed: int) -> tuple[float, int]:
    """Seconds the core took for `requests` whole request lives, and how many were
    admitted (the rest refused or queued and finished unplaced)."""
    rng = random.Random(seed)
    decoding: deque[str] = deque()
    produced: dict[str, int] = {}
    admitted = 0
    now = 100.0
    started = time.perf_counter()
    for n in range(requests):
        now += 0.001
        rid = f"r{n}"
        prompt = int(rng.uniform(100, 4000))
        answer, _ = brain.offer(Offer.exact(rid, "chat", prompt, 256, arrived=now), now)
        if isinstance(answer, Placed):
            admitted += 1
            brain.first_token(FirstToken(rid), now)
            decoding.append(rid)
            produced[rid] = 0
        elif isinstance(answer, Queued):
            brain.finished(Finished(rid), now)
        else:
            brain.finished(Finished(rid), now)
        if len(decoding) > in_flight:
            done = decoding.popleft()
            tokens = produced.pop(done) + 64
            brain.finished(Finished(done, OutputSummary(tokens, True, True, 0.02)), now)
        if n % PROGRESS_EVERY == 0 and produced:
            for key in produced:
                produced[key] += 8
            brain.progress(Progress(tuple(produced.items())), now)
    while decoding:
        done = decoding.popleft()
        brain.finished(Finished(done, OutputSummary(64, True, True, 0.02)), now)
    return time.perf_counter() - started, admitted


def transport_cost(requests: int) -> float:
    """Seconds to encode and decode, once each, the messages of `requests` lives."""
    summary = OutputSummary(64, True, True, 0.02)
    lives = [
        (
            Offer.exact(f"r{n}", "chat", 1000 + n % 997, 256, arrived=1.0),
            Placed(f"r{n}", "e0", None, 0, 1000 + n % 997, 0.4),
            FirstToken(f"r{n}"),
            Finished(f"r{n}", summary),
        )
        for n in range(requests)
    ]
    started = time.perf_counter()
    for life in lives:
        for message in life:
            pickle.loads(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
    return time.perf_counter() - started


async def _socket_lives(
    requests: int, concurrency: int, directory: str | None
) -> tuple[float, float]:
    """Wall and CPU seconds for `requests` lives through a gate, `concurrency` at once:
    over the transport in `directory`, or (None) with the core in process."""
    from narwhal.decision.core import AsyncDecisionCore, InProcessCore
    from narwhal.dispatch.gate import AdmissionGate
    from narwhal.observability.metrics import RouterMetrics
    from narwhal.protocol.dialects import capabilities
    from narwhal.transport.client import RemoteCore
    from narwhal.transport.server import CoreServer

    brain = open_brain(1)
    server = CoreServer(brain, lambda: brain.registry.entries)
    remote = None
    core: AsyncDecisionCore = InProcessCore(brain)
    if directory is not None:
        path = f"{directory}/core.sock"
        await server.start(path)
        remote = RemoteCore(path, lambda engine: capabilities("vllm"))
        core = remote
    gate = AdmissionGate(core, RouterMetrics(), wait_timeout_s=30.0)
    if remote is not None:
        remote.on_wakeups = gate.wake
        await remote.start(wait_s=5.0)
    counter = iter(range(requests))

    async def count() -> int:
        raise AssertionError("exact offers are never counted")

    async def lives() -> None:
        for n in counter:
            rid = f"w{n}"
            answer = await gate.decide(Offer.exact(rid, "chat", 1000, 256), count, print)
            placed = await gate.placement(answer, asyncio.get_running_loop().time() + 30)
            assert placed.decode == "e0"
            gate.first_token(rid, _Output())
            gate.release(rid, OutputSummary(64, True, True, 0.02))

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(lives() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if remote is not None:
        await remote.close()
        await server.close()
    return wall, cpu


class _Output:
    tokens = 1


def socket_cost(requests: int, concurrency: int, remote: bool) -> tuple[float, float]:
    """Wall and CPU seconds per request life through a gate (uvloop, as the router), over
    the transport or with the core in process."""
    import tempfile

    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        loop_factory = asyncio.new_event_loop
    with (
        tempfile.TemporaryDirectory() as directory,
        asyncio.Runner(loop_factory=loop_factory) as runner,
    ):
        where = directory if remote else None
        runner.run(_socket_lives(min(2000, requests), concurrency, where))  # warm
        wall, cpu = runner.run(_socket_lives(requests, concurrency, where))
    return wall / requests, cpu / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--engines", default="1,8", help="comma-separated fleet sizes")
    parser.add_argument("--in-flight", type=int, default=64, help="requests decoding at once")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(
        f"## The decision core's cost per request ({args.requests} requests, "
        f"{args.in_flight} decoding at a time)\n"
    )
    print("| admission | engines | admitted | µs per request | ceiling req/s |")
    print("| --- | --: | --: | --: | --: |")
    for engines in (int(e) for e in args.engines.split(",")):
        for name, make in (("open", open_brain), ("predictive", predictive_brain)):
            brain = make(engines)
            drive(brain, min(2000, args.requests), args.in_flight, args.seed)  # warm
            seconds, admitted = drive(brain, args.requests, args.in_flight, args.seed + 1)
            per = seconds / args.requests
            print(f"| {name} | {engines} | {admitted} | {per * 1e6:.1f} | {1 / per:,.0f} |")
    per_life = transport_cost(args.requests) / args.requests
    print(
        f"\nEncoding and decoding a request's four messages once each (pickle): "
        f"{per_life * 1e6:.1f} µs per request."
    )
    _, local = socket_cost(args.requests, args.in_flight, remote=False)
    wall, cpu = socket_cost(args.requests, args.in_flight, remote=True)
    print(
        f"Through a gate, {args.in_flight} lives at a time, the open core: "
        f"{local * 1e6:.1f} µs of CPU per request in process; over the transport (a "
        f"RemoteCore, one Unix socket, a CoreServer; both ends on one loop) "
        f"{cpu * 1e6:.1f} µs ({wall * 1e6:.1f} µs wall): the transport adds "
        f"{(cpu - local) * 1e6:.1f} µs, shared by a worker and the decision process."
    )


if __name__ == "__main__":
    main()
