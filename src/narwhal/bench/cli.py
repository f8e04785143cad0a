"""`narwhal bench`: the flags, and the run from parsed flags to exit status.

Exit status: 0 when at least one measured request succeeded, 1 when none did
(or the model could not be found), 2 for unusable flags, an unreadable dataset
or `--plot` without matplotlib, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from narwhal.bench import config as defaults
from narwhal.bench import plot, report
from narwhal.bench.client import SetupError
from narwhal.bench.config import BenchConfig, from_args
from narwhal.bench.session import run_bench
from narwhal.bench.transcripts import Transcript, load_transcripts
from narwhal.bench.workload import DatasetError, DatasetItem, load_dataset

T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("target")
    target.add_argument(
        "--url",
        action="append",
        required=True,
        metavar="URL",
        help="base URL of a server, e.g. http://127.0.0.1:8000 (repeat: round-robin)",
    )
    target.add_argument(
        "--endpoint",
        choices=sorted(defaults.ENDPOINT_PATHS),
        default="chat",
        help="/v1/chat/completions or /v1/completions (default: chat)",
    )
    target.add_argument("--model", help="model to ask for (default: first of GET /v1/models)")
    target.add_argument(
        "--header",
        action="append",
        metavar="NAME:VALUE",
        help="extra HTTP header on every request (repeatable)",
    )
    target.add_argument(
        "--timeout",
        type=float,
        default=defaults.DEFAULT_TIMEOUT_S,
        metavar="S",
        help="seconds per request, all of it (default: %(default)s)",
    )

    load = parser.add_argument_group("load (per stage; every run is bounded)")
    load.add_argument(
        "-n",
        "--requests",
        type=int,
        default=defaults.DEFAULT_REQUESTS,
        metavar="N",
        help="requests per stage (default: %(default)s)",
    )
    load.add_argument(
        "-c",
        "--concurrency",
        type=int,
        metavar="C",
        help=f"closed loop: requests in flight (default {defaults.DEFAULT_CONCURRENCY}); "
        f"open loop: connection pool size (default {defaults.DEFAULT_OPEN_CONCURRENCY})",
    )
    load.add_argument(
        "--rate", type=float, metavar="R", help="open loop: Poisson arrivals, R requests per second"
    )
    load.add_argument(
        "--sweep", metavar="R1,R2,...", help="one open-loop stage per rate, reported per stage"
    )
    load.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="no request starts S seconds or more after its stage began (with -n, whichever "
        "comes first); the requests in flight then run to their end, each bounded by "
        "--timeout, and are counted, so a stage lasts up to S plus --timeout",
    )
    load.add_argument(
        "--start-at",
        type=float,
        metavar="T",
        help="wait, after the warm-up, until T (seconds since the epoch, as `date +%%s.%%N` "
        "prints) before the first stage starts: a load step timed across processes, each "
        "started beforehand (a time already past starts at once)",
    )
    load.add_argument(
        "--health-probe",
        type=float,
        metavar="S",
        help="GET /health of the first --url every S seconds while each stage runs, from "
        "this client's own loop on a connection of its own, and report its latency: what "
        "the machine and this client add to any answer, the floor for refusal and TTFT "
        "latencies (not requests of the stage)",
    )
    load.add_argument(
        "--warmup",
        type=int,
        metavar="N",
        help="unmeasured requests first (default: the concurrency; "
        f"at most {defaults.OPEN_WARMUP_CAP} in open loop)",
    )
    load.add_argument(
        "--seed",
        type=int,
        default=defaults.DEFAULT_SEED,
        help="seed for prompts, lengths and arrivals (default: %(default)s)",
    )

    shape = parser.add_argument_group("requests")
    shape.add_argument(
        "--workload",
        choices=defaults.WORKLOADS,
        default=defaults.SINGLE,
        help="single: independent prompts (or --dataset lines); multi-turn: conversations "
        "whose every turn sends the whole history; shared-prefix: a few long system "
        "prompts with short user suffixes (default: %(default)s)",
    )
    shape.add_argument(
        "--prompt-tokens",
        metavar="N|A:B",
        help=f"single: prompt length, fixed or uniform (default: {defaults.DEFAULT_PROMPT_TOKENS})",
    )
    shape.add_argument(
        "--max-tokens",
        default=defaults.DEFAULT_MAX_TOKENS,
        metavar="N|A:B",
        help="max_tokens, fixed or uniform (default: %(default)s)",
    )
    shape.add_argument(
        "--dataset",
        type=Path,
        metavar="FILE",
        help='JSONL. single: one request a line, {"prompt": str} or {"messages": [...]}, '
        'optional "max_tokens", other keys sent as they are; multi-turn: one conversation '
        'a line, {"messages": [...]} or ShareGPT\'s {"conversations": [{"from", "value"}]}, '
        "its user messages sent turn by turn",
    )
    shape.add_argument("--no-stream", action="store_true", help="non-streaming requests")
    shape.add_argument(
        "--no-token-ids",
        action="store_true",
        help="do not send return_token_ids (for servers that reject it)",
    )
    shape.add_argument("--ignore-eos", action="store_true", help="send vLLM's ignore_eos: true")
    shape.add_argument("--extra", metavar="JSON", help="JSON object merged into every body")

    prefix = parser.add_argument_group(
        "multi-turn and shared-prefix workloads",
        "--rate stays requests per second: conversations arrive at --rate divided by the "
        "mean turns per conversation, and -n counts turns. A turn that fails ends its "
        "conversation.",
    )
    prefix.add_argument(
        "--turns",
        metavar="N|A:B",
        help=f"multi-turn: turns per conversation, fixed or uniform "
        f"(default: {defaults.DEFAULT_TURNS})",
    )
    prefix.add_argument(
        "--think-time",
        metavar="S|A:B",
        help="multi-turn: seconds from a reply's end to the next turn, fixed or uniform "
        f"(default: {defaults.DEFAULT_THINK_TIME})",
    )
    prefix.add_argument(
        "--suffix-tokens",
        metavar="N|A:B",
        help="the new user message's length: each turn's (multi-turn), after the system "
        f"prompt (shared-prefix) (default: {defaults.DEFAULT_SUFFIX_TOKENS})",
    )
    prefix.add_argument(
        "--system-prompts",
        type=int,
        metavar="K",
        help="K shared system prompts, one opening each request or conversation "
        f"(default: {defaults.DEFAULT_SHARED_SYSTEM_PROMPTS} for shared-prefix, "
        "0 for multi-turn)",
    )
    prefix.add_argument(
        "--system-prompt-tokens",
        metavar="N|A:B",
        help="each system prompt's length, fixed or uniform "
        f"(default: {defaults.DEFAULT_SYSTEM_PROMPT_TOKENS})",
    )
    prefix.add_argument(
        "--system-prompt-zipf",
        type=float,
        metavar="S",
        help="pick system prompts by Zipf: the i-th weighs 1/i**S (default: uniformly)",
    )
    prefix.add_argument(
        "--dataset-replies",
        action="store_true",
        help="multi-turn --dataset: send the file's assistant messages as the history "
        "(default: the replies received, the prefix the engine computed)",
    )

    out = parser.add_argument_group("report")
    out.add_argument("--slo-ttft", type=float, metavar="S", help="TTFT objective, seconds")
    out.add_argument("--slo-tpot", type=float, metavar="S", help="TPOT objective, seconds")
    out.add_argument(
        "--percentiles",
        default=defaults.DEFAULT_PERCENTILES_TEXT,
        metavar="P1,P2,...",
        help="percentiles of TTFT, TPOT, ITL and E2E latency in the table and the JSON, "
        "each above 0 and at most 100 (default: %(default)s)",
    )
    out.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="write the summary and every request's result as JSON",
    )
    out.add_argument(
        "--token-times", action="store_true", help="keep per-event token arrival times in the JSON"
    )
    out.add_argument(
        "--plot",
        type=Path,
        metavar="DIR",
        help="write PNG plots: TTFT CDF, TPOT and ITL CDF, latency over time; for a sweep, "
        "goodput and latency against throughput, and against offered load: admitted, refused "
        "and rejected stacked, admitted attainment beside that of all offered, token goodput "
        "beside request goodput (needs matplotlib: pip install '.[plot]')",
    )
    out.add_argument(
        "--progress",
        action="store_true",
        help="show the progress bar even when stderr is not a terminal",
    )
    out.add_argument("--no-uvloop", action="store_true", help="use asyncio's own event loop")


def _fail(message: str, status: int) -> int:
    print(f"narwhal bench: {message}", file=sys.stderr)
    return status


def _loop_factory(use_uvloop: bool) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if not use_uvloop:
        return None
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _run_loop(coro: Coroutine[Any, Any, T], use_uvloop: bool) -> T:
    with asyncio.Runner(loop_factory=_loop_factory(use_uvloop)) as runner:
        return runner.run(coro)


def run(args: argparse.Namespace) -> int:
    try:
        config: BenchConfig = from_args(args)
    except ValueError as exc:
        return _fail(f"error: {exc}", 2)
    if config.plot_dir is not None:
        try:
            plot.require()
        except plot.PlotUnavailable as exc:
            return _fail(str(exc), 2)
    dataset: list[DatasetItem] | None = None
    transcripts: list[Transcript] | None = None
    if config.dataset is not None:
        try:
            if config.workload == defaults.MULTI_TURN:
                transcripts = load_transcripts(config.dataset)
            else:
                dataset = load_dataset(config.dataset)
        except DatasetError as exc:
            return _fail(f"error: --dataset: {exc}", 2)
    try:
        result = _run_loop(run_bench(config, dataset, transcripts), config.uvloop)
    except SetupError as exc:
        return _fail(str(exc), 1)

    sums = report.summaries(result)
    print(report.table(result, sums), flush=True)
    if config.json_path is not None:
        report.write_json(config.json_path, report.document(result, sums))
    if config.plot_dir is not None:
        for path in plot.write_plots(result, sums, config.plot_dir):
            print(f"wrote {path}", file=sys.stderr)
    if result.interrupted:
        return 130
    return 0 if any(s.ok for s in sums) else 1
