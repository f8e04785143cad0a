"""The run's settings, checked once: one frozen tree built from the parsed flags.

Each default is declared here once; `cli` uses these constants for its flags.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from yarl import URL

from narwhal.bench.conversation import SecondsRange
from narwhal.bench.shared_prefix import SystemPromptSpec
from narwhal.bench.stats import DEFAULT_PERCENTILES, Slo
from narwhal.bench.workload import LengthRange

SINGLE = "single"
MULTI_TURN = "multi-turn"
SHARED_PREFIX = "shared-prefix"
WORKLOADS = (SINGLE, MULTI_TURN, SHARED_PREFIX)

DEFAULT_REQUESTS = 1000
DEFAULT_CONCURRENCY = 64  # closed loop: requests in flight
DEFAULT_OPEN_CONCURRENCY = 1024  # open loop: the most requests in flight (connection pool)
OPEN_WARMUP_CAP = 64  # open loop: default warm-up is the concurrency, at most this
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_PROMPT_TOKENS = "128"
DEFAULT_MAX_TOKENS = "64"
DEFAULT_SEED = 0
DEFAULT_TURNS = "4"
DEFAULT_THINK_TIME = "0"
DEFAULT_SUFFIX_TOKENS = "64"
DEFAULT_SYSTEM_PROMPT_TOKENS = "2000"
DEFAULT_SHARED_SYSTEM_PROMPTS = 4  # shared-prefix; multi-turn has none unless asked
ENDPOINT_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
DEFAULT_PERCENTILES_TEXT = ",".join(f"{p:g}" for p in DEFAULT_PERCENTILES)


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One measured stage: a closed loop (`rate` None) or an open loop at `rate`/s."""

    name: str
    rate: float | None
    concurrency: int
    requests: int
    duration_s: float | None


@dataclass(frozen=True, slots=True)
class PrefixPlan:
    """The flags of the workloads with shared prefixes (multi-turn, shared-prefix)."""

    turns: LengthRange  # generated conversations
    think_s: SecondsRange
    suffix_tokens: LengthRange  # each new user message
    system_prompts: SystemPromptSpec | None
    dataset_replies: bool


@dataclass(frozen=True, slots=True)
class BenchConfig:
    urls: tuple[str, ...]  # base URLs, no trailing slash or /v1
    endpoint: str
    model: str | None  # None: the first of GET /v1/models
    stages: tuple[StagePlan, ...]
    timeout_s: float
    prompt_tokens: LengthRange
    max_tokens: LengthRange
    dataset: Path | None
    seed: int
    stream: bool
    token_ids: bool
    ignore_eos: bool
    extra: dict[str, Any]
    headers: tuple[tuple[str, str], ...]
    slo: Slo
    warmup: int
    json_path: Path | None
    plot_dir: Path | None
    progress: bool | None  # None: when stderr is a terminal
    token_times: bool
    uvloop: bool
    workload: str  # one of WORKLOADS
    prefix: PrefixPlan | None  # None for the single workload
    start_at: float | None = None  # wall-clock seconds since the epoch: the first stage's start
    health_probe_s: float = 0.0  # GET /health this often during stages (0: never)
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES  # ascending, each in (0, 100]

    @property
    def sweep(self) -> bool:
        return len(self.stages) > 1

    @property
    def max_concurrency(self) -> int:
        return max(s.concurrency for s in self.stages)

    def endpoint_urls(self) -> list[URL]:
        return [URL(u + ENDPOINT_PATHS[self.endpoint]) for u in self.urls]


def _positive(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be positive, got {value}")


def _health_probe(every_s: float | None) -> float:
    if every_s is None:
        return 0.0
    if not 0.001 <= every_s <= 60:  # (also refuses NaN)
        raise ValueError(f"--health-probe must be from 0.001 to 60 seconds, got {every_s}")
    return every_s


def _base_url(text: str) -> str:
    url = URL(text)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"--url must be an http(s) URL, got {text!r}")
    path = url.path.rstrip("/")
    path = path.removesuffix("/v1")
    return str(url.with_path(path or "/").with_query(None)).rstrip("/")


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise ValueError(f"--header must be NAME:VALUE, got {text!r}")
    return name.strip(), value.strip()


