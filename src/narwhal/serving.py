"""Serving: one router process (or one process of a router with relay workers) on its
event loop, from start-up to the end of its shutdown (`narwhal serve`, `serve.py`).

The listening sockets are bound before the router starts anything else
(`api/listen.py`), so a busy port costs no engine probes. Signals: SIGTERM (and SIGINT)
start the shutdown sequence (`ops/shutdown.py`); SIGHUP re-reads the configuration file
(`ops/reload.py`; a relay worker reads it for what it holds itself).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import ssl
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import prometheus_client
from aiohttp import web

from narwhal.api.listen import bind_sockets, listen_failure, listening_url
from narwhal.api.server import ClientRunner, head_timeout_s
from narwhal.api.tls import server_tls_context
from narwhal.config import Config, EngineConfig, Role, ServingConfig
from narwhal.observability.logs import announcement
from narwhal.ops.reload import Source
from narwhal.ops.shutdown import Shutdown
from narwhal.relay_worker import RelayWorker
from narwhal.router import Router
from narwhal.supervisor import admin_socket_in, core_socket_in

log = logging.getLogger("narwhal")
EMBEDDED_MODEL = "narwhal-sim"
ROLES: tuple[Role, ...] = ("prefill", "decode")
# `*_created` samples double every counter's series for no operational use.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]


async def serve_embedded(with_flags: Callable[[Config], Config]) -> None:
    """The embedded default: simulated engines (one prefill, one decode) in this process.

    They speak the vLLM dialect on loopback ports of their own, so the router in front of
    them runs exactly the code it runs in front of a real disaggregated vLLM fleet.
    """
    from narwhal.sim import SimOptions, start_sim

    sims = [await start_sim(SimOptions(model=EMBEDDED_MODEL, role=role)) for role in ROLES]
    try:
        engines = tuple(
            EngineConfig(name=f"sim-{role}", url=sim.url, role=role)
            for role, sim in zip(ROLES, sims, strict=True)
        )
        # No load balancer sends to a demo on loopback: Ctrl-C stops it without the delay.
        serving = ServingConfig(shutdown_delay_s=0)
        config = Config(model=EMBEDDED_MODEL, engines=engines, serving=serving)
        await serve_forever(with_flags(config))
    finally:
        for sim in sims:
            await sim.close()


def run_event_loop(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - platforms without uvloop
        asyncio.run(main())
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


async def serve_forever(
    config: Config,
    source: Source | None = None,
    *,
    role: str | None = None,
    runtime_dir: str | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT; `source` reads the configuration again (SIGHUP).
    `role`: one process of a router with relay workers (`narwhal.supervisor`), whose
    sockets are in `runtime_dir`: the `decision` process, or a `worker`."""
    serving = config.serving
    tls = server_tls_context(serving)
    if role == "decision":
        assert runtime_dir is not None
        router = Router(config, source=source, core_socket=core_socket_in(runtime_dir))
        await _serve(router, config, unix_site=admin_socket_in(runtime_dir), announce=False)
        return
    sockets = bind_sockets(serving.host, serving.port, reuse_port=role == "worker")
    try:
        if role == "worker":
            assert runtime_dir is not None
            worker = RelayWorker(
                config, core_socket_in(runtime_dir), admin_socket_in(runtime_dir), source=source
            )
            await _serve(worker, config, sockets=sockets, tls=tls, announce=False)
        else:
            await _serve(Router(config, source=source), config, sockets=sockets, tls=tls)
    finally:
        for sock in sockets:
            sock.close()  # those a site took are closed already; this is for the rest


async def _serve(
    owner: Router | RelayWorker,
    config: Config,
    *,
    sockets: Sequence[socket.socket] = (),
    tls: ssl.SSLContext | None = None,
    unix_site: str | None = None,
    announce: bool = True,
) -> None:
    """Run `owner`'s application on `sockets` (or on the Unix socket `unix_site`: the
    decision process's, which only its relay workers reach) until the shutdown's end."""
    loop = asyncio.get_running_loop()
    # From the start: SIGHUP's default action would end the process while it starts.
    loop.add_signal_handler(
        signal.SIGHUP,
        owner.reloader.signalled if isinstance(owner, Router) else owner.reload_signalled,
    )
    # handler_cancellation: a client that disconnects cancels its handler at once, so the
    # upstream request is cancelled too instead of running on for nobody.
    runner = ClientRunner(
        owner.app,
        head_timeout=head_timeout_s(config.serving),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=config.serving.drain_timeout_s,
    )
    try:
        await runner.setup()
        if unix_site is not None:
            await web.UnixSite(runner, unix_site).start()
            os.chmod(unix_site, 0o600)
        for sock in sockets:
            site = web.SockSite(runner, sock, ssl_context=tls, backlog=4096)
            try:
                await site.start()
            except OSError as e:
                raise listen_failure(config.serving.host, config.serving.port, e) from None
        log.info(
            "serving model %s with %d engine(s): %s",
            config.model,
            len(config.engines),
            ", ".join(f"{e.name} ({e.role}, {e.dialect}) {e.url}" for e in config.engines),
        )
        if announce:
            url = listening_url(config.serving.host, _bound_port(runner), tls is not None)
            listening = announcement(f"narwhal listening on {url}", config.logging.format, url=url)
            print(listening, flush=True)
        if isinstance(owner, Router):
            owner.reloaded.append(lambda new: runner.set_head_timeout(head_timeout_s(new.serving)))
        shutdown = Shutdown(owner, runner)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, shutdown.signal)
        await shutdown.requested()
        await shutdown.hold_listener()
        shutdown.start_draining()
        if announce:
            print(announcement("narwhal draining", config.logging.format), flush=True)
    finally:
        # Closes the listener, waits for the requests in flight (until the drain deadline
        # has ended them), then the engine clients and probes close. Also after a failed
        # start.
        await runner.cleanup()
        loop.remove_signal_handler(signal.SIGHUP)
    await shutdown.finished()


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    raise RuntimeError("the router is not bound to a TCP port")
