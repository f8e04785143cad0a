"""Engine dialects: generic OpenAI-compatible servers and SGLang behind Narwhal."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.e2e.conftest import MODEL, chat, completion, fleet_config, metrics_of, send, sim_process
from tests.processes import NarwhalProcess, router_process


@pytest.fixture(scope="module")
def openai_router() -> Iterator[NarwhalProcess]:
    # The simulated generic server answers 422 to vLLM-only fields, like transformers serve.
    with sim_process("--time-scale", "0", "--dialect", "openai") as sim:
        with router_process(fleet_config([("o0", sim, "openai")])) as process:
            yield process


@pytest.fixture(scope="module")
def sglang_router() -> Iterator[NarwhalProcess]:
    with sim_process("--time-scale", "0", "--dialect", "sglang") as sim:
        with router_process(fleet_config([("g0", sim, "sglang")])) as process:
            yield process


async def test_openai_engine_gets_no_vllm_fields_and_the_stream_ends_properly(
    openai_router: NarwhalProcess,
) -> None:
    reply = await send(openai_router.url, chat(stream=True, max_tokens=6, return_token_ids=True))
    assert reply.status == 200, reply.raw
    events = reply.events()
    assert events[-1] == "[DONE]"  # the engine sent none; the stream still ends as OpenAI's
    assert all("usage" not in e for e in events if isinstance(e, dict))


async def test_openai_engine_usage_on_the_finishing_chunk(openai_router: NarwhalProcess) -> None:
    reply = await send(
        openai_router.url,
        chat(stream=True, max_tokens=6, stream_options={"include_usage": True}),
    )
    usage = [e["usage"] for e in reply.events() if isinstance(e, dict) and e.get("usage")]
    assert len(usage) == 1 and usage[0]["completion_tokens"] > 0


async def test_openai_engine_non_streaming_and_accounting(openai_router: NarwhalProcess) -> None:
    reply = await send(openai_router.url, completion(max_tokens=7))
    assert reply.status == 200, reply.raw
    body = reply.json()
    assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] > 0
    async with aiohttp.ClientSession() as session:
        async with session.get(openai_router.url + "/admin/engines") as resp:
            (engine,) = (await resp.json())["engines"]
    assert engine["token_accounting"] == "unavailable"
    values = await metrics_of(openai_router.url)
    assert values['narwhal_output_tokens_total{engine="o0",source="usage"}'] > 0


@pytest.fixture(scope="module")
def openai_sim() -> Iterator[NarwhalProcess]:
    with sim_process("--time-scale", "0", "--dialect", "openai", "--seed", "5") as sim:
        yield sim


@pytest.mark.parametrize("scenario", ["", "#sim:reasoning"])
@pytest.mark.parametrize("make", [chat, completion])
async def test_openai_engine_answers_are_its_own(
    openai_sim: NarwhalProcess, make: Any, scenario: str
) -> None:
    """An engine that leaves its nulls out (transformers serve) gets none added: the
    assembled choices are the engine's own non-streaming ones, `logprobs` key included."""
    with router_process(fleet_config([("o0", openai_sim, "openai")])) as router:
        body = make(f"Tell me a story {scenario}", max_tokens=8, seed=1)
        direct = (await send(openai_sim.url, body)).json()
        assembled = await send(router.url, body)
        assert assembled.status == 200, assembled.raw
        assert "logprobs" not in direct["choices"][0]  # what the test relies on
        assert assembled.json()["choices"] == direct["choices"]


@pytest.mark.parametrize("stream", [True, False])
async def test_sglang_engine_chat_and_completions(
    sglang_router: NarwhalProcess, stream: bool
) -> None:
    for body in (chat(stream=stream, max_tokens=5), completion(stream=stream, max_tokens=5)):
        reply = await send(sglang_router.url, body)
        assert reply.status == 200, reply.raw
        if stream:
            assert reply.events()[-1] == "[DONE]"
        else:
            assert reply.json()["usage"]["completion_tokens"] > 0
    values = await metrics_of(sglang_router.url)
    assert values['narwhal_output_tokens_total{engine="g0",source="token_ids"}'] > 0


@pytest.fixture(scope="module")
def sglang_sim() -> Iterator[NarwhalProcess]:
    with sim_process("--time-scale", "0", "--dialect", "sglang", "--seed", "3") as sim:
        yield sim


