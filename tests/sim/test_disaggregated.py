"""vLLM's P/D handshake (PROTOCOL.md §4) between two sims, driven like the toy proxy."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from .conftest import chat_body, post_json, post_stream, sim_process

LONG_PROMPT = "the quick brown fox jumps over the lazy dog " * 400  # ~3600 tokens
TOY_PROXY_KV = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def _prefill_body(client_body: dict[str, Any]) -> dict[str, Any]:
    """What vLLM's toy proxy sends to the prefiller."""
    body = dict(client_body, kv_transfer_params=TOY_PROXY_KV, stream=False, max_tokens=1)
    body.pop("stream_options", None)
    return body


async def _prefill(
    http: aiohttp.ClientSession, url: str, client_body: dict[str, Any], request_id: str
) -> tuple[float, dict[str, Any]]:
    started = time.monotonic()
    status, answer = await post_json(
        http, f"{url}/v1/chat/completions", _prefill_body(client_body),
        headers={"X-Request-Id": request_id},
    )  # fmt: skip
    assert status == 200, answer
    return time.monotonic() - started, answer


async def test_handshake_across_two_processes(http: aiohttp.ClientSession) -> None:
    perf = ("--time-scale", "1", "--prefill-tokens-per-s", "10000")
    with sim_process("--role", "prefill", *perf) as p, sim_process("--role", "decode", *perf) as d:
        client_body = chat_body(
            LONG_PROMPT, stream=True, max_tokens=8, ignore_eos=True,
            return_token_ids=True, stream_options={"include_usage": True},
        )  # fmt: skip
        prefill_s, answer = await _prefill(http, p.url, client_body, "req-1")
        assert answer["id"] == "chatcmpl-req-1"
        assert answer["usage"]["completion_tokens"] == 1
        assert answer["choices"][0]["finish_reason"] == "length"
        params = answer["kv_transfer_params"]
        port = int(p.url.rsplit(":", 1)[1])
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert params["remote_host"] == "127.0.0.1" and params["remote_port"] == port
        assert params["tp_size"] == 1
        assert params["remote_num_tokens"] == answer["usage"]["prompt_tokens"]
        assert isinstance(params["remote_block_ids"], list) and params["remote_block_ids"][0]
        assert params["remote_engine_id"] and params["remote_request_id"]
        async with http.get(f"{p.url}/sim/state") as response:
            assert (await response.json())["held_requests"] == 1
        assert prefill_s > 0.3  # ~3600 tokens at 10k tokens/s

        decode_body = dict(client_body, kv_transfer_params=params)
        started = time.monotonic()
        result = await post_stream(
            http, f"{d.url}/v1/chat/completions", decode_body, headers={"X-Request-Id": "req-1"}
        )
        decode_s = time.monotonic() - started
        assert result.status == 200
        assert result.chunks[-1]["usage"]["completion_tokens"] == 8
        assert len(result.token_ids()) == 8
        assert decode_s < prefill_s / 3  # decoding did not pay the prefill again
        async with http.get(f"{p.url}/sim/state") as response:
            state = await response.json()
        assert state["held_requests"] == 0 and state["kv_held_tokens"] == 0

        # The blocks were handed over: the same params again are unknown.
        status, body = await post_json(http, f"{d.url}/v1/chat/completions", decode_body)
        assert status == 503
        error = body["error"]
        assert error["type"] == "ServiceUnavailableError" and error["code"] == 503
        assert "unknown or expired" in error["message"]


async def test_expired_blocks_fail_with_503(sim_factory: Any, http: aiohttp.ClientSession) -> None:
    prefill = await sim_factory(role="prefill", kv_hold_s=0.2)
    decode = await sim_factory(role="decode")
    client_body = chat_body("hello there", max_tokens=4)
    _, answer = await _prefill(http, prefill.url, client_body, "r2")
    await asyncio.sleep(0.5)
    async with http.get(f"{prefill.url}/sim/state") as response:
        state = await response.json()
    assert state["held_requests"] == 0 and state["kv_used_tokens"] == 0  # the lease dropped them
    status, body = await post_json(
        http, f"{decode.url}/v1/chat/completions",
        dict(client_body, kv_transfer_params=answer["kv_transfer_params"]),
    )  # fmt: skip
    assert status == 503 and "unknown or expired" in body["error"]["message"]


