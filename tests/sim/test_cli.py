"""`narwhal sim` as a process: the startup line, flags from SimOptions, clean exit."""

from __future__ import annotations

import argparse
import dataclasses
import signal
import subprocess
import sys

import aiohttp

from narwhal.sim import SimOptions
from narwhal.sim.cli import add_arguments, options_from_args

from .conftest import sim_process


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_every_option_is_a_flag_with_the_same_default() -> None:
    args = _parse()
    assert options_from_args(args) == SimOptions()
    assert (args.host, args.port) == ("127.0.0.1", 8100)
    for field in dataclasses.fields(SimOptions):
        assert hasattr(args, field.name), field.name


def test_flags_parse_into_options() -> None:
    args = _parse("--dialect", "sglang", "--role", "prefill", "--time-scale", "0",
                  "--drift-after-s", "5", "--broken-metrics", "--max-num-seqs", "8")  # fmt: skip
    options = options_from_args(args)
    assert options.dialect == "sglang" and options.role == "prefill"
    assert options.time_scale == 0 and options.drift_after_s == 5.0
    assert options.broken_metrics and options.max_num_seqs == 8


def test_prefix_caching_flags() -> None:
    defaults = options_from_args(_parse())
    assert defaults.enable_prefix_caching and defaults.block_size == 16
    assert not defaults.enable_prompt_tokens_details
    options = options_from_args(
        _parse("--no-enable-prefix-caching", "--block-size", "32", "--enable-prompt-tokens-details")
    )
    assert not options.enable_prefix_caching and options.block_size == 32
    assert options.enable_prompt_tokens_details
    assert options_from_args(_parse("--enable-prefix-caching")).enable_prefix_caching


def test_help_lists_flags_and_scenarios() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "narwhal", "sim", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for text in ("--prefill-tokens-per-s", "--kv-capacity-tokens", "--decode-per-seq-ms",
                 "--block-size", "--no-enable-prefix-caching", "--enable-prompt-tokens-details",
                 "#sim:tool_calls", "#sim:stall=S"):  # fmt: skip
        assert text in out


async def test_process_serves_and_exits_cleanly_on_sigterm(http: aiohttp.ClientSession) -> None:
    with sim_process("--time-scale", "0", "--model", "m1") as sim:
        async with http.get(f"{sim.url}/v1/models") as response:
            assert (await response.json())["data"][0]["id"] == "m1"
        sim.proc.send_signal(signal.SIGTERM)
        assert sim.proc.wait(10) == 0
        assert sim.proc.stdout is not None
        assert sim.proc.stdout.read() == ""  # exactly one line was printed


async def test_process_takes_the_cache_flags(http: aiohttp.ClientSession) -> None:
    args = ("--time-scale", "0", "--block-size", "8", "--kv-capacity-tokens", "8000",
            "--no-enable-prefix-caching")  # fmt: skip
    with sim_process(*args) as sim:
        async with http.get(f"{sim.url}/metrics") as response:
            text = await response.text()
    (line,) = [line for line in text.splitlines() if line.startswith("vllm:cache_config_info{")]
    for label in ('block_size="8"', 'num_gpu_blocks="1000"', 'enable_prefix_caching="False"'):
        assert label in line


def test_bad_option_exits_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "narwhal", "sim", "--max-num-seqs", "0"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 2 and "max_num_seqs" in result.stderr
