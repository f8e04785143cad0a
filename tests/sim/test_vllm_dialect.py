"""The vllm dialect against PROTOCOL.md §1-§3 and §5: keys, nulls, ids, usage, errors."""

from __future__ import annotations

import time
from typing import Any

import aiohttp

from narwhal.protocol.tokenizer import EOS_ID, SimTokenizer
from narwhal.sim import RunningSim

from .conftest import DONE, chat_body, post_json, post_stream

TOK = SimTokenizer()


async def test_chat_stream_with_ids_and_usage(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    body = chat_body(
        "hello #sim:len=6",
        stream=True,
        return_token_ids=True,
        stream_options={"include_usage": True},
    )
    result = await post_stream(
        http, f"{sim.url}/v1/chat/completions", body, headers={"X-Request-Id": "r1"}
    )
    assert result.status == 200
    assert result.headers["Content-Type"].startswith("text/event-stream")
    assert result.raw.endswith(b"data: [DONE]\n\n")
    assert result.events[-1] == DONE
    chunks = result.chunks
    assert {c["id"] for c in chunks} == {"chatcmpl-r1"}
    assert len({c["created"] for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)

    role = chunks[0]
    assert role["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
         "finish_reason": None}
    ]  # fmt: skip
    prompt_ids = TOK.chat_prompt_ids(body["messages"])
    assert role["prompt_token_ids"] == prompt_ids
    assert role["prompt_text"] is None

    content = chunks[1:-1]
    for chunk in content[:-1]:
        choice = chunk["choices"][0]
        assert set(choice) == {"index", "delta", "logprobs", "finish_reason", "token_ids"}
        assert choice["finish_reason"] is None and choice["logprobs"] is None
        assert len(choice["token_ids"]) == 1
        assert chunk["kv_transfer_params"] is None
        assert "usage" not in chunk
    final = content[-1]["choices"][0]
    assert final["finish_reason"] == "stop"
    assert final["stop_reason"] is None  # EOS
    assert final["token_ids"] == [EOS_ID]
    assert final["weight_versions"] is None
    ids = result.token_ids()
    assert len(ids) == 6
    assert TOK.decode(ids[:-1]) == result.content

    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "total_tokens": len(prompt_ids) + 6,
        "completion_tokens": 6,
    }
    assert "kv_transfer_params" not in usage_chunk  # dumped with exclude_none


