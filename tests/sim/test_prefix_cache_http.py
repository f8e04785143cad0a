"""Prefix caching as a client and a scraper see it, over real sockets.

Completions with token-ID prompts make block boundaries exact (16 tokens a block): a
300-token shared prefix is 18 full blocks (288 tokens) and a partial one.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from narwhal.sim import RunningSim

from .conftest import chat_body, post_json, post_stream

SHARED = list(range(1000, 1300))  # 300 token IDs
MODEL = "narwhal-sim"


def _completion(prompt: list[int], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 2, **extra}


async def _usage(http: aiohttp.ClientSession, sim: RunningSim, prompt: list[int]) -> Any:
    status, body = await post_json(http, f"{sim.url}/v1/completions", _completion(prompt))
    assert status == 200, body
    return body["usage"]


async def _samples(http: aiohttp.ClientSession, url: str) -> dict[str, list[Any]]:
    async with http.get(f"{url}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


async def _counter(http: aiohttp.ClientSession, url: str, name: str) -> float:
    (sample,) = (await _samples(http, url))[name]
    return float(sample.value)


async def _state(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(f"{url}/sim/state") as response:
        state: dict[str, Any] = await response.json()
    return state


async def test_cached_tokens_in_usage_with_prompt_tokens_details(
    sim_factory: Any, http: aiohttp.ClientSession
) -> None:
    sim = await sim_factory(enable_prompt_tokens_details=True)
    first = await _usage(http, sim, [*SHARED, 1, 2, 3])
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    second = await _usage(http, sim, [*SHARED, 4, 5, 6, 7])
    assert second["prompt_tokens"] == 304
    assert second["prompt_tokens_details"] == {"cached_tokens": 288}

    # Streaming: the final usage chunk carries it (and no null keys, as vLLM dumps it).
    body = _completion([*SHARED, 8], stream=True, stream_options={"include_usage": True})
    result = await post_stream(http, f"{sim.url}/v1/completions", body)
    usage = result.chunks[-1]["usage"]
    assert result.chunks[-1]["choices"] == []
    assert usage["prompt_tokens_details"] == {"cached_tokens": 288}


async def test_chat_prompts_sharing_a_system_prompt(
    sim_factory: Any, http: aiohttp.ClientSession
) -> None:
    sim = await sim_factory(enable_prompt_tokens_details=True)
    system = {"role": "system", "content": "You are a careful assistant. " * 60}

    def messages(question: str) -> list[dict[str, str]]:
        return [system, {"role": "user", "content": question}]

    def body(question: str) -> dict[str, Any]:
        stream = {"stream": True, "stream_options": {"include_usage": True}, "max_tokens": 2}
        return chat_body("", **stream) | {"messages": messages(question)}

    async def prompt_ids(question: str) -> list[int]:
        payload = {"messages": messages(question)}
        status, answer = await post_json(http, f"{sim.url}/tokenize", payload)
        assert status == 200
        ids: list[int] = answer["tokens"]
        return ids

    first, second = await prompt_ids("What is a narwhal?"), await prompt_ids("And a walrus?")
    common = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert common > 64
    for question, cached in (("What is a narwhal?", 0), ("And a walrus?", common // 16 * 16)):
        result = await post_stream(http, f"{sim.url}/v1/chat/completions", body(question))
        assert result.status == 200
        assert result.chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": cached}


async def test_prompt_tokens_details_is_null_without_the_flag(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    await _usage(http, sim, [*SHARED, 1])
    usage = await _usage(http, sim, [*SHARED, 2])
    assert usage["prompt_tokens_details"] is None
    body = _completion([*SHARED, 3], stream=True, stream_options={"include_usage": True})
    result = await post_stream(http, f"{sim.url}/v1/completions", body)
    assert "prompt_tokens_details" not in result.chunks[-1]["usage"]
    # The cache works all the same; only the report is off.
    assert await _counter(http, sim.url, "vllm:prefix_cache_hits_total") == 2 * 288


async def test_metrics_move_by_the_tokens_queried_and_found(
    sim_factory: Any, http: aiohttp.ClientSession
) -> None:
    sim = await sim_factory(block_size=32, kv_capacity_tokens=64_000)
    samples = await _samples(http, sim.url)
    (info,) = samples["vllm:cache_config_info"]
    assert info.value == 1.0
    assert info.labels["block_size"] == "32" and info.labels["num_gpu_blocks"] == "2000"
    assert info.labels["enable_prefix_caching"] == "True" and info.labels["engine"] == "0"
    assert "model_name" not in info.labels
    assert {"cache_dtype", "gpu_memory_utilization"} <= set(info.labels)
    (queries,) = samples["vllm:prefix_cache_queries_total"]
    assert queries.labels == {"model_name": MODEL, "engine": "0"} and queries.value == 0

    await _usage(http, sim, [*SHARED, 1])  # 301 tokens, nothing cached
    assert await _counter(http, sim.url, "vllm:prefix_cache_queries_total") == 301
    assert await _counter(http, sim.url, "vllm:prefix_cache_hits_total") == 0
    await _usage(http, sim, [*SHARED, 2, 3])  # 302 tokens: 9 blocks of 32 are hits
    assert await _counter(http, sim.url, "vllm:prefix_cache_queries_total") == 301 + 302
    assert await _counter(http, sim.url, "vllm:prefix_cache_hits_total") == 288
    await _usage(http, sim, [7, *SHARED])  # another first token: the chain breaks at once
    assert await _counter(http, sim.url, "vllm:prefix_cache_hits_total") == 288


async def test_modelled_prefill_counts_only_the_uncached_tokens(
    sim_factory: Any, http: aiohttp.ClientSession
) -> None:
    # A real sleeping sim (time-scale 1, fast enough to keep the test short); what is
    # compared is the sim's own account of what it prefilled, not wall-clock time.
    rate = 100_000.0
    sim = await sim_factory(time_scale=1.0, prefill_tokens_per_s=rate)
    long_prefix = list(range(2000, 4000))  # 2000 tokens: 125 blocks
    before = await _state(http, sim.url)
    await _usage(http, sim, [*long_prefix, 1, 2])
    middle = await _state(http, sim.url)
    await _usage(http, sim, [*long_prefix, 3, 4])
    after = await _state(http, sim.url)
    first = middle["prefill_tokens_computed"] - before["prefill_tokens_computed"]
    second = after["prefill_tokens_computed"] - middle["prefill_tokens_computed"]
    assert (first, second) == (2002, 2)
    assert second / rate < first / rate / 100  # the second first token came that much sooner
    assert after["prefix_cache_hits"] == 2000
    # Both done: their blocks are free (KV usage 0) yet still cached for the next one.
    assert after["kv_used_blocks"] == 0 and after["kv_usage"] == 0.0
    assert after["kv_cached_free_blocks"] == 125


async def test_without_prefix_caching_nothing_is_ever_a_hit(
    sim_factory: Any, http: aiohttp.ClientSession
) -> None:
    sim = await sim_factory(enable_prefix_caching=False, enable_prompt_tokens_details=True)
    for _ in range(3):
        usage = await _usage(http, sim, [*SHARED, 1])
        assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    state = await _state(http, sim.url)
    assert state["prefill_tokens_computed"] == 3 * 301
    assert state["kv_cached_free_blocks"] == 0
    samples = await _samples(http, sim.url)
    assert samples["vllm:prefix_cache_hits_total"][0].value == 0
    assert samples["vllm:prefix_cache_queries_total"][0].value == 0  # no lookup, no query
    assert samples["vllm:cache_config_info"][0].labels["enable_prefix_caching"] == "False"


async def test_sglang_reports_its_hit_rate_and_cached_tokens(
    sim_factory: Any, http: aiohttp.ClientSession
) -> None:
    sim = await sim_factory(dialect="sglang", enable_prompt_tokens_details=True)
    await _usage(http, sim, [*SHARED, 1, 2, 3])
    usage = await _usage(http, sim, [*SHARED, 4, 5, 6, 7])
    assert usage["prompt_tokens_details"] == {"cached_tokens": 288}
    samples = await _samples(http, sim.url)
    (rate,) = samples["sglang:cache_hit_rate"]
    assert rate.labels == {"model_name": MODEL}
    assert rate.value == 288 / 304  # the last prefill batch: the second request alone
    assert samples["sglang:cached_tokens_total"][0].value == 288
    assert "vllm:cache_config_info" not in samples
