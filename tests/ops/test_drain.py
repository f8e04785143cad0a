"""The shutdown's drain deadline (`narwhal.ops.drain`), on the event loop without sockets."""

from __future__ import annotations

import asyncio
import logging

import pytest

from narwhal.ops.drain import LAST_WRITE_GRACE_S, Drain


async def test_the_cut_brings_every_running_timeout_to_now() -> None:
    drain = Drain()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 3600
    entered = asyncio.Event()

    async def request() -> str:
        try:
            async with drain.timeout_at(deadline):
                entered.set()
                await asyncio.Event().wait()  # an engine that never answers
        except TimeoutError:
            return "cut short" if drain.cut_short(deadline) else "own deadline"
        return "finished"

    tasks = [asyncio.create_task(request()) for _ in range(3)]
    await entered.wait()
    await asyncio.sleep(0)
    heard: list[str] = []
    drain.subscribe(lambda: heard.append("cut"))
    drain.cut()
    drain.cut()  # once is all it does
    assert await asyncio.gather(*tasks) == ["cut short"] * 3
    assert heard == ["cut"]


async def test_a_timeout_entered_after_the_cut_expires_at_once() -> None:
    drain = Drain()
    drain.cut()
    with pytest.raises(TimeoutError):
        async with drain.timeout_at(asyncio.get_running_loop().time() + 3600):
            await asyncio.sleep(3600)


async def test_a_request_that_ended_in_time_is_not_counted_at_the_cut(
    caplog: pytest.LogCaptureFixture,
) -> None:
    drain = Drain()
    loop = asyncio.get_running_loop()
    async with drain.timeout_at(loop.time() + 3600):
        pass
    entered = asyncio.Event()

    async def running() -> None:
        async with drain.timeout_at(loop.time() + 3600):
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(running())
    await entered.wait()
    with caplog.at_level(logging.WARNING, logger="narwhal.drain"):
        drain.cut()
    with pytest.raises(TimeoutError):
        await task
    assert "ending 1 request(s) still running" in caplog.text


async def test_an_earlier_own_deadline_is_not_the_drains() -> None:
    drain = Drain()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 0.01
    with pytest.raises(TimeoutError):
        async with drain.timeout_at(deadline):
            await asyncio.sleep(3600)
    assert not drain.cut_short(deadline)  # no cut: the request's own deadline did it
    drain.cut()
    assert not drain.cut_short(deadline)  # the cut came after it


async def test_the_last_write_gets_a_short_grace_after_the_cut() -> None:
    drain = Drain()
    loop = asyncio.get_running_loop()
    far = loop.time() + 3600
    assert drain.last_write_by(far) == far
    drain.cut()
    assert drain.cut_at is not None
    assert drain.last_write_by(far) == drain.cut_at + LAST_WRITE_GRACE_S
    near = drain.cut_at + 0.1
    assert drain.last_write_by(near) == near