async def test_chat_stream_without_ids_has_null_keys(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    result = await post_stream(
        http, f"{sim.url}/v1/chat/completions", chat_body("hi #sim:len=3", stream=True)
    )
    role, *content = result.chunks
    assert role["prompt_token_ids"] is None
    assert all(c["choices"][0]["token_ids"] is None for c in content)
    assert all("usage" not in c for c in result.chunks)
    assert content[-1]["system_fingerprint"].startswith("vllm-")


async def test_continuous_usage_and_stream_interval(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    body = chat_body(
        "#sim:len=10",
        stream=True,
        return_token_ids=True,
        stream_interval=4,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    result = await post_stream(http, f"{sim.url}/v1/chat/completions", body)
    role, *content, usage = result.chunks
    assert role["usage"]["completion_tokens"] == 0
    sizes = [len(c["choices"][0]["token_ids"]) for c in content]
    assert sizes == [1, 4, 4, 1]  # first at once, then by 4, the last when finished
    assert [c["usage"]["completion_tokens"] for c in content] == [1, 5, 9, 10]
    assert usage["usage"]["completion_tokens"] == 10


async def test_completions_stream_ids_per_choice(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    body = {"prompt": "Once upon a time #sim:len=4", "stream": True, "return_token_ids": True}
    result = await post_stream(http, f"{sim.url}/v1/completions", body)
    chunks = result.chunks
    keys = {"index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids",
            "token_ids", "weight_versions"}  # fmt: skip
    assert all(set(c["choices"][0]) == keys for c in chunks)
    assert chunks[0]["choices"][0]["prompt_token_ids"] == TOK.completion_prompt_ids(body["prompt"])
    assert all(c["choices"][0]["prompt_token_ids"] is None for c in chunks[1:])
    assert all(c["id"].startswith("cmpl-") and c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert TOK.decode(result.token_ids()[:-1]) == result.text


async def test_completions_prompt_as_ids(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    prompt = [5000, 5001, 5002]
    status, body = await post_json(
        http, f"{sim.url}/v1/completions", {"prompt": prompt, "return_token_ids": True}
    )
    assert status == 200
    assert body["choices"][0]["prompt_token_ids"] == prompt
    assert body["usage"]["prompt_tokens"] == 3


async def test_chat_logprobs(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    body = chat_body("#sim:len=4", stream=True, logprobs=True, top_logprobs=3)
    result = await post_stream(http, f"{sim.url}/v1/chat/completions", body)
    for chunk in result.chunks[1:]:
        (entry,) = chunk["choices"][0]["logprobs"]["content"]
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode())
        assert entry["logprob"] <= 0
        assert len(entry["top_logprobs"]) == 3
        assert set(entry["top_logprobs"][0]) == {"token", "logprob", "bytes"}


async def test_completion_logprobs_offsets_count_across_chunks(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    body = {"prompt": "x", "stream": True, "max_tokens": 6, "logprobs": 2, "ignore_eos": True}
    result = await post_stream(http, f"{sim.url}/v1/completions", body)
    offsets: list[int] = []
    tokens: list[str] = []
    for chunk in result.chunks:
        lp = chunk["choices"][0]["logprobs"]
        assert set(lp) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
        offsets += lp["text_offset"]
        tokens += lp["tokens"]
        assert all(len(top) == 2 for top in lp["top_logprobs"])
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    assert "".join(tokens) == result.text
    assert result.chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_stop_string_cuts_text_and_reports_it(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    base = chat_body("tell me #sim:len=40", return_token_ids=True)
    _, full = await post_json(http, f"{sim.url}/v1/chat/completions", base)
    text = full["choices"][0]["message"]["content"]
    words = text.split(" ")
    stop = " " + " ".join(words[4:6])  # two words in the middle, across token boundaries
    cut = text.index(stop)
    for stream in (False, True):
        body = dict(base, stop=[stop, "never-there"], stream=stream)
        if stream:
            result = await post_stream(http, f"{sim.url}/v1/chat/completions", body)
            final = result.chunks[-1]["choices"][0]
            got, ids = result.content, result.token_ids()
        else:
            _status, answer = await post_json(http, f"{sim.url}/v1/chat/completions", body)
            final = answer["choices"][0]
            got, ids = final["message"]["content"], final["token_ids"]
            assert answer["usage"]["completion_tokens"] == len(ids)
        assert got == text[:cut]
        assert final["finish_reason"] == "stop"
        assert final["stop_reason"] == stop
        assert TOK.decode(ids).startswith(text[:cut] + stop)


async def test_non_streaming_chat_shape(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    status, body = await post_json(
        http,
        f"{sim.url}/v1/chat/completions",
        chat_body("#sim:len=5", return_token_ids=True),
        headers={"X-Request-Id": "abc"},
    )
    assert status == 200
    assert body["id"] == "chatcmpl-abc" and body["object"] == "chat.completion"
    for key in ("service_tier", "prompt_logprobs", "prompt_text", "kv_transfer_params",
                "ec_transfer_params", "metrics"):  # fmt: skip
        assert key in body and body[key] is None
    choice = body["choices"][0]
    message = choice["message"]
    assert message["role"] == "assistant"
    for key in ("refusal", "annotations", "audio", "function_call", "reasoning"):
        assert message[key] is None
    assert "tool_calls" not in message
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    assert len(choice["token_ids"]) == body["usage"]["completion_tokens"] == 5
    assert TOK.decode(choice["token_ids"][:-1]) == message["content"]
    usage = body["usage"]
    assert usage["prompt_tokens_details"] is None and usage["completion_tokens_details"] is None
    assert body["prompt_token_ids"] == TOK.chat_prompt_ids(
        [{"role": "user", "content": "#sim:len=5"}]
    )


async def test_max_tokens_gives_length(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    for field in ("max_tokens", "max_completion_tokens"):
        _status, body = await post_json(
            http, f"{sim.url}/v1/chat/completions", chat_body("#sim:long", **{field: 7})
        )
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 7


def _vllm_error(body: Any, status: int, error_type: str) -> dict[str, Any]:
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["type"] == error_type
    return error


async def test_errors(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    url = f"{sim.url}/v1/chat/completions"
    status, body = await post_json(http, url, chat_body("x", model="nope"))
    assert status == 404
    error = _vllm_error(body, 404, "NotFoundError")
    assert error["param"] == "model" and "`nope` does not exist" in error["message"]

    status, body = await post_json(
        http, url, chat_body("x", stream=False, stream_options={"include_usage": True})
    )
    assert status == 400
    assert "Stream options" in _vllm_error(body, 400, "BadRequestError")["message"]

    status, body = await post_json(http, url, chat_body("x", max_tokens="many"))
    assert status == 400 and _vllm_error(body, 400, "BadRequestError")["param"] == "max_tokens"

    status, body = await post_json(http, url, chat_body("x", max_tokens=10**6))
    assert status == 400 and "maximum context length" in body["error"]["message"]

    status, body = await post_json(http, url, chat_body("x", n=2))
    assert status == 400

    status, body = await post_json(http, url, chat_body("#sim:nonsense"))
    assert status == 400 and "#sim:nonsense" in body["error"]["message"]

    async with http.post(url, data=b"{not json") as response:
        assert response.status == 400
        _vllm_error(await response.json(), 400, "BadRequestError")


async def test_models_health_version_tokenize(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{sim.url}/health") as response:
        assert response.status == 200 and await response.read() == b""
    async with http.get(f"{sim.url}/v1/models") as response:
        models = await response.json()
    (card,) = models["data"]
    assert models["object"] == "list"
    assert card["id"] == "narwhal-sim" and card["owned_by"] == "vllm"
    assert card["root"] == "narwhal-sim" and card["parent"] is None
    assert isinstance(card["max_model_len"], int) and card["permission"]
    async with http.get(f"{sim.url}/version") as response:
        assert (await response.json())["version"] == "0.33.0"

    status, body = await post_json(
        http, f"{sim.url}/tokenize", {"prompt": "Hello world", "return_token_strs": True}
    )
    assert status == 200
    assert set(body) == {"count", "max_model_len", "tokens", "token_strs"}
    assert body["tokens"] == TOK.completion_prompt_ids("Hello world")
    assert body["count"] == len(body["tokens"])
    assert "".join(body["token_strs"][1:]) == "Hello world"
    messages = [{"role": "user", "content": "Hi"}]
    status, body = await post_json(http, f"{sim.url}/tokenize", {"messages": messages})
    assert body["tokens"] == TOK.chat_prompt_ids(messages) and body["token_strs"] is None
    status, body = await post_json(http, f"{sim.url}/detokenize", {"tokens": TOK.encode("a b")})
    assert body == {"prompt": "a b"}


async def test_metrics_names_and_labels(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    await post_json(http, f"{sim.url}/v1/chat/completions", chat_body("#sim:len=4"))
    async with http.get(f"{sim.url}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    labels = 'engine="0",model_name="narwhal-sim"'
    for line in (
        f"vllm:num_requests_running{{{labels}}} 0.0",
        f"vllm:num_requests_waiting{{{labels}}} 0.0",
        f"vllm:kv_cache_usage_perc{{{labels}}} 0.0",
        f"vllm:time_to_first_token_seconds_count{{{labels}}} 1.0",
        f"vllm:inter_token_latency_seconds_count{{{labels}}} 3.0",
        f"vllm:request_time_per_output_token_seconds_count{{{labels}}} 1.0",
        f"vllm:e2e_request_latency_seconds_count{{{labels}}} 1.0",
        f"vllm:generation_tokens_total{{{labels}}} 4.0",
        "vllm:request_success_total"
        '{engine="0",finished_reason="stop",model_name="narwhal-sim"} 1.0',
    ):
        assert line in text, line
    assert f"vllm:prompt_tokens_total{{{labels}}}" in text


async def test_broken_metrics(sim_factory: Any, http: aiohttp.ClientSession) -> None:
    sim = await sim_factory(broken_metrics=True)
    async with http.get(f"{sim.url}/metrics") as response:
        assert response.status == 500


async def test_a_slow_and_a_miscounting_tokenize(
    sim_factory: Any, http: aiohttp.ClientSession
) -> None:
    """Faults for the router's sizing: /tokenize late, or counting another number of
    tokens than the sim serves (its completions' usage stays the true count)."""
    slow = await sim_factory(tokenize_delay_s=0.2)
    started = time.monotonic()
    status, body = await post_json(http, f"{slow.url}/tokenize", {"prompt": "Hello world"})
    assert status == 200 and body["count"] == len(TOK.completion_prompt_ids("Hello world"))
    assert time.monotonic() - started >= 0.2
    prompt = "one two three four five six seven eight nine ten"
    true_count = len(TOK.completion_prompt_ids(prompt))
    for scale in (0.5, 2.5):
        sim = await sim_factory(tokenize_scale=scale)
        status, body = await post_json(http, f"{sim.url}/tokenize", {"prompt": prompt})
        assert status == 200 and body["count"] == round(true_count * scale)
        assert len(body["tokens"]) == body["count"]
        request = {"model": "narwhal-sim", "prompt": prompt, "max_tokens": 1}
        status, body = await post_json(http, f"{sim.url}/v1/completions", request)
        assert status == 200 and body["usage"]["prompt_tokens"] == true_count


async def test_two_sims_in_one_process_keep_their_own_metrics(
    sim_factory: Any, http: aiohttp.ClientSession
) -> None:
    first = await sim_factory(model="a")
    second = await sim_factory(model="b")
    await post_json(http, f"{first.url}/v1/completions", {"prompt": "x #sim:len=3"})
    async with http.get(f"{second.url}/metrics") as response:
        text = await response.text()
    assert 'vllm:generation_tokens_total{engine="0",model_name="b"} 0.0' in text
