"""Wire fidelity with a real vLLM (issue 22, item 5): what vLLM answers directly, a client
gets through Narwhal too, or a clear 400 before any engine work where Narwhal refuses
what it does not serve (a list of several prompts)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.e2e.conftest import metrics_of, send
from tests.processes import NarwhalProcess
from tests.real.conftest import MAX_MODEL_LEN, MODEL, VLLM_MARKS
from tests.real.engines import EngineProcess
from tests.real.test_vllm_relay import both, completion

pytestmark = VLLM_MARKS


async def test_echo_keeps_the_prompt_text(vllm: EngineProcess, router: NarwhalProcess) -> None:
    direct, routed = await both(vllm, router, completion("Once upon a time", echo=True))
    text = routed.json()["choices"][0]["text"]
    assert text.startswith("Once upon a time")
    assert text == direct.json()["choices"][0]["text"]


async def test_prompt_logprobs_without_streaming_are_answered(
    vllm: EngineProcess, router: NarwhalProcess
) -> None:
    """vLLM refuses `prompt_logprobs` on a stream, so Narwhal must not stream this one."""
    direct, routed = await both(vllm, router, completion("Hello there", prompt_logprobs=1))
    got = routed.json()["choices"][0]["prompt_logprobs"]
    assert got == direct.json()["choices"][0]["prompt_logprobs"]
    assert got[0] is None and len(got) == direct.json()["usage"]["prompt_tokens"]
    assert routed.json()["usage"] == direct.json()["usage"]


async def test_a_list_of_prompts_is_refused_naming_prompt_before_any_engine_work(
    vllm: EngineProcess, router: NarwhalProcess
) -> None:
    """vLLM serves a list of prompts as one choice each; Narwhal refuses it with a 400
    naming `prompt` (the issue's other allowed answer), never a 502 blamed on the
    engines; a list of one, and a flat list of token IDs, are one prompt and served."""
    prompts = ["Hello there", "Once upon a time", "The quick brown fox"]
    before = _completions_seen(vllm)
    values = await metrics_of(router.url)
    invalid = values.get('narwhal_outcomes_total{outcome="invalid"}', 0)
    reply = await send(router.url, completion(prompts, max_tokens=6))
    assert reply.status == 400, reply.raw
    error = reply.json()["error"]
    assert error["param"] == "prompt" and error["type"] == "invalid_request_error"
    assert _completions_seen(vllm) == before
    values = await metrics_of(router.url)
    assert values.get('narwhal_outcomes_total{outcome="invalid"}', 0) == invalid + 1
    assert values.get('narwhal_outcomes_total{outcome="upstream_error"}', 0) == 0
    direct, routed = await both(vllm, router, completion(["Hello there"], max_tokens=6))
    assert (
        routed.status == 200
        and routed.json()["choices"][0]["text"] == (direct.json()["choices"][0]["text"])
    )


@pytest.mark.parametrize(
    "fields",
    [{"max_tokens": 5000}, {"prompt_logprobs": 1, "stream": True}],
    ids=["max_tokens_over_the_context", "prompt_logprobs_on_a_stream"],
)
async def test_an_engine_400_keeps_its_param(
    vllm: EngineProcess, router: NarwhalProcess, fields: dict[str, Any]
) -> None:
    body = completion("Hello there", **fields)
    direct = await send(vllm.url, body)
    routed = await send(router.url, body)
    assert direct.status == routed.status == 400
    param = direct.json()["error"]["param"]
    assert param in fields and routed.json()["error"]["param"] == param


async def test_models_carries_the_engines_max_model_len(router: NarwhalProcess) -> None:
    reply = await _get(router.url + "/v1/models")
    (model,) = reply["data"]
    assert model["id"] == MODEL and model["max_model_len"] == MAX_MODEL_LEN


async def test_a_prompt_over_the_context_is_400_before_any_engine_work(
    vllm: EngineProcess, router: NarwhalProcess
) -> None:
    # Narwhal sizes text by an estimate (no tokenizer configured) whose bounds the engine's
    # usage teaches: 40 prompts of 20-odd words, then one the bounds put past the context.
    for start in range(0, 40, 8):
        bodies = [
            completion(f"{i} " + " year woman" * 12, max_tokens=1) for i in range(start, start + 8)
        ]
        replies = await asyncio.gather(*(send(router.url, body) for body in bodies))
        assert all(r.status == 200 for r in replies), [r.raw for r in replies]
    prompt = " year woman" * MAX_MODEL_LEN  # well over 2,048 tokens in the model's tokenizer
    before = _completions_seen(vllm)
    reply = await send(router.url, completion(prompt, max_tokens=4))
    assert reply.status == 400, reply.raw
    error = reply.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert error["type"] == "invalid_request_error" and str(MAX_MODEL_LEN) in error["message"]
    assert _completions_seen(vllm) == before  # vLLM never saw it


async def _get(url: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert resp.status == 200
        return await resp.json()


def _completions_seen(vllm: EngineProcess) -> int:
    """The completion requests vLLM has received (its access log)."""
    return vllm.log.read_text(errors="replace").count('"POST /v1/completions HTTP/1.1"')
