"""What the engine client makes of an engine's answer bodies, against a real server on
127.0.0.1: an error body and a non-streaming answer are engine input, bounded in size and
nesting before they are decoded, so a hostile one is an engine fault (EngineUnavailable:
502, retried elsewhere), never a RecursionError; a well-formed refusal is the client's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from narwhal.config import EngineConfig
from narwhal.engines.client import EngineClient, EngineUnavailable
from narwhal.engines.upstream import UpstreamPool
from narwhal.errors import InvalidRequest
from narwhal.protocol.jsonbody import MAX_NESTING

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
DEEP_ARRAYS = b"[" * 2000 + b"]" * 2000
DEEP_ERRORS = b'{"error":' * 1000 + b"null" + b"}" * 1000


class Answers:
    """A server whose every completion answer is the test's (status, body)."""

    def __init__(self) -> None:
        self.status = 200
        self.body = b"{}"
        self.url = ""

    async def answer(self, request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=self.status, body=self.body, content_type="application/json")


@pytest.fixture
async def engine() -> AsyncIterator[tuple[Answers, EngineClient]]:
    answers = Answers()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", answers.answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    pool = UpstreamPool()
    client = EngineClient(EngineConfig(name="e0", url=f"http://127.0.0.1:{port}"), pool)
    try:
        yield answers, client
    finally:
        await pool.close()
        await runner.cleanup()


async def refusal(client: EngineClient) -> Exception:
    with pytest.raises((EngineUnavailable, InvalidRequest)) as info:
        await client.open_stream("chat", BODY, request_id="r")
    return info.value


def nested(depth: int) -> bytes:
    """An error object whose message is an array `depth` levels deep, the body's own two
    levels counted."""
    inner = depth - 2
    return b'{"error":{"message":' + b"[" * inner + b"]" * inner + b"}}"


@pytest.mark.parametrize("status", [400, 500, 503])
@pytest.mark.parametrize(
    "body",
    [DEEP_ARRAYS, DEEP_ERRORS, b"[" * 2000, nested(MAX_NESTING + 1)],
    ids=["arrays", "error objects", "unclosed", "one level too deep"],
)
async def test_a_too_deep_error_body_is_an_engine_fault(
    engine: tuple[Answers, EngineClient], status: int, body: bytes
) -> None:
    answers, client = engine
    answers.status, answers.body = status, body
    error = await refusal(client)
    assert isinstance(error, EngineUnavailable)
    assert str(error) == (
        f"engine e0 answered {status} with an error body nested more than {MAX_NESTING} levels deep"
    )


@pytest.mark.parametrize("status", [400, 422, 503])
async def test_an_oversized_or_invalid_error_body_is_an_engine_fault(
    engine: tuple[Answers, EngineClient], status: int
) -> None:
    answers, client = engine
    answers.status = status
    answers.body = b'{"error":{"message":"' + b"x" * (64 << 10) + b'"}}'
    error = await refusal(client)
    assert isinstance(error, EngineUnavailable) and "over 64 KiB" in str(error)
    answers.body = b'{"error":{"message":"cut'
    error = await refusal(client)
    assert isinstance(error, EngineUnavailable) and "not valid JSON" in str(error)


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        (nested(MAX_NESTING), "engine error: " + "[" * 126, None),
        (
            b'{"error":{"message":"bad top_k","type":"BadRequestError","param":"top_k"}}',
            "engine error (BadRequestError): bad top_k",
            "top_k",
        ),
        (b"Bad Request", "Bad Request", None),  # not JSON: its text, as a proxy's page
    ],
    ids=["at the limit", "vLLM's shape", "text"],
)
async def test_a_well_formed_400_is_the_clients_with_its_param(
    engine: tuple[Answers, EngineClient], body: bytes, message: str, param: str | None
) -> None:
    answers, client = engine
    answers.status, answers.body = 400, body
    error = await refusal(client)
    assert isinstance(error, InvalidRequest), error
    assert error.message.startswith(f"The engine refused the request: {message}")
    assert error.param == param


@pytest.mark.parametrize(
    "body",
    [DEEP_ARRAYS, DEEP_ERRORS, b'{"a":' + b"[" * (MAX_NESTING) + b"]" * MAX_NESTING + b"}"],
    ids=["arrays", "error objects", "one level too deep"],
)
async def test_a_too_deep_answer_is_an_engine_fault(
    engine: tuple[Answers, EngineClient], body: bytes
) -> None:
    answers, client = engine
    answers.body = body
    with pytest.raises(EngineUnavailable) as info:
        await client.post_json("chat", BODY, request_id="r")
    assert f"nested more than {MAX_NESTING} levels deep" in str(info.value)


async def test_an_answer_at_the_limit_is_taken(engine: tuple[Answers, EngineClient]) -> None:
    answers, client = engine
    depth = MAX_NESTING - 1  # the answer object is the first level
    answers.body = b'{"a":' + b"[" * depth + b"]" * depth + b"}"
    answer: dict[str, Any] = await client.post_json("chat", BODY, request_id="r")
    assert list(answer) == ["a"]
