"""`narwhal serve` with no configuration: router plus simulated engines, ready to curl."""

from __future__ import annotations

import aiohttp

from tests.e2e.conftest import Start, chat, completion, send
from tests.processes import narwhal_process


async def test_embedded_default_serves_at_once(start: Start) -> None:
    router = start(narwhal_process(["serve", "--port", "0"]))
    async with aiohttp.ClientSession() as session:
        async with session.get(router.url + "/ready") as resp:
            assert resp.status == 200
            assert await resp.json() == {"ready": True, "role": "active", "revision": None}
        async with session.get(router.url + "/admin/engines") as resp:
            engines = (await resp.json())["engines"]
    assert sorted(e["role"] for e in engines) == ["decode", "prefill"]
    reply = await send(router.url, chat("Hello", max_tokens=8))
    assert reply.status == 200, reply.raw
    assert reply.json()["choices"][0]["message"]["content"]
    streamed = await send(router.url, completion("Hello", max_tokens=4, stream=True))
    assert streamed.status == 200 and streamed.events()[-1] == "[DONE]"
