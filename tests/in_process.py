"""Serve an aiohttp application on this test's own loop, for tests that need the router
in their process (its log records, a replaced collaborator, a raw socket to it)."""

from __future__ import annotations

from aiohttp import web


async def serve_app(
    app: web.Application, *, handler_cancellation: bool = True
) -> tuple[web.AppRunner, str]:
    """`app` on an ephemeral loopback port: its runner (the caller cleans it up) and its
    base URL."""
    runner = web.AppRunner(app, handler_cancellation=handler_cancellation)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    return runner, f"http://127.0.0.1:{port}"
