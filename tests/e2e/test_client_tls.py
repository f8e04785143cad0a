"""HTTPS to clients (`serving.tls_cert`, `serving.tls_key`), with a certificate from a
private CA (trustme) that the clients trust explicitly."""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import aiohttp
import openai
import pytest
import trustme

from tests.e2e.conftest import MODEL, chat, fleet_config, sim_process
from tests.processes import NarwhalProcess, router_process

KEY = "sk-over-tls"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def router(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NarwhalProcess]:
    folder = tmp_path_factory.mktemp("tls")
    cert = ca.issue_cert("127.0.0.1", "localhost")
    chain, key = folder / "chain.pem", folder / "key.pem"
    for pem in cert.cert_chain_pems:  # the server's certificate first, then the CA's
        pem.write_to_path(str(chain), append=True)
    cert.private_key_pem.write_to_path(str(key))
    serving = {"tls_cert": str(chain), "tls_key": str(key), "api_keys": [KEY]}
    with sim_process("--time-scale", "0") as sim:
        with router_process(fleet_config([("s0", sim, "vllm")], serving=serving)) as process:
            yield process


@pytest.fixture
def trusting(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


def test_the_router_says_it_listens_on_https(router: NarwhalProcess) -> None:
    assert router.url.startswith("https://127.0.0.1:")


async def test_requests_over_https(router: NarwhalProcess, trusting: ssl.SSLContext) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(router.url + "/health", ssl=trusting) as r:
            assert r.status == 200
        headers = {"Authorization": f"Bearer {KEY}"}
        url = router.url + "/v1/chat/completions"
        async with session.post(url, json=chat(max_tokens=4), headers=headers, ssl=trusting) as r:
            assert r.status == 200
            assert (await r.json())["choices"][0]["message"]["content"]


def test_the_openai_client_over_https(router: NarwhalProcess, trusting: ssl.SSLContext) -> None:
    with openai.OpenAI(
        base_url=router.url + "/v1",
        api_key=KEY,
        max_retries=0,
        http_client=openai.DefaultHttpxClient(verify=trusting),
    ) as client:
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


async def test_a_client_that_does_not_trust_the_certificate_is_refused(
    router: NarwhalProcess,
) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            async with session.get(router.url + "/health"):
                pass


async def test_plain_http_gets_no_answer(router: NarwhalProcess) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.get(router.url.replace("https://", "http://") + "/health"):
                pass
