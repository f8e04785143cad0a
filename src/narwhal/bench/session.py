"""One benchmark run, start to end: HTTP session, model, warm-up, stages, progress.

One `aiohttp.ClientSession` with one keep-alive `TCPConnector` (limit = the
largest stage concurrency) serves every request of the run. The session sends
no `Accept-Encoding`, so servers answer uncompressed and the stream can be
scanned as it arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp

from narwhal.bench.body import RequestShape
from narwhal.bench.client import discover_model
from narwhal.bench.config import SHARED_PREFIX, SINGLE, BenchConfig, StagePlan
from narwhal.bench.conversation import Conversations, ConversationSpec
from narwhal.bench.health_probe import HealthProbe
from narwhal.bench.progress import Counters, show
from narwhal.bench.runner import Runner, StageResult
from narwhal.bench.shared_prefix import SharedPrefixWorkload, SystemPrompts
from narwhal.bench.transcripts import Transcript
from narwhal.bench.workload import (
    DatasetItem,
    PromptText,
    RequestSource,
    Workload,
    WorkloadSpec,
)


@dataclass(slots=True)
class BenchResult:
    config: BenchConfig
    model: str
    stages: list[StageResult]
    interrupted: bool
    error_samples: dict[str, str]
    warmup_errors: dict[str, int] = field(default_factory=dict)  # by key, as a stage's
    started_at: datetime | None = None  # when the run began (UTC)


def _session(config: BenchConfig) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(
        limit=config.max_concurrency, limit_per_host=0, ttl_dns_cache=300
    )
    headers = {"Content-Type": "application/json", "User-Agent": "narwhal-bench"}
    headers.update(config.headers)
    return aiohttp.ClientSession(
        connector=connector,
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=config.timeout_s),
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding",),
    )


def _show_progress(config: BenchConfig) -> bool:
    if config.progress is not None:
        return config.progress
    return sys.stderr.isatty()


def make_workload(
    config: BenchConfig,
    model: str,
    dataset: list[DatasetItem] | None = None,
    transcripts: list[Transcript] | None = None,
) -> RequestSource | Conversations:
    """The run's requests or conversations, as the flags ask (the same for the same flags)."""
    if config.workload == SINGLE:
        return Workload(
            WorkloadSpec(
                endpoint=config.endpoint,
                model=model,
                stream=config.stream,
                token_ids=config.token_ids,
                ignore_eos=config.ignore_eos,
                extra=config.extra,
                prompt_tokens=config.prompt_tokens,
                max_tokens=config.max_tokens,
                seed=config.seed,
                dataset=dataset,
            )
        )
    prefix = config.prefix
    assert prefix is not None
    shape = RequestShape(
        config.endpoint, model, config.stream, config.token_ids, config.ignore_eos, config.extra
    )
    system = prefix.system_prompts
    longest = max(prefix.suffix_tokens.high, system.tokens.high if system is not None else 0)
    text = PromptText(config.seed, longest)
    prompts = SystemPrompts(system, config.seed, text) if system is not None else None
    if config.workload == SHARED_PREFIX:
        assert prompts is not None
        return SharedPrefixWorkload(
            shape, prompts, text, prefix.suffix_tokens, config.max_tokens, config.seed
        )
    spec = ConversationSpec(
        turns=prefix.turns,
        suffix_tokens=prefix.suffix_tokens,
        max_tokens=config.max_tokens,
        think_s=prefix.think_s,
        seed=config.seed,
        dataset_replies=prefix.dataset_replies,
    )
    if transcripts is not None:
        return Conversations(spec, shape, prompts=prompts, transcripts=transcripts)
    return Conversations(spec, shape, prompts=prompts, text=text)


async def run_bench(
    config: BenchConfig,
    dataset: list[DatasetItem] | None = None,
    transcripts: list[Transcript] | None = None,
) -> BenchResult:
    """Run every stage; raises `SetupError` when no model can be found."""
    started_at = datetime.now(UTC)
    loop = asyncio.get_running_loop()
    async with _session(config) as session:
        model = config.model or await discover_model(
            session, config.urls[0], min(10.0, config.timeout_s)
        )
        workload = make_workload(config, model, dataset, transcripts)
        counters = Counters()
        runner = Runner(
            session,
            workload,
            config.endpoint_urls(),
            stream=config.stream,
            keep_marks=config.token_times,
            seed=config.seed,
            counters=counters,
        )
        handled = False
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, runner.interrupt)
            handled = True
        bar = asyncio.create_task(show(counters, sys.stderr)) if _show_progress(config) else None
        stages: list[StageResult] = []
        try:
            await runner.warmup(config.warmup, config.stages[0].concurrency)
            if config.start_at is not None:
                # A step across processes: each bench is up before its stage's instant, so
                # no process start-up lands on it.
                await asyncio.sleep(max(0.0, config.start_at - time.time()))
            for number, plan in enumerate(config.stages):
                if runner.stopping:
                    break
                stages.append(await _run_stage(runner, plan, number, config))
        finally:
            if bar is not None:
                bar.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await bar
            if handled:
                loop.remove_signal_handler(signal.SIGINT)
    return BenchResult(
        config,
        model,
        stages,
        runner.stopping,
        runner.error_samples,
        runner.warmup_errors,
        started_at,
    )


async def _run_stage(
    runner: Runner, plan: StagePlan, number: int, config: BenchConfig
) -> StageResult:
    if config.health_probe_s <= 0:
        return await runner.run_stage(plan, number)
    async with HealthProbe(config.urls[0], config.health_probe_s) as probe:
        result = await runner.run_stage(plan, number)
    result.health_latency_s = probe.latencies_s
    return result
