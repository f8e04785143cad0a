"""The router's one HTTP client session for side calls, built with the router, opened with
its event loop.

Probes and scrapes (the fleet monitor), tokenize calls (sizing), profiling's counts and
etcd all call out through one `aiohttp.ClientSession`. aiohttp makes a session only inside
a running event loop, and the composition root builds the whole graph before one runs;
so each component is given this object at construction and the session behind it is
made when the router starts (`open`) and closed last (`close`). A call before `open` is a
bug and says so. The engine requests themselves go through their own pool
(`narwhal.engines.upstream`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import aiohttp
from aiohttp.client import _RequestContextManager


class HttpSession(Protocol):
    """The part of `aiohttp.ClientSession` the side calls use."""

    def get(self, url: str, **kwargs: Any) -> _RequestContextManager: ...

    def post(self, url: str, **kwargs: Any) -> _RequestContextManager: ...


def _default_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
        auto_decompress=False,
    )


class SharedSession:
    def __init__(self, make: Callable[[], aiohttp.ClientSession] = _default_session) -> None:
        self._make = make
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        if self._session is None:
            self._session = self._make()

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _opened(self) -> aiohttp.ClientSession:
        session = self._session
        if session is None:
            raise RuntimeError("the router's HTTP session is used before the router started")
        return session

    def get(self, url: str, **kwargs: Any) -> _RequestContextManager:
        return self._opened().get(url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> _RequestContextManager:
        return self._opened().post(url, **kwargs)
