"""Each prefill discipline through `narwhal sim --prefill-discipline` and real sockets.

What a client sees: the time to first token of concurrent streamed requests, and the
gaps in a decoding stream. Bounds are on differences of a tenth of a second or more
between disciplines, so a loaded machine cannot make them flaky.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import aiohttp
import pytest

from .conftest import chat_body, sim_process, timed_stream

FOX = "the quick brown fox jumps over the lazy dog "  # about 9 tokens
# 2,000 prompt tokens/s: a 40-fox prompt (~370 tokens) prefills in ~0.18 s.
PERF = ("--time-scale", "1", "--prefill-tokens-per-s", "2000", "--decode-base-ms", "5",
        "--decode-per-seq-ms", "0")  # fmt: skip


async def _state(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(f"{url}/sim/state") as response:
        state: dict[str, Any] = await response.json()
        return state


async def _until_running(http: aiohttp.ClientSession, url: str) -> None:
    for _ in range(200):
        if (await _state(http, url))["running"]:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the first request never started")


def _stream(http: aiohttp.ClientSession, url: str, text: str, **extra: Any) -> Any:
    return timed_stream(http, url, chat_body(text, stream=True, **extra))


async def _probes_behind_a_prefill(http: aiohttp.ClientSession, url: str) -> list[float]:
    """First-token times of three equal prompts sent while another prompt prefills."""
    blocker = asyncio.create_task(_stream(http, url, "blocker " + FOX * 60, max_tokens=2))
    await _until_running(http, url)  # its ~0.27 s prefill has begun
    probes = await asyncio.gather(
        *(_stream(http, url, f"{i} {FOX * 40}", max_tokens=2) for i in range(3))
    )
    await blocker
    return sorted(arrivals[0] for _, arrivals in probes)


@pytest.mark.parametrize("discipline", ["chunked", "serial"])
async def test_concurrent_prompts_together_or_one_after_another(
    discipline: str, http: aiohttp.ClientSession
) -> None:
    with sim_process("--prefill-discipline", discipline, *PERF) as sim:
        assert (await _state(http, sim.url))["prefill_discipline"] == discipline
        first_tokens = await _probes_behind_a_prefill(http, sim.url)
    spread = first_tokens[-1] - first_tokens[0]
    if discipline == "chunked":
        assert spread < 0.1  # one step held all three: ~0
    else:
        assert spread > 0.25  # ~0.18 s of prefill each, one after another: ~0.36


@pytest.mark.parametrize("discipline", ["chunked", "sglang"])
async def test_sglang_decoding_stalls_for_a_whole_chunked_prefill(
    discipline: str, http: aiohttp.ClientSession
) -> None:
    # A 128-token step budget cuts a ~550-token prompt into five chunks of ~70 ms.
    args = ("--prefill-discipline", discipline, "--max-num-batched-tokens", "128", *PERF)
    with sim_process(*args) as sim:
        decoder = asyncio.create_task(_stream(http, sim.url, "go", max_tokens=150, ignore_eos=True))
        await _until_running(http, sim.url)
        await asyncio.sleep(0.05)
        await _stream(http, sim.url, "prompt " + FOX * 60, max_tokens=2)
        _, arrivals = await decoder
    longest_gap = max(b - a for a, b in itertools.pairwise(arrivals))
    if discipline == "chunked":
        assert longest_gap < 0.15  # a token every chunk's step
    else:
        assert longest_gap > 0.2  # nothing for the prompt's whole ~0.27 s prefill


async def test_sequential_starts_the_next_request_after_the_last_token(
    http: aiohttp.ClientSession,
) -> None:
    with sim_process("--prefill-discipline", "sequential", *PERF) as sim:
        assert (await _state(http, sim.url))["prefill_discipline"] == "sequential"
        streams = await asyncio.gather(
            *(_stream(http, sim.url, f"{i} {FOX}", max_tokens=20, ignore_eos=True) for i in (1, 2))
        )
    earlier, later = sorted((arrivals for _, arrivals in streams), key=lambda a: a[0])
    assert len(earlier) == len(later) == 20
    assert later[0] > earlier[-1]
