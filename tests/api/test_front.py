"""The HTTP front against a real router process: refusal rows, counters, request ids.

The router's one engine is never up (its port is bound but not listening: connections are
refused), so a valid request gets the seed's "zero placement-eligible engines" answer:
503 backend_unavailable with Retry-After: 1.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any, get_args
from urllib.parse import quote, urlsplit

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from narwhal.errors import Outcome
from tests.metrics_text import samples, total
from tests.processes import NarwhalProcess, router_process

MODEL = "front-model"
LIMIT = 4096


@pytest.fixture(scope="module")
def router() -> Iterator[NarwhalProcess]:
    with socket.socket() as closed_port:
        closed_port.bind(("127.0.0.1", 0))  # held, never listening: always refused
        engine = {"name": "down", "url": f"http://127.0.0.1:{closed_port.getsockname()[1]}"}
        config = {"model": MODEL, "engines": [engine], "serving": {"max_request_bytes": LIMIT}}
        with router_process(config) as process:
            yield process


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], **fields}


async def post(
    url: str,
    payload: Any,
    path: str = "/v1/chat/completions",
    headers: dict[str, str] | None = None,
) -> tuple[int, CIMultiDict[str], Any]:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})}
        ) as resp,
    ):
        body = await resp.read()
        return resp.status, resp.headers.copy(), json.loads(body)


async def metric_values(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        assert resp.status == 200
        return samples(await resp.text())


def assert_envelope(body: Any, *, type_: str, code: str | None, param: str | None) -> None:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert body["error"]["type"] == type_
    assert body["error"]["code"] == code
    assert body["error"]["param"] == param


async def test_invalid_json_is_400(router: NarwhalProcess) -> None:
    status, headers, body = await post(router.url, b'{"model": ')
    assert status == 400
    assert_envelope(body, type_="invalid_request_error", code=None, param=None)
    assert headers["X-Request-Id"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_wrong_field_type_names_the_field(router: NarwhalProcess, path: str) -> None:
    payload = (
        chat_body(max_tokens="many")
        if "chat" in path
        else {"model": MODEL, "prompt": "hi", "max_tokens": "many"}
    )
    status, _, body = await post(router.url, payload, path)
    assert status == 400
    assert_envelope(body, type_="invalid_request_error", code=None, param="max_tokens")


async def test_nested_field_is_a_dotted_path(router: NarwhalProcess) -> None:
    payload = chat_body(messages=[{"role": "user", "content": 42}])
    status, _, body = await post(router.url, payload)
    assert status == 400
    assert body["error"]["param"] == "messages.0.content"


async def test_other_model_is_404(router: NarwhalProcess) -> None:
    status, _, body = await post(router.url, chat_body(model="gpt-unknown"))
    assert status == 404
    assert_envelope(body, type_="invalid_request_error", code="model_not_found", param="model")


@pytest.mark.parametrize(("field", "value"), [("n", 2), ("best_of", 4)])
async def test_sampling_width(router: NarwhalProcess, field: str, value: int) -> None:
    status, _, body = await post(router.url, chat_body(**{field: value}))
    assert status == 400
    assert body["error"]["message"] == "Invalid sampling width"
    assert body["error"]["param"] == field
    assert body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"]}, "audio"),
        ({"modalities": ["audio"]}, "modalities"),
        ({"tools": [{"type": "custom", "custom": {"name": "grep"}}]}, "tools.0.type"),
    ],
)
async def test_unsupported_non_streaming_option(
    router: NarwhalProcess, fields: dict[str, Any], param: str
) -> None:
    status, _, body = await post(router.url, chat_body(**fields))
    assert status == 400
    assert_envelope(body, type_="invalid_request_error", code=None, param=param)


async def test_valid_request_without_engines_is_503_backend_unavailable(
    router: NarwhalProcess,
) -> None:
    for path, payload in [
        ("/v1/chat/completions", chat_body(stream=True)),
        ("/v1/completions", {"model": MODEL, "prompt": "hi"}),
    ]:
        status, headers, body = await post(router.url, payload, path)
        assert status == 503
        assert headers["Retry-After"] == "1"
        assert_envelope(body, type_="server_error", code="backend_unavailable", param=None)


async def test_unknown_fields_pass_validation(router: NarwhalProcess) -> None:
    status, _, _ = await post(router.url, chat_body(top_k=3, min_p=0.1, guided_json={"a": 1}))
    assert status == 503  # valid: reaches placement


async def head_only(router: NarwhalProcess, extra_headers: bytes) -> bytes:
    """Send a chat request's head without its body; the response head that comes back."""
    host, port = _address(router.url)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\n" + extra_headers + b"\r\n"
        )
        await writer.drain()
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()


