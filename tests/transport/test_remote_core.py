"""The decision core behind a Unix socket: relay workers' gates over `RemoteCore`, one
`CoreServer` in front of a real `Brain` (open admission, one prefill slot, so requests
queue and wake across workers). Real sockets, one process: the workers here are gates,
each with its own connection, as each worker process has.

What is checked: a request's wakeup reaches the worker that waits for it, whichever
worker's event freed the room; a worker that goes away has everything it held released
once, and the others' queued requests move up; a worker never admits without the
decision process (503 `router_unavailable` before it is reached, after it goes, and for
the requests queued when it went); the fleet view follows the router's state; a peer
that sends what no worker sends is cut off without touching the others.
"""

from __future__ import annotations

import asyncio
import random
import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from narwhal.admission.controller import Admission
from narwhal.config import EngineConfig
from narwhal.decision.brain import Brain, BrainSettings
from narwhal.decision.messages import Offer, Placed, Queued
from narwhal.dispatch.gate import AdmissionGate
from narwhal.errors import RouterUnavailable
from narwhal.observability.metrics import RouterMetrics
from narwhal.ops.state import RouterState
from narwhal.protocol.dialects import DialectCapabilities, capabilities
from narwhal.scheduler.registry import EngineRegistry
from narwhal.scheduler.scheduler import Scheduler
from narwhal.transport.client import UNREACHABLE, RemoteCore
from narwhal.transport.frames import MAX_FRAME_BYTES
from narwhal.transport.server import CoreServer

ENGINES = [EngineConfig(name="e0", url="http://127.0.0.1:9", dialect="vllm")]


def vllm(engine: str) -> DialectCapabilities:
    return capabilities("vllm")


@dataclass
class Decision:
    brain: Brain
    server: CoreServer
    path: str
    released: list[int]


@pytest.fixture
async def decision(tmp_path: Path) -> AsyncIterator[Decision]:
    registry = EngineRegistry(ENGINES, lambda name: True)
    admission = Admission(
        Scheduler(registry, rng=random.Random(0)),
        max_retained=100,
        queue_limit=100,
        prefill_limit=1,  # one request prefills at a time: the next ones queue
        decode_limit=100,
    )
    brain = Brain(BrainSettings(ttft_target_s=2.0), RouterState(), admission)
    released: list[int] = []
    server = CoreServer(
        brain, lambda: registry.entries, released=released.append, view_every_s=0.01
    )
    path = str(tmp_path / "core.sock")
    await server.start(path)
    yield Decision(brain, server, path, released)
    await server.close()


Worker = tuple[RemoteCore, AdmissionGate]


async def worker(path: str) -> Worker:
    """A relay worker's side, as a worker process builds it: its core and its gate."""
    core = RemoteCore(path, vllm, call_timeout_s=2.0)
    gate = AdmissionGate(core, RouterMetrics(), wait_timeout_s=5.0)
    core.on_wakeups = gate.wake
    core.on_lost = lambda: gate.refuse_waiting(lambda: RouterUnavailable.not_admitting(UNREACHABLE))
    await core.start(wait_s=2.0)
    assert core.connected
    return core, gate


async def count_never() -> int:
    raise AssertionError("an exact offer is never counted")


def offer(request_id: str) -> Offer:
    return Offer.exact(request_id, "chat", 100, 16)


async def decided(gate: AdmissionGate, request_id: str) -> Placed | Queued:
    return await gate.decide(offer(request_id), count_never, lambda tokens: None)


