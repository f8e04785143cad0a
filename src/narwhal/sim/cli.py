"""`narwhal sim`: one simulated engine on a socket.

Every performance and fault flag is derived from a `SimOptions` field (its type,
default and help), so the CLI and the in-process API cannot drift apart. On startup it
prints exactly one line, `narwhal sim listening on http://HOST:PORT`, with the real
port (so `--port 0` can be used by tests and tools), and exits 0 on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
import types
import typing
from collections.abc import Callable, Coroutine
from typing import Any

from narwhal.sim.options import SimOptions
from narwhal.sim.scenarios import CATALOGUE
from narwhal.sim.server import start_sim

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8100


def _flag_type(annotation: Any) -> tuple[Callable[[str], Any], list[str] | None]:
    """argparse `type` and `choices` for a field annotation (Literal, T | None, plain)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return str, [str(arg) for arg in typing.get_args(annotation)]
    if origin in (typing.Union, types.UnionType):
        (inner,) = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return _flag_type(inner)
    return annotation, None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "per-request scenarios (put #sim:NAME in the prompt text):\n" + "\n".join(
        f"  #sim:{name:<26} {text}" for name, text in CATALOGUE.items()
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to bind")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port; 0 = ephemeral")
    hints = typing.get_type_hints(SimOptions)
    for field in dataclasses.fields(SimOptions):
        flag = "--" + field.name.replace("_", "-")
        help_text = f"{field.metadata['help']} (default: {field.default})"
        annotation = hints[field.name]
        if annotation is bool:
            # A switch that is on by default is turned off as vLLM's are: --no-FLAG.
            action = argparse.BooleanOptionalAction if field.default else "store_true"
            if field.default:
                help_text = f"{field.metadata['help']} (default: on)"
            parser.add_argument(flag, action=action, default=field.default, help=help_text)
            continue
        kind, choices = _flag_type(annotation)
        parser.add_argument(flag, type=kind, choices=choices, default=field.default, help=help_text)


def options_from_args(args: argparse.Namespace) -> SimOptions:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(SimOptions)}
    return SimOptions(**values)


async def _serve(options: SimOptions, host: str, port: int) -> None:
    sim = await start_sim(options, host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"narwhal sim listening on {sim.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await sim.close()


def _runner(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def run(args: argparse.Namespace) -> int:
    try:
        options = options_from_args(args)
    except ValueError as exc:
        print(f"narwhal sim: {exc}", file=sys.stderr)
        return 2
    try:
        _runner(_serve(options, args.host, args.port))
    except OSError as exc:
        print(f"narwhal sim: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0