async def test_content_length_over_limit_is_413_before_the_body_is_sent(
    router: NarwhalProcess,
) -> None:
    head = await head_only(router, b"Content-Length: 50000000\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert b"x-request-id" in head.lower()


async def test_chunked_body_over_limit_is_413(router: NarwhalProcess) -> None:
    host, port = _address(router.url)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"a" * 1024
    for _ in range(LIMIT // len(chunk) + 2):
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 413")
    length = int(
        next(
            line.split(b":")[1]
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
    )
    body = await asyncio.wait_for(reader.readexactly(length), 10)
    assert json.loads(body)["error"]["code"] == "request_too_large"
    writer.close()


async def _send_part_of_a_body(
    router: NarwhalProcess, extra_headers: bytes = b""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A request that declares a 200-byte body and sends 16 bytes of it."""
    host, port = _address(router.url)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + extra_headers
        + b'Content-Length: 200\r\n\r\n{"model": "front'
    )
    await writer.drain()
    return reader, writer


async def test_truncated_body_counts_unsized_offered(router: NarwhalProcess) -> None:
    before = await metric_values(router.url)
    _, writer = await _send_part_of_a_body(router)
    await asyncio.sleep(0.2)
    writer.close()
    for _ in range(50):
        after = await metric_values(router.url)
        if after["narwhal_unsized_offered_total"] > before["narwhal_unsized_offered_total"]:
            break
        await asyncio.sleep(0.05)
    assert after["narwhal_unsized_offered_total"] == before["narwhal_unsized_offered_total"] + 1
    assert after["narwhal_offered_total"] == before["narwhal_offered_total"] + 1
    gone = 'narwhal_outcomes_total{outcome="client_gone"}'
    assert after[gone] == before[gone] + 1


async def test_a_body_that_stops_arriving_expires_at_the_deadline(router: NarwhalProcess) -> None:
    """The request deadline covers the body too: a client that sends part of it and then
    nothing gets 504 terminal_expiry at its deadline instead of holding the request open."""
    before = await metric_values(router.url)
    reader, writer = await _send_part_of_a_body(router, b"X-Request-Timeout: 0.5\r\n")
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 504"), head
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        body = json.loads(await reader.readexactly(length))
        assert body["error"]["code"] == "terminal_expiry"
    finally:
        writer.close()
    after = await metric_values(router.url)
    assert after["narwhal_offered_total"] == before["narwhal_offered_total"] + 1
    assert after["narwhal_unsized_offered_total"] == before["narwhal_unsized_offered_total"] + 1
    expired = 'narwhal_outcomes_total{outcome="expired"}'
    assert after[expired] == before[expired] + 1
    stage = 'narwhal_expired_total{stage="deadline_before_headers"}'
    assert after[stage] == before[stage] + 1


async def test_request_id_keeps_a_sane_client_id_as_prefix_and_is_never_reused(
    router: NarwhalProcess,
) -> None:
    # Two clients sending the same id get two ids: each starts with theirs.
    _, first, _ = await post(router.url, b"{", headers={"X-Request-Id": "abc-123"})
    _, second, _ = await post(router.url, b"{", headers={"X-Request-Id": "abc-123"})
    assert first["X-Request-Id"].startswith("abc-123-")
    assert second["X-Request-Id"].startswith("abc-123-")
    assert first["X-Request-Id"] != second["X-Request-Id"]
    _, headers, _ = await post(router.url, b"{", headers={"X-Request-Id": "bad id\twith junk"})
    assert "junk" not in headers["X-Request-Id"] and headers["X-Request-Id"]
    async with aiohttp.ClientSession() as session:
        for path in ("/health", "/ready", "/metrics", "/v1/models", "/nowhere"):
            async with session.get(router.url + path) as resp:
                assert resp.headers.get("X-Request-Id"), path


async def test_operations_endpoints(router: NarwhalProcess) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(router.url + "/health") as resp:
            assert resp.status == 200
        async with session.get(router.url + "/ready") as resp:
            assert resp.status == 503
            assert await resp.json() == {"ready": False, "reason": "no_engines"}
        async with session.get(router.url + "/v1/models") as resp:
            models = await resp.json()
            assert models["object"] == "list"
            assert [m["id"] for m in models["data"]] == [MODEL]
        async with session.get(router.url + "/nowhere") as resp:
            assert resp.status == 404
            assert "error" in await resp.json()
    values = await metric_values(router.url)
    for name in (
        "narwhal_offered_total",
        "narwhal_unsized_offered_total",
        "narwhal_invalid_requests_total",
    ):
        assert name in values
    assert 'narwhal_rejected_total{reason="retention"}' in values
    assert 'narwhal_refused_total{reason="projected"}' in values
    assert 'narwhal_refused_total{reason="prompt"}' in values
    for outcome in get_args(Outcome):
        assert f'narwhal_outcomes_total{{outcome="{outcome}"}}' in values


async def test_an_admin_body_over_the_limit_is_413_request_too_large(
    router: NarwhalProcess,
) -> None:
    """The admin routes' bodies have the same limit, and the same refusal (aiohttp's own 413
    once came through with a null code and its own limit of 1 MiB)."""
    body = json.dumps({"wave": 1, "action": "start", "pad": "x" * LIMIT}).encode()
    status, _headers, answer = await post(router.url, body, path="/admin/maintenance")
    assert status == 413
    assert_envelope(answer, type_="invalid_request_error", code="request_too_large", param=None)
    assert str(LIMIT) in answer["error"]["message"]


@pytest.mark.parametrize("name", ["other", "org/other-model", "line\nbreak", "cr\rtab\t"])
async def test_an_unknown_model_by_name_is_404_model_not_found(
    router: NarwhalProcess, name: str
) -> None:
    """GET /v1/models/{model} answers the handler's 404 for any name, line breaks included
    (the route's pattern once stopped at a newline: the router's bare 404, code null)."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(router.url + "/v1/models/" + quote(name, safe="/")) as resp,
    ):
        status, body = resp.status, await resp.json()
    assert status == 404
    assert body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"


async def test_the_configured_model_by_name(router: NarwhalProcess) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{router.url}/v1/models/{MODEL}") as resp,
    ):
        assert resp.status == 200
        assert (await resp.json())["id"] == MODEL


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
fields = st.sampled_from(
    [
        "model",
        "messages",
        "prompt",
        "stream",
        "stream_options",
        "n",
        "best_of",
        "max_tokens",
        "max_completion_tokens",
        "return_token_ids",
        "tools",
        "tool_choice",
        "modalities",
        "audio",
        "logprobs",
        "top_logprobs",
        "echo",
        "temperature",
    ]
)
bodies = st.one_of(
    json_values,
    st.dictionaries(fields, json_values, max_size=6),
    st.dictionaries(fields, json_values, max_size=4).map(lambda extra: {**chat_body(), **extra}),
    st.dictionaries(fields, json_values, max_size=4).map(
        lambda extra: {"model": MODEL, "prompt": "x", **extra}
    ),
)


def test_random_json_never_breaks_the_front(router: NarwhalProcess) -> None:
    """Random shapes at both routes: always an envelope with 4xx (or the valid answer)."""
    seen: list[int] = []

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=bodies, path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
    def check(body: Any, path: str) -> None:
        status, headers, payload = asyncio.run(post(router.url, body, path))
        seen.append(status)
        assert headers.get("X-Request-Id")
        assert set(payload) == {"error"}
        assert isinstance(payload["error"]["message"], str)
        assert status in (400, 404, 503), (status, body, payload)
        if status == 503:
            assert payload["error"]["code"] == "backend_unavailable"
        else:
            assert payload["error"]["type"] == "invalid_request_error"

    check()
    assert 400 in seen
    values = asyncio.run(metric_values(router.url))
    outcomes = total(values, "narwhal_outcomes_total")
    assert values["narwhal_offered_total"] == outcomes
    invalid = values['narwhal_outcomes_total{outcome="invalid"}']
    assert values["narwhal_invalid_requests_total"] == invalid


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname and parts.port
    return parts.hostname, parts.port


async def test_expect_continue_is_not_sent_for_a_body_over_the_limit(
    router: NarwhalProcess,
) -> None:
    head = await head_only(router, b"Expect: 100-continue\r\nContent-Length: 9000000\r\n")
    assert head.startswith(b"HTTP/1.1 413")  # not "100 Continue" first
