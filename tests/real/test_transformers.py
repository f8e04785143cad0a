"""`transformers serve` (Hugging Face's OpenAI-compatible server) as a real engine of the
`openai` dialect, with continuous batching off and on: it sends no token IDs, so Narwhal
counts tokens from its usage (`token_accounting: unavailable`) and relays its answers as they
are. Compared with the same requests sent to it directly, at `temperature: 0`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import metrics_of, send, settle
from tests.processes import NarwhalProcess, router_process
from tests.real.engines import TEST_TIMEOUT_S, EngineProcess, transformers_engine
from tests.real.test_vllm_fleet import engine_report
from tests.real.test_vllm_relay import finish, text_of

# Its own worker under `--dist loadgroup`: the module's engines start once, beside vLLM's.
pytestmark = [pytest.mark.xdist_group("real-transformers"), pytest.mark.timeout(TEST_TIMEOUT_S)]


@pytest.fixture(scope="module", params=[False, True], ids=["batching-off", "batching-on"])
def engine(
    request: pytest.FixtureRequest, model_dir: Path, engine_logs: Path
) -> Iterator[EngineProcess]:
    with transformers_engine(model_dir, engine_logs, continuous_batching=request.param) as process:
        yield process


@pytest.fixture(scope="module")
def model_name(model_dir: Path) -> str:
    """A pinned `transformers serve` answers only requests that name its model's path."""
    return str(model_dir)


@pytest.fixture(scope="module")
def router(engine: EngineProcess, model_name: str) -> Iterator[NarwhalProcess]:
    config = {
        "model": model_name,
        "engines": [{"name": "t0", "url": engine.url, "dialect": "openai", "role": "both"}],
        "admission": {"mode": "open"},
    }
    with router_process(config) as process:
        yield process


def body(model: str, route: str, stream: bool, i: int = 0) -> dict[str, Any]:
    fields: dict[str, Any] = {"model": model, "max_tokens": 12, "temperature": 0}
    if stream:
        fields["stream"] = True
        fields["stream_options"] = {"include_usage": True}
    if route == "chat":
        return {"messages": [{"role": "user", "content": f"Hello there {i}"}], **fields}
    return {"prompt": f"Once upon a time {i}", **fields}


def usage_of(reply: Any) -> dict[str, Any]:
    if reply.headers.get("Content-Type", "").startswith("text/event-stream"):
        (usage,) = [e["usage"] for e in reply.events() if e != "[DONE]" and e.get("usage")]
        return dict(usage)
    return dict(reply.json()["usage"])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("route", ["chat", "completion"])
async def test_answers_match_the_engine_direct(
    engine: EngineProcess, router: NarwhalProcess, model_name: str, route: str, stream: bool
) -> None:
    request = body(model_name, route, stream)
    direct = await send(engine.url, request, timeout=60)
    routed = await send(router.url, request, timeout=60)
    # Narwhal asks every engine for a stream, and assembles a whole answer from it: its text
    # is the engine's streamed text, which drops what transformers' non-streaming answer
    # ends with when max_tokens cuts a character in two (a U+FFFD there), nothing else.
    streamed = await send(engine.url, {**request, "stream": True}, timeout=60)
    assert text_of(routed) == text_of(streamed) != ""
    assert text_of(direct).startswith(text_of(routed))
    assert len(text_of(direct)) - len(text_of(routed)) <= 1
    assert finish(routed)[0] == finish(direct)[0] == "length"
    assert usage_of(routed) == usage_of(direct)
    assert usage_of(routed)["completion_tokens"] == 12


async def test_concurrent_requests_each_get_their_own_answer(
    engine: EngineProcess, router: NarwhalProcess, model_name: str
) -> None:
    requests = [body(model_name, "completion", stream=i % 2 == 1, i=i) for i in range(6)]
    expected = [text_of(await send(engine.url, r, timeout=60)) for r in requests]
    replies = await asyncio.gather(*(send(router.url, r, timeout=120) for r in requests))
    assert [text_of(r) for r in replies] == expected
    values = await settle(router.url, lambda v: v["narwhal_retained_requests"] == 0)
    assert values['narwhal_outcomes_total{outcome="completed"}'] >= 6


async def test_the_engine_is_placed_without_token_ids(router: NarwhalProcess) -> None:
    report = await engine_report(router)
    assert report["dialect"] == "openai" and report["state"] == "up"
    assert report["eligible"] is True and report["token_accounting"] == "unavailable"
    values = await metrics_of(router.url)
    assert values.get('narwhal_outcomes_total{outcome="upstream_error"}', 0) == 0
