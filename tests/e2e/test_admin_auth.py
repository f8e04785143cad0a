"""Admin routes: loopback only without a token; with one, the bearer token on every request,
loopback included (behind a sidecar or a reverse proxy every client is loopback)."""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest

from tests.e2e.conftest import MODEL, sim_process
from tests.processes import NarwhalProcess, router_process

TOKEN = "s3cret-admin-token"
ROUTES = [
    ("GET", "/admin/engines"),
    ("POST", "/admin/engines/e0/drain"),
    ("POST", "/admin/engines/e0/undrain"),
]


@pytest.fixture(scope="module")
def routers() -> Iterator[dict[str, NarwhalProcess]]:
    with sim_process() as sim:
        base = {
            "model": MODEL,
            "engines": [{"name": "e0", "url": sim.url, "role": "both"}],
            "admission": {"mode": "open"},
        }
        with (
            router_process(base) as open_router,
            router_process({**base, "serving": {"admin_token": TOKEN}}) as guarded,
        ):
            yield {"open": open_router, "guarded": guarded}


async def status_of(url: str, method: str, path: str, headers: dict[str, str]) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.request(method, url + path, headers=headers) as response:
            await response.read()
            return response.status


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", f"Bearer {TOKEN}x", TOKEN, f"bearer {TOKEN}", "Basic Zm9vOmJhcg=="],
)
async def test_with_a_token_a_loopback_client_without_it_is_refused(
    routers: dict[str, NarwhalProcess], method: str, path: str, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    async with aiohttp.ClientSession() as session:
        async with session.request(method, routers["guarded"].url + path, headers=headers) as r:
            assert r.status == 401
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
            body = await r.json()
    assert body["error"]["code"] == "invalid_admin_token"
    assert TOKEN not in str(body)


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_with_a_token_the_right_bearer_is_let_in(
    routers: dict[str, NarwhalProcess], method: str, path: str
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert await status_of(routers["guarded"].url, method, path, headers) == 200


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_without_a_token_loopback_clients_are_let_in(
    routers: dict[str, NarwhalProcess], method: str, path: str
) -> None:
    assert await status_of(routers["open"].url, method, path, {}) == 200
