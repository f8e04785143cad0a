"""`narwhal serve`: run the router, from a configuration file or the embedded default.

This module reads the command line and the configuration; the router's processes are
`narwhal.serving` (one router, or one process of several) and `narwhal.supervisor`
(relay workers under a decision process), which loads none of the router.

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
import logging
import sys
from typing import Any

import msgspec

from narwhal.api.listen import CannotListen
from narwhal.config import (
    Config,
    ConfigError,
    LoggingConfig,
    TracingConfig,
    load_config,
    section_problems,
)
from narwhal.observability.logs import announcement, configure_logging
from narwhal.ops.reload import file_source
from narwhal.supervisor import run_supervisor


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
        if config is not None and args.role is None and config.serving.workers > 1:
            return run_supervisor(args, config)  # which imports none of the router
        from narwhal import serving  # the router itself: the supervisor never loads it

        if config is None:
            serving.run_event_loop(lambda: serving.serve_embedded(with_flags))
        else:
            source = file_source(args.config, with_flags)
            serving.run_event_loop(
                lambda: serving.serve_forever(
                    config, source, role=args.role, runtime_dir=args.runtime_dir
                )
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