def _rates(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--sweep must be rates separated by commas, got {text!r}") from None
    if not rates:
        raise ValueError("--sweep needs at least one rate")
    for rate in rates:
        _positive("a --sweep rate", rate)
    return rates


def _stages(args: argparse.Namespace) -> tuple[StagePlan, ...]:
    if args.rate is not None and args.sweep is not None:
        raise ValueError("--rate and --sweep exclude each other")
    _positive("--rate", args.rate)
    _positive("--duration", args.duration)
    if args.requests < 1:
        raise ValueError(f"--requests must be at least 1, got {args.requests}")
    if args.concurrency is not None and args.concurrency < 1:
        raise ValueError(f"--concurrency must be at least 1, got {args.concurrency}")
    if args.rate is None and args.sweep is None:
        concurrency = args.concurrency or DEFAULT_CONCURRENCY
        name = f"closed c={concurrency}"
        return (StagePlan(name, None, concurrency, args.requests, args.duration),)
    rates = (args.rate,) if args.rate is not None else _rates(args.sweep)
    concurrency = args.concurrency or DEFAULT_OPEN_CONCURRENCY
    return tuple(
        StagePlan(f"rate={r:g}/s", r, concurrency, args.requests, args.duration) for r in rates
    )


def percentiles(text: str) -> tuple[float, ...]:
    """`--percentiles 50,90,95,99`: numbers above 0 and at most 100, sorted, once each."""
    values: set[float] = set()
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise ValueError(
                f"--percentiles must be numbers separated by commas, got {part.strip()!r} "
                f"in {text!r}"
            ) from None
        if not 0 < value <= 100:  # NaN fails too
            raise ValueError(
                f"--percentiles must each be above 0 and at most 100, got {part.strip()!r}"
            )
        values.add(value)
    return tuple(sorted(values))


def _extra(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        extra = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise ValueError(f"--extra is not valid JSON: {exc}") from None
    if not isinstance(extra, dict):
        raise ValueError("--extra must be a JSON object")
    return extra


def _lengths(flag: str, text: str, least: int = 0) -> LengthRange:
    try:
        lengths = LengthRange.parse(text)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None
    if lengths.low < least:
        raise ValueError(f"{flag} must be at least {least}, got {text!r}")
    return lengths


# The flags that only the workloads with shared prefixes read (their argparse default is
# None, so a flag given where it means nothing is refused rather than ignored).
_CONVERSATION_FLAGS = ("turns", "think_time", "dataset_replies")
_PREFIX_FLAGS = ("suffix_tokens", "system_prompts", "system_prompt_tokens", "system_prompt_zipf")


def _refuse(args: argparse.Namespace, names: tuple[str, ...], why: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value is not False:
            raise ValueError(f"--{name.replace('_', '-')} {why}")


def _or(value: str | None, default: str) -> str:
    return default if value is None else value


def _system_prompts(args: argparse.Namespace, default_count: int) -> SystemPromptSpec | None:
    count = default_count if args.system_prompts is None else args.system_prompts
    if count < 0:
        raise ValueError(f"--system-prompts must be at least 0, got {count}")
    if count == 0:
        _refuse(args, ("system_prompt_tokens", "system_prompt_zipf"), "needs --system-prompts")
        return None
    _positive("--system-prompt-zipf", args.system_prompt_zipf)
    tokens = _lengths(
        "--system-prompt-tokens", _or(args.system_prompt_tokens, DEFAULT_SYSTEM_PROMPT_TOKENS), 1
    )
    return SystemPromptSpec(count, tokens, args.system_prompt_zipf)


def _prefix_plan(args: argparse.Namespace) -> PrefixPlan | None:
    """The prefix workloads' flags, checked against the workload they are given with."""
    workload = args.workload
    if workload == SINGLE:
        _refuse(args, _CONVERSATION_FLAGS, f"needs --workload {MULTI_TURN}")
        _refuse(args, _PREFIX_FLAGS, f"needs --workload {MULTI_TURN} or {SHARED_PREFIX}")
        return None
    _refuse(args, ("prompt_tokens",), f"is for --workload {SINGLE}; use --suffix-tokens")
    if workload == SHARED_PREFIX:
        _refuse(args, ("dataset",), f"is for --workload {SINGLE} or {MULTI_TURN}")
        _refuse(args, _CONVERSATION_FLAGS, f"is for --workload {MULTI_TURN}")
        system_prompts = _system_prompts(args, DEFAULT_SHARED_SYSTEM_PROMPTS)
        if system_prompts is None:
            raise ValueError(f"--workload {SHARED_PREFIX} needs --system-prompts of at least 1")
    else:
        if args.dataset is not None:
            _refuse(args, ("turns", "suffix_tokens"), "does not apply to --dataset conversations")
        elif args.dataset_replies:
            raise ValueError("--dataset-replies needs --dataset")
        system_prompts = _system_prompts(args, 0)
    try:
        think_s = SecondsRange.parse(_or(args.think_time, DEFAULT_THINK_TIME))
    except ValueError as exc:
        raise ValueError(f"--think-time: {exc}") from None
    return PrefixPlan(
        turns=_lengths("--turns", _or(args.turns, DEFAULT_TURNS), 1),
        think_s=think_s,
        suffix_tokens=_lengths("--suffix-tokens", _or(args.suffix_tokens, DEFAULT_SUFFIX_TOKENS)),
        system_prompts=system_prompts,
        dataset_replies=args.dataset_replies,
    )


def from_args(args: argparse.Namespace) -> BenchConfig:
    """Check the flags together; raise ValueError with a message naming the flag."""
    stages = _stages(args)
    _positive("--timeout", args.timeout)
    _positive("--slo-ttft", args.slo_ttft)
    _positive("--slo-tpot", args.slo_tpot)
    prefix = _prefix_plan(args)
    prompt_tokens = _lengths("--prompt-tokens", _or(args.prompt_tokens, DEFAULT_PROMPT_TOKENS))
    max_tokens = _lengths("--max-tokens", args.max_tokens)
    warmup = args.warmup
    if warmup is None:
        first = stages[0]
        warmup = (
            first.concurrency if first.rate is None else min(first.concurrency, OPEN_WARMUP_CAP)
        )
    if warmup < 0:
        raise ValueError(f"--warmup must be at least 0, got {warmup}")
    return BenchConfig(
        urls=tuple(_base_url(u) for u in args.url),
        endpoint=args.endpoint,
        model=args.model,
        stages=stages,
        timeout_s=args.timeout,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        dataset=args.dataset,
        seed=args.seed,
        stream=not args.no_stream,
        token_ids=not args.no_token_ids,
        ignore_eos=args.ignore_eos,
        extra=_extra(args.extra),
        headers=tuple(_header(h) for h in args.header or ()),
        slo=Slo(args.slo_ttft, args.slo_tpot),
        warmup=warmup,
        json_path=args.json,
        plot_dir=args.plot,
        progress=True if args.progress else None,
        token_times=args.token_times,
        uvloop=not args.no_uvloop,
        workload=args.workload,
        prefix=prefix,
        start_at=args.start_at,
        health_probe_s=_health_probe(args.health_probe),
        percentiles=percentiles(args.percentiles),
    )
