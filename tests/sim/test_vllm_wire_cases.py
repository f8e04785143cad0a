"""The vllm dialect where Narwhal's own upstream request changes vLLM's answer (PROTOCOL.md
§7, vLLM 0.32's completion and chat serving): the echo, blanked when IDs are asked, and
`prompt_logprobs`, refused when streamed and answered unstreamed. The router's tests
(tests/e2e/test_wire.py) compare their answers with these."""

from __future__ import annotations

import aiohttp
import pytest

from narwhal.protocol.tokenizer import SimTokenizer
from narwhal.sim import RunningSim

from .conftest import chat_body, post_json, post_stream

TOK = SimTokenizer()
PROMPT = "Once upon a time"


def completion_body(**extra: object) -> dict[str, object]:
    return {"model": "narwhal-sim", "prompt": PROMPT, "max_tokens": 5, **extra}


async def test_a_streamed_echo_leads_with_the_prompt_unless_ids_are_asked(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    url = f"{sim.url}/v1/completions"
    echoed = await post_stream(http, url, completion_body(echo=True, stream=True))
    blanked = await post_stream(
        http, url, completion_body(echo=True, stream=True, return_token_ids=True)
    )
    plain = await post_stream(http, url, completion_body(stream=True))
    assert echoed.text == PROMPT + plain.text
    assert blanked.text == plain.text  # vLLM: `if request.return_token_ids: prompt_text = ""`
    # The echo chunk carries the prompt's IDs either way (echo and IDs share the code).
    prompt_ids = TOK.completion_prompt_ids(PROMPT)
    assert echoed.chunks[0]["choices"][0]["prompt_token_ids"] == prompt_ids
    assert blanked.chunks[0]["choices"][0]["prompt_token_ids"] == prompt_ids
    assert all(c["choices"][0]["prompt_token_ids"] is None for c in echoed.chunks[1:-1])


async def test_an_unstreamed_echo_leads_with_the_prompt_unless_ids_are_asked(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    url = f"{sim.url}/v1/completions"
    _, echoed = await post_json(http, url, completion_body(echo=True))
    _, blanked = await post_json(http, url, completion_body(echo=True, return_token_ids=True))
    _, plain = await post_json(http, url, completion_body())
    assert echoed["choices"][0]["text"] == PROMPT + plain["choices"][0]["text"]
    assert blanked["choices"][0]["text"] == plain["choices"][0]["text"]
    assert echoed["choices"][0]["prompt_token_ids"] is None  # unstreamed: only when asked


async def test_a_chat_echo_sends_the_assistants_last_message_back(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    messages = [{"role": "user", "content": "Go on"}, {"role": "assistant", "content": PROMPT}]
    body = {"model": "narwhal-sim", "messages": messages, "max_tokens": 4, "echo": True}
    url = f"{sim.url}/v1/chat/completions"
    streamed = await post_stream(http, url, {**body, "stream": True, "return_token_ids": True})
    echo = streamed.chunks[1]["choices"][0]
    assert echo == {"index": 0, "delta": {"content": PROMPT}, "logprobs": None,
                    "finish_reason": None}  # fmt: skip
    _, whole = await post_json(http, url, body)
    assert whole["choices"][0]["message"]["content"].startswith(PROMPT)
    # Only the assistant's message is echoed (the role the answer continues).
    user_last = chat_body(PROMPT, max_tokens=4, echo=True, stream=True)
    assert PROMPT not in (await post_stream(http, url, user_last)).content


@pytest.mark.parametrize("route", ["chat", "completion"])
async def test_prompt_logprobs_are_answered_only_unstreamed(
    sim: RunningSim, http: aiohttp.ClientSession, route: str
) -> None:
    if route == "chat":
        url, body = f"{sim.url}/v1/chat/completions", chat_body(PROMPT, max_tokens=3)
    else:
        url, body = f"{sim.url}/v1/completions", completion_body()
    status, refused = await post_json(http, url, {**body, "stream": True, "prompt_logprobs": 1})
    assert status == 400
    assert refused["error"]["param"] == "prompt_logprobs" and refused["error"]["code"] == 400
    status, answer = await post_json(http, url, {**body, "prompt_logprobs": 1})
    assert status == 200
    logprobs = (
        answer["prompt_logprobs"] if route == "chat" else answer["choices"][0]["prompt_logprobs"]
    )
    assert logprobs[0] is None and len(logprobs) == answer["usage"]["prompt_tokens"]
    # 0 asks for none, and streams (vLLM's check: above 0, or -1).
    zero = await post_stream(http, url, {**body, "stream": True, "prompt_logprobs": 0})
    assert zero.status == 200
    status, _ = await post_json(http, url, {**body, "prompt_logprobs": -2})
    assert status == 400