async def test_decode_checks_params_and_prompt(
    sim_factory: Any, http: aiohttp.ClientSession
) -> None:
    prefill = await sim_factory(role="prefill")
    decode = await sim_factory(role="decode")
    url = f"{decode.url}/v1/chat/completions"
    status, body = await post_json(
        http, url, chat_body("x", kv_transfer_params={"do_remote_prefill": True})
    )
    assert status == 400 and "remote_request_id" in body["error"]["message"]

    _, answer = await _prefill(http, prefill.url, chat_body("one prompt"), "r3")
    status, body = await post_json(
        http, url, chat_body("another prompt", kv_transfer_params=answer["kv_transfer_params"])
    )
    assert status == 400 and "prompt differs" in body["error"]["message"]

    unreachable = dict(answer["kv_transfer_params"], remote_port=1)
    status, body = await post_json(
        http, url, chat_body("one prompt", kv_transfer_params=unreachable)
    )
    assert status == 503 and body["error"]["type"] == "ServiceUnavailableError"


async def test_roles_without_params_and_mismatches(
    sim_factory: Any, http: aiohttp.ClientSession
) -> None:
    prefill = await sim_factory(role="prefill")
    decode = await sim_factory(role="decode", time_scale=1.0, prefill_tokens_per_s=10_000.0)
    # Without transfer params both serve the whole request; the decoder pays the prefill.
    status, body = await post_json(
        http, f"{prefill.url}/v1/chat/completions", chat_body("#sim:len=5")
    )
    assert status == 200 and body["usage"]["completion_tokens"] == 5
    assert body["kv_transfer_params"] is None
    started = time.monotonic()
    status, body = await post_json(
        http, f"{decode.url}/v1/chat/completions", chat_body(LONG_PROMPT, max_tokens=1)
    )
    assert status == 200 and time.monotonic() - started > 0.3
    # A request for the other side is a clear 400.
    status, body = await post_json(
        http, f"{decode.url}/v1/chat/completions", chat_body("x", kv_transfer_params=TOY_PROXY_KV)
    )
    assert status == 400 and "--role decode" in body["error"]["message"]
    status, body = await post_json(
        http, f"{prefill.url}/v1/chat/completions",
        chat_body("x", kv_transfer_params={"do_remote_prefill": True}),
    )  # fmt: skip
    assert status == 400 and "--role prefill" in body["error"]["message"]


async def test_role_both_does_either_side(sim_factory: Any, http: aiohttp.ClientSession) -> None:
    first = await sim_factory()
    second = await sim_factory()
    body = chat_body("completions too", stream=True, max_tokens=3, ignore_eos=True)
    _, answer = await _prefill(http, first.url, body, "r4")
    result = await post_stream(
        http, f"{second.url}/v1/chat/completions",
        dict(body, kv_transfer_params=answer["kv_transfer_params"]),
    )  # fmt: skip
    assert result.status == 200 and result.chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_block_ids_follow_the_block_size_and_decode_reports_pulled_tokens(
    sim_factory: Any, http: aiohttp.ClientSession
) -> None:
    prefill = await sim_factory(role="prefill", block_size=32)
    decode = await sim_factory(role="decode", block_size=32, enable_prompt_tokens_details=True)
    client_body = chat_body(LONG_PROMPT, max_tokens=4)
    _, answer = await _prefill(http, prefill.url, client_body, "r-blocks")
    prompt_tokens = answer["usage"]["prompt_tokens"]
    (block_ids,) = answer["kv_transfer_params"]["remote_block_ids"]
    # The prefill engine's own blocks for the prompt, held for the decoder.
    assert len(block_ids) == len(set(block_ids)) == -(-prompt_tokens // 32)
    async with http.get(f"{prefill.url}/sim/state") as response:
        assert (await response.json())["kv_held_blocks"] == len(block_ids)
    decode_body = dict(client_body, kv_transfer_params=answer["kv_transfer_params"])
    status, body = await post_json(http, f"{decode.url}/v1/chat/completions", decode_body)
    assert status == 200
    # As vLLM counts num_cached_tokens: everything the first step found computed, the
    # pulled KV included; only the last prompt token is computed again.
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": prompt_tokens - 1}
    async with http.get(f"{prefill.url}/sim/state") as response:
        state = await response.json()
    assert state["kv_held_blocks"] == 0 and state["kv_used_blocks"] == 0
    assert state["kv_cached_free_blocks"] == prompt_tokens // 32  # still hits on the prefiller
