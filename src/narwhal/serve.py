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
import os
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
from narwhal.config import (
    Config,
    ConfigError,
    EngineConfig,
    LoggingConfig,
    Role,
    ServingConfig,
    TracingConfig,
    load_config,
    section_problems,
)
from narwhal.observability.logs import announcement, configure_logging
from narwhal.ops.reload import Source, file_source
from narwhal.ops.shutdown import Shutdown
from narwhal.relay_worker import RelayWorker
from narwhal.router import Router
from narwhal.supervisor import admin_socket_in, core_socket_in, run_supervisor

log = logging.getLogger("narwhal")
EMBEDDED_MODEL = "narwhal-sim"
ROLES: tuple[Role, ...] = ("prefill", "decode")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML configuration (default: the embedded default)")
    parser.add_argument("--host", help="override serving.host")
    parser.add_argument("--port", type=int, help="override serving.port (0: any free port)")
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="override logging.level (default: info); logs go to stderr",
    )
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        help="override logging.format: text, or json (one JSON object a line)",
    )
    parser.add_argument(
        "--no-access-log",
        action="store_true",
        help="no access line per completion request (logging.access_log: false)",
    )
    # One process of a router with relay workers (serving.workers above 1), as the
    # supervisor starts it: not for the command line.
    parser.add_argument("--role", choices=["decision", "worker"], help=argparse.SUPPRESS)
    parser.add_argument("--runtime-dir", help=argparse.SUPPRESS)
    parser.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="override tracing.otlp_endpoint: export the router's own spans there by "
        "OTLP/HTTP (needs the otel extra)",
    )


def run(args: argparse.Namespace) -> int:
    # `*_created` samples double every counter's series for no operational use.
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    overrides: dict[str, Any] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port

    def with_flags(config: Config) -> Config:
        return _with_flags(_with_serving(config, overrides), args)

    log_format: str = args.log_format or "text"  # until the configuration says
    try:
        config = None if not args.config else with_flags(load_config(args.config))
        logging_config = _logging(config.logging if config else LoggingConfig(), args)
        log_format = logging_config.format
        configure_logging(logging_config)
        if config is None:
            run_event_loop(lambda: serve_embedded(with_flags))
        else:
            source = file_source(args.config, with_flags)
            if args.role is None and config.serving.workers > 1:
                return run_supervisor(args, config)
            run_event_loop(
                lambda: serve_forever(config, source, role=args.role, runtime_dir=args.runtime_dir)
            )
    except ConfigError as e:
        for problem in e.problems:
            line = announcement(f"error: {problem}", log_format, level=logging.ERROR)
            print(line, file=sys.stderr)
        return 2
    except CannotListen as e:
        print(announcement(f"error: {e}", log_format, level=logging.ERROR), file=sys.stderr)
        return 2
    return 0


def _with_serving(config: Config, overrides: dict[str, Any]) -> Config:
    if not overrides:
        return config
    serving = msgspec.structs.replace(config.serving, **overrides)
    return msgspec.structs.replace(config, serving=serving)


def _with_flags(config: Config, args: argparse.Namespace) -> Config:
    """`config` with the logging and tracing flags given on the command line."""
    tracing = config.tracing
    if args.otlp_endpoint is not None:
        tracing = _checked_tracing(
            msgspec.structs.replace(tracing, otlp_endpoint=args.otlp_endpoint)
        )
    return msgspec.structs.replace(config, logging=_logging(config.logging, args), tracing=tracing)


def _logging(config: LoggingConfig, args: argparse.Namespace) -> LoggingConfig:
    changes: dict[str, Any] = {}
    if args.log_level is not None:
        changes["level"] = args.log_level
    if args.log_format is not None:
        changes["format"] = args.log_format
    if args.no_access_log:
        changes["access_log"] = False
    return msgspec.structs.replace(config, **changes) if changes else config


def _checked_tracing(tracing: TracingConfig) -> TracingConfig:
    """The flag's endpoint, held to the configuration key's checks."""
    problems = section_problems("tracing", tracing)
    if problems:
        raise ConfigError(*problems)
    return tracing


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
    sockets: list[socket.socket] = (),  # type: ignore[assignment]
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
            url = listening_url(config.serving, _bound_port(runner), tls is not None)
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


def listening_url(serving: ServingConfig, port: int, tls: bool) -> str:
    scheme = "https" if tls else "http"
    host = serving.host
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    raise RuntimeError("the router is not bound to a TCP port")
