"""`narwhal check-config FILE`: validate a configuration and print the effective one."""

from __future__ import annotations

import argparse
import sys

import yaml

from narwhal.config import ConfigError, config_to_builtins, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="the YAML configuration to check")


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(yaml.safe_dump(config_to_builtins(config), sort_keys=False))
    return 0
