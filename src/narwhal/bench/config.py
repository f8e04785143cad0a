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

from narwhal.bench.stats import Slo
from narwhal.bench.workload import LengthRange

DEFAULT_REQUESTS = 1000
DEFAULT_CONCURRENCY = 64  # closed loop: requests in flight
DEFAULT_OPEN_CONCURRENCY = 1024  # open loop: the most requests in flight (connection pool)
OPEN_WARMUP_CAP = 64  # open loop: default warm-up is the concurrency, at most this
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_PROMPT_TOKENS = "128"
DEFAULT_MAX_TOKENS = "64"
DEFAULT_SEED = 0
ENDPOINT_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One measured stage: a closed loop (`rate` None) or an open loop at `rate`/s."""

    name: str
    rate: float | None
    concurrency: int
    requests: int
    duration_s: float | None


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


def from_args(args: argparse.Namespace) -> BenchConfig:
    """Check the flags together; raise ValueError with a message naming the flag."""
    stages = _stages(args)
    _positive("--timeout", args.timeout)
    _positive("--slo-ttft", args.slo_ttft)
    _positive("--slo-tpot", args.slo_tpot)
    try:
        prompt_tokens = LengthRange.parse(args.prompt_tokens)
    except ValueError as exc:
        raise ValueError(f"--prompt-tokens: {exc}") from None
    try:
        max_tokens = LengthRange.parse(args.max_tokens)
    except ValueError as exc:
        raise ValueError(f"--max-tokens: {exc}") from None
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
    )
