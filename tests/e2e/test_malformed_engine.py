"""A hostile engine's malformed events fail the request the same way whether the client
streams or not (shape.py): a 502 before the response starts, after another attempt on
the other engine; an OpenAI-shaped error event and no `[DONE]` once it has started; and
never any of the malformed event's bytes. A malformed finish is no finish: a stream that
ends on one without `[DONE]` (which an `openai` engine may do once every choice has
finished) is not taken for a complete one. A usage count that is no count (too large,
negative, a float, a bool, a string) is a malformed field too, and never reaches the
router's token counters.

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
from tests.metrics_text import total
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
GOOD_USAGE = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
# Each bad usage, by the prompt's name: what a usage chunk after the finish carries.
BAD_USAGE = {
    "usage prompt_tokens of 401 digits": {**GOOD_USAGE, "prompt_tokens": 10**400},
    "usage prompt_tokens 2**70": {**GOOD_USAGE, "prompt_tokens": 2**70},
    "usage prompt_tokens 2**31": {**GOOD_USAGE, "prompt_tokens": 2**31},
    "usage completion_tokens -1": {**GOOD_USAGE, "completion_tokens": -1},
    "usage completion_tokens 1.0": {**GOOD_USAGE, "completion_tokens": 1.0},
    "usage prompt_tokens true": {**GOOD_USAGE, "prompt_tokens": True},
    "usage total_tokens string": {**GOOD_USAGE, "total_tokens": "4"},
    "usage cached_tokens -5": {**GOOD_USAGE, "prompt_tokens_details": {"cached_tokens": -5}},
    "usage details string": {**GOOD_USAGE, "completion_tokens_details": "none"},
}
for name, usage in BAD_USAGE.items():
    SCENARIOS[name] = [ROLE, HELLO, STOP, sse({"id": "x", "choices": [], "usage": usage}), DONE]
UPSTREAM_ERROR = 'narwhal_outcomes_total{outcome="upstream_error"}'
TOKEN_COUNTERS = (
    "narwhal_prompt_tokens_total",
    "narwhal_completion_tokens_total",
    "narwhal_output_tokens_total",
)


def script(body: dict[str, Any]) -> Script:
    # A pause after the first two events (the role, the first output): a failure in the
    # next ones comes after the headers.
    return Script(SCENARIOS[body["messages"][-1]["content"]], pause_after=2)


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


# (scenario, the failure comes before the first output: before the response starts,
# which waits for it; a role chunk alone does not start it)
STREAMED = [
    ("finish 5", False),
    ("finish 5, no [DONE]", False),
    ("index -1", True),
    ("delta hi", True),
    ("tool call without index", True),
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


@pytest.mark.parametrize("stream", [False, True])
async def test_a_bad_usage_count_is_malformed_and_never_counted(
    hostile: tuple[HostileEngine, NarwhalProcess], stream: bool
) -> None:
    engine, router = hostile
    for name in BAD_USAGE:
        before, values = engine.requests, await metrics_of(router.url)
        reply = await send(router.url, chat(name, max_tokens=4, stream=stream))
        if stream:
            # The usage comes after the headers: an error event ends the stream.
            assert reply.status == 200, (name, reply.raw)
            *relayed, last = reply.events()
            assert set(last) == {"error"} and last["error"]["code"] == "upstream_error", name
            assert "engine sent a malformed usage" in last["error"]["message"], name
            assert all("usage" not in e for e in relayed), name  # none of its bytes
            assert engine.requests - before == 1, name
        else:
            assert reply.status == 502, (name, reply.raw)
            error = reply.json()["error"]
            assert error["code"] == "upstream_error", name
            assert "engine sent a malformed usage" in error["message"], name
            assert engine.requests - before == 2, name  # retried on the other engine
        after = await metrics_of(router.url)
        assert after[UPSTREAM_ERROR] - values.get(UPSTREAM_ERROR, 0) == 1, name
        # No bad count reached the books: what was added is the router's own (its sizing
        # of the prompt for a stream that started, the attempts' output events), never
        # the engine's number.
        for counter in TOKEN_COUNTERS:
            added = total(after, counter) - total(values, counter)
            assert 0 <= added < 100, (name, counter, added)
        assert from_usage(after) == from_usage(values), name


def from_usage(values: dict[str, float]) -> float:
    """The output tokens counted from engines' usage."""
    return sum(v for k, v in values.items() if 'source="usage"' in k)
