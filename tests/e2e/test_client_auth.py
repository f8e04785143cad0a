"""Client API keys (`serving.api_keys`, and a file of them): a bearer token on /v1/*,
checked before the body is read, refused with OpenAI's own 401, counted as an outcome.
/health, /ready and /metrics stay open."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from urllib.parse import urlsplit

import aiohttp
import openai
import pytest

from tests.e2e.conftest import MODEL, chat, fleet_config, metrics_of, send, settle, sim_process
from tests.metrics_text import total
from tests.processes import NarwhalProcess, router_process
from tests.raw_http import RawResponse, read_response

INLINE_KEY = "sk-inline-0123456789"
FILE_KEY = "sk-from-file-abcdef"
COMPLETION_PATHS = ["/v1/chat/completions", "/v1/completions"]


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NarwhalProcess]:
    keys = tmp_path_factory.mktemp("keys") / "api_keys"
    keys.write_text(f"# one key a line\n{FILE_KEY}\n")
    with sim_process("--time-scale", "0") as sim:
        serving = {"api_keys": [INLINE_KEY], "api_keys_file": str(keys)}
        with router_process(fleet_config([("s0", sim, "vllm")], serving=serving)) as process:
            yield process


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def head_only(url: str, path: str, headers: str) -> RawResponse:
    """Send a request's head, declaring a body that is never sent; the response."""
    parts = urlsplit(url)
    assert parts.hostname and parts.port
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: 1000\r\n{headers}\r\n".encode()
        )
        await writer.drain()
        return await read_response(reader, timeout=10)
    finally:
        writer.close()


def assert_invalid_api_key(status: int, headers: dict[str, str], body: object) -> None:
    assert status == 401
    assert headers["www-authenticate"].startswith("Bearer")
    assert isinstance(body, dict)
    error = body["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "invalid_api_key",
        None,
    )
    assert INLINE_KEY not in error["message"] and FILE_KEY not in error["message"]


@pytest.mark.parametrize("path", COMPLETION_PATHS)
@pytest.mark.parametrize(
    "authorization",
    ["", "Authorization: Bearer sk-wrong\r\n", f"Authorization: Basic {INLINE_KEY}\r\n"],
)
async def test_without_a_valid_key_the_401_comes_before_the_body(
    router: NarwhalProcess, path: str, authorization: str
) -> None:
    """The body is never sent: the 401 comes anyway, and the connection, whose next bytes
    would be that body, is not reused."""
    response = await head_only(router.url, path, authorization)
    assert_invalid_api_key(response.status, response.headers, response.json())
    assert response.headers["x-request-id"]
    assert response.headers["connection"] == "close"


async def test_no_100_continue_is_sent_without_a_valid_key(router: NarwhalProcess) -> None:
    response = await head_only(router.url, "/v1/chat/completions", "Expect: 100-continue\r\n")
    assert response.status == 401  # not "100 Continue" first


@pytest.mark.parametrize("key", [INLINE_KEY, FILE_KEY])
@pytest.mark.parametrize("stream", [False, True])
async def test_every_configured_key_is_let_in(
    router: NarwhalProcess, key: str, stream: bool
) -> None:
    reply = await send(router.url, chat(max_tokens=4, stream=stream), headers=bearer(key))
    assert reply.status == 200, reply.raw


async def test_a_wrong_key_is_refused(router: NarwhalProcess) -> None:
    for key in (INLINE_KEY + "x", INLINE_KEY[:-1], FILE_KEY.upper()):
        reply = await send(router.url, chat(max_tokens=4), headers=bearer(key))
        headers = {name.lower(): value for name, value in reply.headers.items()}
        assert_invalid_api_key(reply.status, headers, reply.json())


async def test_the_model_list_needs_a_key_and_the_operations_routes_do_not(
    router: NarwhalProcess,
) -> None:
    async with aiohttp.ClientSession() as session:
        for path in ("/v1/models", f"/v1/models/{MODEL}"):
            async with session.get(router.url + path) as r:
                assert r.status == 401
                assert (await r.json())["error"]["code"] == "invalid_api_key"
            async with session.get(router.url + path, headers=bearer(FILE_KEY)) as r:
                assert r.status == 200
        for path in ("/health", "/ready", "/metrics"):
            async with session.get(router.url + path) as r:
                assert r.status == 200, path


def test_the_openai_client_raises_authentication_error(router: NarwhalProcess) -> None:
    with openai.OpenAI(base_url=router.url + "/v1", api_key="sk-wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as info:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        assert info.value.status_code == 401
        assert info.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
    with openai.OpenAI(base_url=router.url + "/v1", api_key=INLINE_KEY, max_retries=0) as client:
        assert [m.id for m in client.models.list()] == [MODEL]
        completion = client.completions.create(model=MODEL, prompt="Once", max_tokens=4)
        assert completion.choices[0].text


async def test_refusals_are_counted_as_invalid_outcomes(router: NarwhalProcess) -> None:
    """Each 401 on a completion route is one offered request ending `invalid`, and offered
    still equals the sum of the outcomes."""
    before = await metrics_of(router.url)
    for path in COMPLETION_PATHS:
        await head_only(router.url, path, "")
        await head_only(router.url, path, "Authorization: Bearer sk-wrong\r\n")
    reply = await send(router.url, chat(max_tokens=4), headers=bearer(INLINE_KEY))
    assert reply.status == 200

    def quiescent(values: dict[str, float]) -> bool:
        return values["narwhal_offered_total"] == total(values, "narwhal_outcomes_total")

    after = await settle(router.url, quiescent)
    assert quiescent(after)
    invalid = 'narwhal_outcomes_total{outcome="invalid"}'
    completed = 'narwhal_outcomes_total{outcome="completed"}'
    assert after["narwhal_offered_total"] - before["narwhal_offered_total"] == 5
    assert after[invalid] - before[invalid] == 4
    assert after[completed] - before[completed] == 1
    assert after["narwhal_invalid_requests_total"] == after[invalid]
