"""An engine's error answer is engine input: a body nested thousands of levels deep, or
too large to be an error message, is an engine fault like any other, never a router
error. Before the response starts that is another attempt, on the other engine, which
serves the request; when every engine answers so, a 502 `upstream_error`. Only a
well-formed 4xx body is the client's 400, with the engine's `param`, and not retried.

The engines run in this test's loop (`tests/hostile_engine.py`), the router in its own
process, as the operator runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tests.e2e.conftest import MODEL, chat, metrics_of, send
from tests.hostile_engine import HostileEngine, Script, sse
from tests.processes import NarwhalProcess, router_process

# Valid JSON (every bracket closed), only deeper than a recursive decoder goes.
DEEP = {
    "arrays": b"[" * 2000 + b"]" * 2000,
    "error objects": b'{"error":' * 1000 + b"null" + b"}" * 1000,
}
# A well-formed error object whose message alone is 1 MiB: not an error message.
OVERSIZED = b'{"error":{"message":"' + b"x" * (1 << 20) + b'"}}'
BODIES = {
    **DEEP,
    "unclosed arrays": b"[" * 2000,  # deep before it is found invalid
    "invalid JSON": b'{"error": {"message": "cut sho',
    "oversized": OVERSIZED,
}
STATUSES = (500, 400, 503)
WELL_FORMED_400 = b'{"error":{"message":"bad top_k","type":"BadRequestError","param":"top_k"}}'
ANSWER = [
    sse({"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, **fields}]})
    for fields in (
        {"delta": {"role": "assistant", "content": "hello"}},
        {"delta": {}, "finish_reason": "stop"},
    )
] + [sse("[DONE]")]
OUTCOMES = ("completed", "upstream_error", "internal_error", "invalid")


def prompt(status: int, body: str, mode: str, stream: bool) -> str:
    """What the engines answer a request, in its prompt: `body` with `status` to the
    first request ("once", then a good stream) or to every one ("always")."""
    return f"{status}|{body}|{mode}|{stream}"


def script_for(seen: Counter[str]) -> Callable[[dict[str, Any]], Script]:
    def script(request: dict[str, Any]) -> Script:
        text = request["messages"][-1]["content"]
        status, body, mode, _ = text.split("|")
        seen[text] += 1
        if mode == "once" and seen[text] > 1:
            return Script(ANSWER)
        error = WELL_FORMED_400 if body == "well-formed" else BODIES[body]
        return Script([error], status=int(status))

    return script


@pytest.fixture
async def hostile() -> AsyncIterator[tuple[HostileEngine, NarwhalProcess]]:
    async with HostileEngine(script_for(Counter()), ports=2) as engine:
        with contextlib.ExitStack() as stack:
            # Started off the loop: the router probes this loop's engines while it starts.
            router = await asyncio.to_thread(
                stack.enter_context, router_process(engine.settings(MODEL))
            )
            yield engine, router


async def outcomes(router: NarwhalProcess) -> Counter[str]:
    values = await metrics_of(router.url)
    return Counter(
        {name: values.get(f'narwhal_outcomes_total{{outcome="{name}"}}', 0) for name in OUTCOMES}
    )


def change(after: Counter[str], before: Counter[str]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in OUTCOMES if after[name] != before[name]}


@pytest.mark.parametrize("status", STATUSES)
async def test_a_bad_error_body_is_an_engine_fault_the_other_engine_serves(
    hostile: tuple[HostileEngine, NarwhalProcess], status: int
) -> None:
    engine, router = hostile
    for body in BODIES:
        for stream in (False, True):
            case = prompt(status, body, "once", stream)
            before, books = engine.requests, await outcomes(router)
            reply = await send(router.url, chat(case, stream=stream))
            assert reply.status == 200, (case, reply.raw[:300])
            if stream:
                assert reply.events()[-1] == "[DONE]", case
            else:
                assert reply.json()["choices"][0]["message"]["content"] == "hello", case
            assert engine.requests - before == 2, case  # the error, then the other engine
            assert change(await outcomes(router), books) == {"completed": 1}, case


@pytest.mark.parametrize("status", STATUSES)
async def test_a_bad_error_body_from_every_engine_is_a_502(
    hostile: tuple[HostileEngine, NarwhalProcess], status: int
) -> None:
    engine, router = hostile
    for body in BODIES:
        for stream in (False, True):
            case = prompt(status, body, "always", stream)
            before, books = engine.requests, await outcomes(router)
            reply = await send(router.url, chat(case, stream=stream))
            assert reply.status == 502, (case, reply.raw[:300])
            error = reply.json()["error"]
            assert error["code"] == "upstream_error", case
            assert f"answered {status}" in error["message"], (case, error)
            assert engine.requests - before == 2, case  # retried, within max_attempts (2)
            assert change(await outcomes(router), books) == {"upstream_error": 1}, case


async def test_a_well_formed_400_is_still_the_clients_with_its_param(
    hostile: tuple[HostileEngine, NarwhalProcess],
) -> None:
    engine, router = hostile
    before, books = engine.requests, await outcomes(router)
    reply = await send(router.url, chat(prompt(400, "well-formed", "always", False)))
    assert reply.status == 400, reply.raw
    error = reply.json()["error"]
    assert error["param"] == "top_k" and error["type"] == "invalid_request_error"
    assert (
        error["message"]
        == "The engine refused the request: engine error (BadRequestError): bad top_k"
    )
    assert engine.requests - before == 1  # the client's fault: not retried
    assert change(await outcomes(router), books) == {"invalid": 1}