async def eventually(predicate: Callable[[], bool], timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not within the time allowed"
        await asyncio.sleep(0.005)


async def test_a_wakeup_reaches_the_worker_that_waits_whoever_freed_the_room(
    decision: Decision,
) -> None:
    core_a, gate_a = await worker(decision.path)
    core_b, gate_b = await worker(decision.path)
    first = await decided(gate_a, "a-1")
    assert isinstance(first, Placed) and first.decode == "e0"
    second = await decided(gate_b, "b-1")
    assert isinstance(second, Queued)
    waiting = asyncio.create_task(gate_b.placement(second, asyncio.get_running_loop().time() + 5))
    gate_a.first_token("a-1", output=_Produced(1))  # a-1's prefill slot is free: b-1 goes
    placed = await asyncio.wait_for(waiting, 2.0)
    assert placed.request_id == "b-1" and placed.decode == "e0"
    gate_a.release("a-1")
    gate_b.release("b-1")
    await eventually(lambda: decision.brain.counts().retained == 0)
    await eventually(lambda: decision.server.held() == 0)
    await core_a.close()
    await core_b.close()


async def test_a_worker_that_goes_away_has_all_it_held_released_once(
    decision: Decision,
) -> None:
    core_a, gate_a = await worker(decision.path)
    core_b, gate_b = await worker(decision.path)
    assert isinstance(await decided(gate_a, "a-1"), Placed)
    assert isinstance(await decided(gate_a, "a-2"), Queued)
    queued_b = await decided(gate_b, "b-1")
    assert isinstance(queued_b, Queued)
    assert decision.brain.counts().retained == 3
    waiting = asyncio.create_task(gate_b.placement(queued_b, asyncio.get_running_loop().time() + 5))
    await core_a.close()  # the worker's process died: its connection ends
    placed = await asyncio.wait_for(waiting, 2.0)  # b-1 moves up past a-2, which is gone
    assert placed.request_id == "b-1"
    assert decision.released == [2]
    assert decision.brain.counts().retained == 1
    gate_a.release("a-1")  # the dead worker's last words reach nobody, and count nothing
    gate_b.release("b-1")
    await eventually(lambda: decision.brain.counts().retained == 0)
    assert decision.released == [2]
    await core_b.close()


async def test_without_the_decision_process_a_worker_refuses_and_never_admits(
    tmp_path: Path,
) -> None:
    core = RemoteCore(str(tmp_path / "nobody.sock"), vllm)
    gate = AdmissionGate(core, RouterMetrics(), wait_timeout_s=5.0)
    await core.start(wait_s=0.2)
    assert core.readiness() == UNREACHABLE
    with pytest.raises(RouterUnavailable) as refused:
        await decided(gate, "w-1")
    assert refused.value.status == 503 and UNREACHABLE in refused.value.message
    gate.release("w-1")
    await core.close()


async def test_requests_queued_when_the_decision_process_goes_get_503(
    decision: Decision,
) -> None:
    core, gate = await worker(decision.path)
    assert isinstance(await decided(gate, "a-1"), Placed)
    queued = await decided(gate, "a-2")
    assert isinstance(queued, Queued)
    waiting = asyncio.create_task(gate.placement(queued, asyncio.get_running_loop().time() + 5))
    await asyncio.sleep(0.01)
    await decision.server.close()
    with pytest.raises(RouterUnavailable):
        await asyncio.wait_for(waiting, 2.0)
    assert core.readiness() == UNREACHABLE
    with pytest.raises(RouterUnavailable):
        await decided(gate, "a-3")
    await core.close()


async def test_the_routers_state_is_the_cores_at_each_offer_and_the_view_follows_it(
    decision: Decision,
) -> None:
    core, gate = await worker(decision.path)
    seen: list[str | None] = []
    core.on_readiness = seen.append
    assert core.readiness() is None
    assert core.capabilities("e0") == capabilities("vllm")
    decision.brain.state.set("ha", "fenced", "the lease could not be renewed")
    with pytest.raises(RouterUnavailable):  # refused by the core at once, whatever the view
        await decided(gate, "a-1")
    gate.release("a-1")
    await eventually(lambda: seen == ["fenced"])  # the view follows (queued requests: 503)
    decision.brain.state.set("ha", None)
    # Active again: the next offer is admitted at once, before any view says so.
    assert isinstance(await decided(gate, "a-2"), Placed)
    gate.release("a-2")
    await eventually(lambda: seen == ["fenced", None])
    await core.close()


@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack("!I", MAX_FRAME_BYTES + 1),  # a length past the bound
        struct.pack("!I", 5) + b"\x80\x05junk",  # a length, then no pickle
    ],
    ids=["oversized", "undecodable"],
)
async def test_a_peer_that_sends_garbage_is_cut_off_and_the_others_go_on(
    decision: Decision, garbage: bytes
) -> None:
    core, gate = await worker(decision.path)
    reader, writer = await asyncio.open_unix_connection(decision.path)
    writer.write(garbage)
    await writer.drain()
    await asyncio.wait_for(reader.read(), 2.0)  # the view, then the end: cut off
    assert reader.at_eof()
    writer.close()
    assert isinstance(await decided(gate, "a-1"), Placed)
    gate.release("a-1")
    await eventually(lambda: decision.brain.counts().retained == 0)
    await core.close()


@dataclass
class _Produced:
    tokens: int
