"""Admin routes: loopback only without a token; with one, the bearer token on every request,
loopback included (behind a sidecar or a reverse proxy every client is loopback). The
token may be in the configuration, in an environment variable or in a file."""

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


GUARDED = ["guarded", "from_env", "from_file"]


@pytest.fixture(scope="module")
def routers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, NarwhalProcess]]:
    token_file = tmp_path_factory.mktemp("admin") / "token"
    token_file.write_text(TOKEN + "\n")  # as `echo` or a Kubernetes Secret leaves it
    with sim_process() as sim:
        base = {
            "model": MODEL,
            "engines": [{"name": "e0", "url": sim.url, "role": "both"}],
            "admission": {"mode": "open"},
        }
        with (
            router_process(base) as open_router,
            router_process({**base, "serving": {"admin_token": TOKEN}}) as guarded,
            router_process(
                {**base, "serving": {"admin_token_env": "NARWHAL_TEST_ADMIN_TOKEN"}},
                env={"NARWHAL_TEST_ADMIN_TOKEN": TOKEN},
            ) as from_env,
            router_process({**base, "serving": {"admin_token_file": str(token_file)}}) as from_file,
        ):
            yield {
                "open": open_router,
                "guarded": guarded,
                "from_env": from_env,
                "from_file": from_file,
            }


async def status_of(url: str, method: str, path: str, headers: dict[str, str]) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.request(method, url + path, headers=headers) as response:
            await response.read()
            return response.status


@pytest.mark.parametrize("router", GUARDED)
@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", f"Bearer {TOKEN}x", TOKEN, f"Bearer{TOKEN}", "Basic Zm9vOmJhcg=="],
)
async def test_with_a_token_a_loopback_client_without_it_is_refused(
    routers: dict[str, NarwhalProcess],
    router: str,
    method: str,
    path: str,
    authorization: str | None,
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    async with aiohttp.ClientSession() as session:
        async with session.request(method, routers[router].url + path, headers=headers) as r:
            assert r.status == 401
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
            body = await r.json()
    assert body["error"]["code"] == "invalid_admin_token"
    assert TOKEN not in str(body)


@pytest.mark.parametrize("router", GUARDED)
@pytest.mark.parametrize(("method", "path"), ROUTES)
# The scheme is case-insensitive (RFC 9110 section 11.1); the token is not.
@pytest.mark.parametrize("scheme", ["Bearer", "bearer"])
async def test_with_a_token_the_right_bearer_is_let_in(
    routers: dict[str, NarwhalProcess], router: str, method: str, path: str, scheme: str
) -> None:
    headers = {"Authorization": f"{scheme} {TOKEN}"}
    assert await status_of(routers[router].url, method, path, headers) == 200


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_without_a_token_loopback_clients_are_let_in(
    routers: dict[str, NarwhalProcess], method: str, path: str
) -> None:
    assert await status_of(routers["open"].url, method, path, {}) == 200
