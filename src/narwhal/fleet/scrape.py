"""Reading an engine's load from its Prometheus /metrics page (sans-IO).

Only three numbers matter to the scheduler, and the page is read every probe interval
for every engine, so instead of building every metric family (a vLLM page has several
hundred histogram lines) this scans for the few lines it needs with `str.find`, which
runs in C; see tests/fleet/bench_scrape.py for the measurement against
prometheus_client's parser and tests/fleet/test_scrape.py for the cross-check.

Text exposition format facts relied on: a sample line is `name[{labels}] value
[timestamp]`; comment lines (`# HELP`, `# TYPE`) start with `#`; a label set ends at the
last `}` of its line, since neither the value nor the timestamp contains one, so label
values that hold `}` or escaped quotes need no special parsing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class EngineScrape:
    """An engine's load as its own metrics report it; None = the page did not say."""

    running: float | None
    waiting: float | None
    kv_usage: float | None  # fraction 0-1 of the KV cache in use


@dataclass(frozen=True, slots=True)
class _Names:
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_usage: tuple[str, ...]  # in order of preference: the first name present wins


# PROTOCOL.md §5.1 (vLLM V1) and §6.1 (SGLang).
_VLLM: Final = _Names(
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    # gpu_cache_usage_perc: the deprecated alias, the only name before vLLM 0.11.
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
)
_SGLANG: Final = _Names(
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    kv_usage=("sglang:token_usage",),
)
# A generic `openai` engine may well be a vLLM or SGLang server behind a plain dialect.
_BY_DIALECT: Final[dict[str, tuple[_Names, ...]]] = {
    "vllm": (_VLLM,),
    "sglang": (_SGLANG,),
    "openai": (_VLLM, _SGLANG),
}


def parse_engine_metrics(text: str, dialect: str) -> EngineScrape | None:
    """The load on the page, or None when none of the dialect's load metrics is on it.

    With several label sets (data-parallel engines behind one server, `engine="0"`,
    `engine="1"`, ...) request counts are summed and KV usage is averaged: usage is a
    fraction of each engine's own cache, so a sum could exceed 1. NaN and infinite
    samples are ignored; a metric whose every sample is ignored reads as None.
    """
    for names in _BY_DIALECT.get(dialect, ()):
        running_seen, running = _total(text, names.running[0])
        waiting_seen, waiting = _total(text, names.waiting[0])
        kv_seen = False
        kv_usage: float | None = None
        for name in names.kv_usage:
            kv_seen, kv_usage = _mean(text, name)
            if kv_seen:
                break
        if running_seen or waiting_seen or kv_seen:
            return EngineScrape(running=running, waiting=waiting, kv_usage=kv_usage)
    return None


def _total(text: str, name: str) -> tuple[bool, float | None]:
    seen, values = _samples(text, name)
    return seen, (sum(values) if values else None)


def _mean(text: str, name: str) -> tuple[bool, float | None]:
    seen, values = _samples(text, name)
    return seen, (sum(values) / len(values) if values else None)


def _samples(text: str, name: str) -> tuple[bool, list[float]]:
    """(whether any sample line of `name` exists, its finite values)."""
    seen = False
    values: list[float] = []
    size = len(text)
    skip = len(name)
    needle = "\n" + name
    # Line starts of `name`: offset 0, or just after a newline.
    start = 0 if text.startswith(name) else _next_line_start(text, needle, 0)
    while start != -1:
        i = start + skip
        end = text.find("\n", i)
        if end == -1:
            end = size
        after = text[i] if i < size else "\n"
        rest: str | None = None
        if after == "{":
            close = text.rfind("}", i, end)
            if close != -1:
                rest = text[close + 1 : end]
        elif after in " \t":
            rest = text[i:end]
        # Anything else is a longer name sharing this prefix (`..._waiting_by_reason`,
        # `..._created`): not ours.
        if rest is not None:
            fields = rest.split()
            if fields:
                seen = True
                try:
                    value = float(fields[0])
                except ValueError:
                    value = math.nan
                if math.isfinite(value):
                    values.append(value)
        start = _next_line_start(text, needle, end)
    return seen, values


def _next_line_start(text: str, needle: str, pos: int) -> int:
    found = text.find(needle, pos)
    return found + 1 if found != -1 else -1
