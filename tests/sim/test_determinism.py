"""Same seed and same request give the same text and ids; the ids always decode to the text."""

from __future__ import annotations

from typing import Any

import aiohttp

from narwhal.protocol.tokenizer import SimTokenizer
from narwhal.sim import RunningSim

from .conftest import chat_body, post_json, post_stream

TOK = SimTokenizer()


async def _answer(http: aiohttp.ClientSession, sim: RunningSim, body: dict[str, Any]) -> Any:
    status, answer = await post_json(http, f"{sim.url}/v1/chat/completions", body)
    assert status == 200
    choice = answer["choices"][0]
    return choice["message"]["content"], choice["token_ids"], choice["finish_reason"]


async def test_same_seed_same_output(sim_factory: Any, http: aiohttp.ClientSession) -> None:
    one = await sim_factory(seed=7)
    two = await sim_factory(seed=7)
    other = await sim_factory(seed=8)
    body = chat_body("Write me a poem about routers.", return_token_ids=True, max_tokens=200)
    first = await _answer(http, one, body)
    assert first == await _answer(http, one, body)
    assert first == await _answer(http, two, body)
    assert first != await _answer(http, other, body)
    assert first != await _answer(http, one, dict(body, seed=1))  # the request's seed counts
    text, ids, finish = first
    assert TOK.decode(ids[:-1] if finish == "stop" else ids) == text


async def test_streamed_equals_whole(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    body = chat_body("Same in both modes.", return_token_ids=True, max_tokens=100)
    text, ids, _ = await _answer(http, sim, body)
    result = await post_stream(
        http, f"{sim.url}/v1/chat/completions", dict(body, stream=True, stream_interval=3)
    )
    assert result.content == text and result.token_ids() == ids


async def test_output_lengths_vary_around_the_mean(
    sim_factory: Any, http: aiohttp.ClientSession
) -> None:
    sim = await sim_factory(output_len_mean=40.0)
    lengths = []
    for i in range(30):
        _status, answer = await post_json(
            http, f"{sim.url}/v1/completions", {"prompt": f"prompt number {i}", "max_tokens": 1000}
        )
        lengths.append(answer["usage"]["completion_tokens"])
        assert answer["choices"][0]["finish_reason"] == "stop"
    assert len(set(lengths)) > 10
    assert 20 < sum(lengths) / len(lengths) < 65