async def test_sglang_chat_ids_reach_clients_that_ask(sglang_sim: NarwhalProcess) -> None:
    """SGLang refuses return_token_ids on streamed chat and gives the IDs in one sglext
    chunk at the end when asked (PROTOCOL.md §6.1): a streaming client gets that chunk,
    a non-streaming one the IDs SGLang's own non-streaming answer holds."""
    with router_process(fleet_config([("g0", sglang_sim, "sglang")])) as router:
        body = chat("Say something", max_tokens=6, seed=1, return_token_ids=True)
        direct = (await send(sglang_sim.url, body)).json()["choices"][0]
        assembled = await send(router.url, body)
        assert assembled.status == 200, assembled.raw
        reply = assembled.json()
        assert reply["choices"][0]["token_ids"] == direct["response_token_ids"]
        assert reply["prompt_token_ids"] == direct["prompt_token_ids"]
        streamed = await send(router.url, {**body, "stream": True})
        events = [e for e in streamed.events() if isinstance(e, dict)]
        (ids,) = [e["sglext"] for e in events if "sglext" in e]
        assert ids["output_ids"] == [direct["response_token_ids"]]
        assert streamed.events()[-1] == "[DONE]"
        plain = await send(router.url, {**body, "return_token_ids": False, "stream": True})
        assert all("sglext" not in e for e in plain.events() if isinstance(e, dict))


def _without_ids_and_times(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k not in ("id", "created")}


@pytest.mark.parametrize("scenario", ["", "#sim:reasoning", "#sim:tool_calls"])
@pytest.mark.parametrize("make", [chat, completion])
async def test_sglang_answers_are_sglangs_own(
    sglang_sim: NarwhalProcess, make: Any, scenario: str
) -> None:
    """A client that asked for nothing extra gets what SGLang itself would send: its
    `"usage": null` on every chunk (SGLang writes its nulls whatever was asked), and an
    assembled answer with the null message fields SGLang's own answer has."""
    with router_process(fleet_config([("g0", sglang_sim, "sglang")])) as router:
        body = make(f"Tell me a story {scenario}", max_tokens=8, seed=1, stream=True)
        direct = await send(sglang_sim.url, body)
        relayed = await send(router.url, body)
        assert relayed.status == 200, relayed.raw
        direct_events = [_without_ids_and_times(e) for e in direct.events() if isinstance(e, dict)]
        assert [
            _without_ids_and_times(e) for e in relayed.events() if isinstance(e, dict)
        ] == direct_events
        assert all(e["usage"] is None for e in direct_events)  # what the test relies on
        assert relayed.events()[-1] == "[DONE]"
        whole = {**body, "stream": False}
        direct_answer = (await send(sglang_sim.url, whole)).json()
        assembled = (await send(router.url, whole)).json()
        assert assembled["choices"] == direct_answer["choices"]
        assert assembled["usage"] == direct_answer["usage"]


async def test_a_server_that_does_not_stream_gets_a_clear_502() -> None:
    """Narwhal always asks for a stream; a server that ignores `stream: true` and answers
    one JSON body fails the attempt with a message that says so."""

    async def whole_answer(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 1,
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "hi"},
                        "finish_reason": "stop",
                    }
                ],
            }
        )

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", whole_answer)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    config = {
        "model": MODEL,
        "admission": {"mode": "open"},
        "engines": [{"name": "j", "url": f"http://127.0.0.1:{port}", "dialect": "openai"}],
    }
    try:
        with contextlib.ExitStack() as stack:
            # Started off the loop: the router probes this loop's server while it starts.
            router = await asyncio.to_thread(stack.enter_context, router_process(config))
            for stream in (True, False):
                reply = await send(router.url, chat("hi", stream=stream, max_tokens=3))
                assert reply.status == 502
                error = reply.json()["error"]
                assert error["code"] == "upstream_error"
                assert "not an event stream" in error["message"]
    finally:
        await runner.cleanup()


async def test_a_vllm_too_old_for_token_ids_is_asked_for_none_and_served() -> None:
    """A vLLM whose /version predates `return_token_ids` (0.10.2) sends no IDs whatever it
    is asked (the sim's `--vllm-version`): the fleet monitor resolves the engine's
    capabilities from that version, so its requests ask for none and are counted from
    usage and events, where each used to fail its token-ID check (502)."""
    with sim_process("--time-scale", "0", "--vllm-version", "0.9.2") as sim:
        with router_process(fleet_config([("v0", sim, "vllm")])) as router:
            for body in (
                chat(stream=True, max_tokens=6, stream_options={"include_usage": True}),
                completion(max_tokens=6),
            ):
                reply = await send(router.url, body)
                assert reply.status == 200, reply.raw
            async with aiohttp.ClientSession() as session:
                async with session.get(router.url + "/admin/engines") as resp:
                    (engine,) = (await resp.json())["engines"]
            assert engine["token_accounting"] == "unavailable"
            assert engine["monitoring"]["supplies_token_ids"] is False
            values = await metrics_of(router.url)
            assert values.get('narwhal_output_tokens_total{engine="v0",source="usage"}', 0) > 0
            assert not values.get('narwhal_output_tokens_total{engine="v0",source="token_ids"}')
