"""`narwhal serve`: run the router, from a configuration file or the embedded default.

What stops it from starting (a configuration error, a certificate or tokenizer that
cannot be loaded, a port in use) is said in one line each, `error: ...` on stderr, and
the exit status is 2; whatever had started by then (the embedded default's engines) is
closed first. The listening sockets are bound before the router starts anything else
(`api/listen.py`), so a busy port costs no engine probes.

Signals: SIGTERM (and SIGINT) start the shutdown sequence (`shutdown.py`: /ready 503
`shutting_down` with the listener open for `serving.shutdown_delay_s`, then the drain of
admitted requests for `serving.drain_timeout_s`); SIGHUP re-reads the configuration file
and applies what can change live (`reload.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import ssl
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec
import prometheus_client
from aiohttp import web

from narwhal.api.listen import CannotListen, bind_sockets, listen_failure
from narwhal.api.server import ClientRunner, head_timeout_s
from narwhal.api.tls import server_tls_context
from narwhal.config import Config, ConfigError, EngineConfig, Role, ServingConfig, load_config
from narwhal.router import Router
from narwhal.shutdown import Shutdown

log = logging.getLogger("narwhal")
EMBEDDED_MODEL = "narwhal-sim"
ROLES: tuple[Role, ...] = ("prefill", "decode")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML configuration (default: the embedded default)")
    parser.add_argument("--host", help="override serving.host")
    parser.add_argument("--port", type=int, help="override serving.port (0: any free port)")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default: info); logs go to stderr",
    )


def run(args: argparse.Namespace) -> int:
    # `*_created` samples double every counter's series for no operational use.
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    overrides: dict[str, Any] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    try:
        if not args.config:
            run_event_loop(lambda: serve_embedded(overrides))
        else:
            path: str = args.config

            def source() -> Config:
                """The file as it is now, with the command line's overrides (a reload)."""
                return _with_serving(load_config(path), overrides)

            config = source()
            run_event_loop(lambda: serve_forever(config, source))
    except ConfigError as e:
        for problem in e.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    except CannotListen as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _with_serving(config: Config, overrides: dict[str, Any]) -> Config:
    if not overrides:
        return config
    serving = msgspec.structs.replace(config.serving, **overrides)
    return msgspec.structs.replace(config, serving=serving)


async def serve_embedded(overrides: dict[str, Any]) -> None:
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
        await serve_forever(_with_serving(config, overrides))
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


async def serve_forever(config: Config, source: Callable[[], Config] | None = None) -> None:
    """Serve until SIGTERM or SIGINT; `source()` reads the configuration again (SIGHUP)."""
    serving = config.serving
    tls = server_tls_context(serving)
    sockets = bind_sockets(serving.host, serving.port)
    try:
        await _serve_on(config, source, sockets, tls)
    finally:
        for sock in sockets:
            sock.close()  # those a site took are closed already; this is for the rest


async def _serve_on(
    config: Config,
    source: Callable[[], Config] | None,
    sockets: list[socket.socket],
    tls: ssl.SSLContext | None,
) -> None:
    router = Router(config, source=source)
    loop = asyncio.get_running_loop()
    # From the start: SIGHUP's default action would end the process while it starts.
    loop.add_signal_handler(signal.SIGHUP, router.reloader.signalled)
    # handler_cancellation: a client that disconnects cancels its handler at once, so the
    # upstream request is cancelled too instead of running on for nobody.
    runner = ClientRunner(
        router.app,
        head_timeout=head_timeout_s(config.serving),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=config.serving.drain_timeout_s,
    )
    try:
        await runner.setup()
        for sock in sockets:
            site = web.SockSite(runner, sock, ssl_context=tls, backlog=4096)
            try:
                await site.start()
            except OSError as e:
                raise listen_failure(config.serving.host, config.serving.port, e) from None
        port = _bound_port(runner)
        log.info(
            "serving model %s with %d engine(s): %s",
            config.model,
            len(config.engines),
            ", ".join(f"{e.name} ({e.role}, {e.dialect}) {e.url}" for e in config.engines),
        )
        scheme = "http" if tls is None else "https"
        host = config.serving.host
        shown = f"[{host}]" if ":" in host else host
        print(f"narwhal listening on {scheme}://{shown}:{port}", flush=True)

        router.reloaded.append(lambda new: runner.set_head_timeout(head_timeout_s(new.serving)))
        shutdown = Shutdown(router, runner)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, shutdown.signal)
        await shutdown.requested()
        await shutdown.hold_listener()
        shutdown.start_draining()
        print("narwhal draining", flush=True)
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
