"""The `narwhal` command line: serve, check-config, sim, bench.

A subcommand's module is imported only when that subcommand runs, so `narwhal sim`
does not pay for the router's imports and `narwhal bench` needs nothing of the server.
Each module offers `add_arguments(parser)` and `run(args) -> int` (the exit status).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from narwhal import installed_version

_SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("narwhal.serve", "run the router (the embedded default without --config)"),
    "check-config": ("narwhal.check_config", "validate a configuration, print the effective one"),
    "sim": ("narwhal.sim.cli", "run one simulated inference engine"),
    "bench": ("narwhal.bench.cli", "load generator and report"),
}


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """The parser, with the arguments of `command` only (the others stay unimported)."""
    parser = argparse.ArgumentParser(
        prog="narwhal", description="An SLO-aware router for OpenAI-compatible LLM engines."
    )
    parser.add_argument("--version", action="version", version=f"narwhal {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in _SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(sub_parser)
            sub_parser.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args_list if not a.startswith("-")), None)
    args = build_parser(command).parse_args(args_list)
    status: int = args._module.run(args)
    return status
