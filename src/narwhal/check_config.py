"""`narwhal check-config FILE`: validate a configuration and print the effective one.

It checks what `narwhal serve` would: the file (every problem in it, not only the first),
the secrets it names (environment variables and files, read from this environment), the
TLS certificate and key, the tokenizer, and the OpenTelemetry SDK if spans are asked for.
Each problem is one line on stderr, `error: <key>: <what is wrong>`, and the exit status
is 2; otherwise the effective configuration goes to stdout, secrets redacted.
"""

from __future__ import annotations

import argparse
import os
import sys

import yaml

from narwhal.api.tls import server_tls_context
from narwhal.config import ConfigError, config_to_builtins, read_config, resolve_secrets
from narwhal.observability.tracing import check_tracing
from narwhal.sizing import load_sizer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="the YAML configuration to check")


def run(args: argparse.Namespace) -> int:
    try:
        written = read_config(args.file)
    except ConfigError as e:
        return _report(e.problems)
    problems: list[str] = []
    for check in (
        lambda: resolve_secrets(written, os.environ),
        lambda: server_tls_context(written.serving),
        lambda: load_sizer(written.tokenizer),
        lambda: check_tracing(written.tracing),
    ):
        try:
            check()
        except ConfigError as e:
            problems += e.problems
    if problems:
        return _report(problems)
    # As written (the `_env` and `_file` keys naming secrets, not their values).
    sys.stdout.write(yaml.safe_dump(config_to_builtins(written), sort_keys=False))
    return 0


def _report(problems: tuple[str, ...] | list[str]) -> int:
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 2
