"""A hostile engine's malformed events fail the request the same way whether the client
streams or not (shape.py): a 502 before the response starts, after another attempt on
the other engine; an OpenAI-shaped error event and no `[DONE]` once it has started; and
never any of the malformed event's bytes. A malformed finish is no finish: a stream that
ends on one without `[DONE]` (which an `openai` engine may do once every choice has
finished) is not taken for a complete one.

The engines run in this test's loop (`tests/hostile_engine.py`), the router in its own
process, as the operator runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.e2e.conftest import MODEL, chat, metrics_of, send
from tests.hostile_engine import HostileEngine, Script, sse
from tests.processes import NarwhalProcess, router_process


def choice(**fields: Any) -> bytes:
    return sse({"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, **fields}]})


ROLE = choice(delta={"role": "assistant", "content": ""})
HELLO = choice(delta={"content": "hello"})
STOP = choice(delta={}, finish_reason="stop")
DONE = sse("[DONE]")
# Each scenario: what the engine sends after its first events, by the prompt's name.
SCENARIOS = {
    "finish 5": [ROLE, HELLO, choice(delta={}, finish_reason=5), DONE],
    "finish 5, no [DONE]": [ROLE, HELLO, choice(delta={}, finish_reason=5)],
    "index -1": [choice(index=-1, delta={"content": "hi"}), STOP, DONE],
    "delta hi": [ROLE, choice(delta="hi"), STOP, DONE],
    "tool call without index": [
        ROLE,
        choice(delta={"tool_calls": [{"id": "t", "function": {"name": "f"}}]}),
        STOP,
        DONE,
    ],
}
UPSTREAM_ERROR = 'narwhal_outcomes_total{outcome="upstream_error"}'


def script(body: dict[str, Any]) -> Script:
    # A pause after the first event: a failure in the next ones comes after the headers.
    return Script(SCENARIOS[body["messages"][-1]["content"]], pause_after=1)


@pytest.fixture
async def hostile() -> AsyncIterator[tuple[HostileEngine, NarwhalProcess]]:
    async with HostileEngine(script, ports=2) as engine:
        with contextlib.ExitStack() as stack:
            # Started off the loop: the router probes this loop's engines while it starts.
            router = await asyncio.to_thread(
                stack.enter_context, router_process(engine.settings(MODEL))
            )
            yield engine, router


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_non_streaming_is_a_502_after_both_engines(
    hostile: tuple[HostileEngine, NarwhalProcess], scenario: str
) -> None:
    engine, router = hostile
    before = engine.requests
    reply = await send(router.url, chat(scenario, max_tokens=4))
    assert reply.status == 502, reply.raw
    error = reply.json()["error"]
    assert error["code"] == "upstream_error" and "engine sent" in error["message"]
    assert engine.requests - before == 2  # retried on the other engine


# (scenario, the failure comes with the first event: before the response starts)
STREAMED = [
    ("finish 5", False),
    ("finish 5, no [DONE]", False),
    ("index -1", True),
    ("delta hi", False),
    ("tool call without index", False),
]


@pytest.mark.parametrize(("scenario", "first"), STREAMED)
async def test_streaming_refuses_what_assembly_refuses(
    hostile: tuple[HostileEngine, NarwhalProcess], scenario: str, first: bool
) -> None:
    engine, router = hostile
    before = engine.requests
    failed_before = (await metrics_of(router.url)).get(UPSTREAM_ERROR, 0)
    reply = await send(router.url, chat(scenario, max_tokens=4, stream=True))
    if first:
        assert reply.status == 502, reply.raw
        assert reply.json()["error"]["code"] == "upstream_error"
        assert engine.requests - before == 2
    else:
        assert reply.status == 200
        events = reply.events()
        assert "[DONE]" not in events, events
        *relayed, last = events
        assert set(last) == {"error"} and last["error"]["code"] == "upstream_error"
        assert set(last["error"]) == {"message", "type", "param", "code"}
        assert "engine sent" in last["error"]["message"]
        # What came before the malformed event, and nothing of it.
        assert [e["choices"][0]["delta"] for e in relayed] == [
            {"role": "assistant", "content": ""},
            {"content": "hello"},
        ][: len(relayed)]
        assert engine.requests - before == 1
    values = await metrics_of(router.url)
    assert values[UPSTREAM_ERROR] - failed_before == 1
