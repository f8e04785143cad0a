"""The sim's --api-key guards the routes the engine it stands for guards: /v1/* for vLLM
(and the generic OpenAI servers), everything but /health and /metrics for SGLang; and
--authorization-log records what each request carried."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from tests.sim.conftest import StartSim

KEY = "sim-key"
CHAT = {"model": "narwhal-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TOKENIZE = {"model": "narwhal-sim", "prompt": "hello"}

# (method, path, body): every route a router asks an engine for.
ROUTES = [
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"model": "narwhal-sim", "prompt": "hi", "max_tokens": 2}),
    ("GET", "/v1/models", None),
    ("GET", "/health", None),
    ("GET", "/metrics", None),
    ("POST", "/tokenize", TOKENIZE),
    ("GET", "/version", None),
    ("GET", "/sim/state", None),
]
GUARDED = {
    "vllm": {"/v1/chat/completions", "/v1/completions", "/v1/models"},
    "sglang": {"/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize", "/version"},
}


async def status_of(
    http: aiohttp.ClientSession, url: str, method: str, body: object, headers: dict[str, str]
) -> tuple[int, object]:
    async with http.request(method, url, json=body, headers=headers) as response:
        await response.read()
        payload = await response.json() if response.status == 401 else None
        return response.status, payload


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_the_guarded_routes_want_the_key(
    sim_factory: StartSim, http: aiohttp.ClientSession, dialect: str
) -> None:
    sim = await sim_factory(api_key=KEY, dialect=dialect)
    for method, path, body in ROUTES:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            status, payload = await status_of(http, sim.url + path, method, body, headers)
            if path in GUARDED[dialect]:
                assert (status, payload) == (401, {"error": "Unauthorized"}), (path, headers)
            else:
                assert status == 200, (path, headers)
        right = {"Authorization": f"Bearer {KEY}"}
        assert (await status_of(http, sim.url + path, method, body, right))[0] == 200, path


async def test_without_a_key_nothing_is_guarded(
    sim_factory: StartSim, http: aiohttp.ClientSession
) -> None:
    sim = await sim_factory()
    for method, path, body in ROUTES:
        assert (await status_of(http, sim.url + path, method, body, {}))[0] == 200, path


async def test_the_authorization_log_has_a_line_per_request(
    sim_factory: StartSim, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    log = tmp_path / "authorization.log"
    sim = await sim_factory(api_key=KEY, authorization_log=str(log))
    await status_of(http, sim.url + "/v1/models", "GET", None, {})
    await status_of(http, sim.url + "/health", "GET", None, {"Authorization": "Bearer x y"})
    right = {"Authorization": f"Bearer {KEY}"}
    await status_of(http, sim.url + "/v1/chat/completions", "POST", CHAT, right)
    await status_of(http, sim.url + "/nowhere", "GET", None, {})
    assert log.read_text().splitlines() == [
        "GET /v1/models 401 -",
        "GET /health 200 Bearer x y",
        f"POST /v1/chat/completions 200 Bearer {KEY}",
        "GET /nowhere 404 -",
    ]
