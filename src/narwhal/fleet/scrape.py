"""Reading an engine's load from its Prometheus /metrics page (sans-IO).

Only a few numbers matter to the scheduler, and the page is read every probe interval
for every engine, so instead of building every metric family (a vLLM page has several
hundred histogram lines) this picks out the few lines it needs in one pass of a
compiled regular expression anchored on line starts, which runs in C; see
tests/fleet/bench_scrape.py for the measurement against prometheus_client's parser and
tests/fleet/test_scrape.py for the cross-check.

Text exposition format facts relied on: a sample line is `name[{labels}] value
[timestamp]`; comment lines (`# HELP`, `# TYPE`) start with `#`; a label set ends at the
last `}` of its line, since neither the value nor the timestamp contains one, so label
values that hold `}` or escaped quotes need no special parsing to be skipped. Only
`vllm:cache_config_info`, whose numbers are in its labels, has its label set read
(one line per engine), with the format's escapes (`\\\\`, `\\"`, `\\n`).

Prefix caching (vLLM, PROTOCOL.md §5.1): `vllm:prefix_cache_queries_total` and
`vllm:prefix_cache_hits_total` count prompt tokens looked up and found cached;
`vllm:cache_config_info` carries `block_size` and `num_gpu_blocks`. vLLM's API server
sums the data-parallel engines' blocks into its one cache config, so `num_gpu_blocks`
is the server's total and every engine's series repeats it: it is read, not summed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from narwhal.protocol.dialects import MetricsVendor


@dataclass(frozen=True, slots=True)
class EngineScrape:
    """An engine's load as its own metrics report it; None = the page did not say."""

    running: float | None
    waiting: float | None
    kv_usage: float | None  # fraction 0-1 of the KV cache in use
    # Prefix cache, in tokens since the engine started (counters: compare two scrapes).
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    block_size: int | None = None  # tokens per KV block
    num_gpu_blocks: int | None = None  # KV blocks of the whole server
    prefix_caching: bool | None = None  # cache_config_info's enable_prefix_caching


@dataclass(frozen=True, slots=True)
class _Names:
    running: str
    waiting: str
    kv_usage: tuple[str, ...]  # in order of preference: the first name present wins
    cache_queries: tuple[str, ...] = ()
    cache_hits: tuple[str, ...] = ()
    cache_config: str | None = None
    # A sample line of one of the names above: the name, then the rest of the line. The
    # name must end at `{`, a space or a tab, so longer names sharing its prefix
    # (`..._waiting_by_reason`, `..._created`) are not taken for it.
    namespace: str = field(init=False, repr=False)
    lines: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        cache = [*self.cache_queries, *self.cache_hits, *filter(None, [self.cache_config])]
        wanted = [self.running, self.waiting, *self.kv_usage, *cache]
        # The namespace (`vllm:`) leads the pattern as a literal, outside any group, which
        # lets the regex engine jump from candidate line to candidate line at the speed
        # of a string search.
        namespace = self.running.split(":", 1)[0] + ":"
        assert all(name.startswith(namespace) for name in wanted)
        rest = "|".join(re.escape(name[len(namespace) :]) for name in wanted)
        pattern = f"\\n{re.escape(namespace)}({rest})([{{ \\t][^\\n]*)"
        object.__setattr__(self, "namespace", namespace)
        object.__setattr__(self, "lines", re.compile(pattern))


# PROTOCOL.md §5.1 (vLLM V1) and §6.1 (SGLang).
_VLLM: Final = _Names(
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    # gpu_cache_usage_perc: the deprecated alias, the only name before vLLM 0.11.
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    # gpu_prefix_cache_*: the names before vLLM 0.9, deprecated aliases until 0.11.
    cache_queries=("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    cache_hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    cache_config="vllm:cache_config_info",
)
_SGLANG: Final = _Names(
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    kv_usage=("sglang:token_usage",),
)
_BY_VENDOR: Final[dict[MetricsVendor, _Names]] = {"vllm": _VLLM, "sglang": _SGLANG}


def parse_engine_metrics(text: str, vendors: Sequence[MetricsVendor]) -> EngineScrape | None:
    """The load on the page, or None when none of the load metrics of `vendors` (the
    engine's `DialectCapabilities.metrics_vendors`, tried in order) is on it.

    With several label sets (data-parallel engines behind one server, `engine="0"`,
    `engine="1"`, ...) request counts are summed and KV usage is averaged: usage is a
    fraction of each engine's own cache, so a sum could exceed 1. NaN and infinite
    samples are ignored; a metric whose every sample is ignored reads as None.
    """
    for names in (_BY_VENDOR[vendor] for vendor in vendors):
        lines = _sample_lines(text, names)
        running_seen, running = _total(lines.get(names.running))
        waiting_seen, waiting = _total(lines.get(names.waiting))
        kv_seen = False
        kv_usage: float | None = None
        for name in names.kv_usage:
            kv_seen, kv_usage = _mean(lines.get(name))
            if kv_seen:
                break
        if running_seen or waiting_seen or kv_seen:
            block_size, num_gpu_blocks, caching = _cache_config(lines.get(names.cache_config or ""))
            return EngineScrape(
                running=running,
                waiting=waiting,
                kv_usage=kv_usage,
                prefix_cache_queries=_first_total(lines, names.cache_queries),
                prefix_cache_hits=_first_total(lines, names.cache_hits),
                block_size=block_size,
                num_gpu_blocks=num_gpu_blocks,
                prefix_caching=caching,
            )
    return None


def _sample_lines(text: str, names: _Names) -> dict[str, list[str]]:
    """For each wanted name on the page, what follows it on each of its sample lines."""
    found: dict[str, list[str]] = {}
    pattern, namespace = names.lines, names.namespace
    end = text.find("\n")
    first = pattern.match("\n" + (text if end == -1 else text[:end]))  # no newline before it
    for match in (first, *pattern.finditer(text)) if first else pattern.finditer(text):
        found.setdefault(namespace + match[1], []).append(match[2])
    return found


def _total(lines: list[str] | None) -> tuple[bool, float | None]:
    seen, values = _values(lines)
    return seen, (sum(values) if values else None)


def _mean(lines: list[str] | None) -> tuple[bool, float | None]:
    seen, values = _values(lines)
    return seen, (sum(values) / len(values) if values else None)


def _first_total(lines: dict[str, list[str]], names: tuple[str, ...]) -> float | None:
    """The sum of the first of `names` the page has (current name, then older ones)."""
    for name in names:
        seen, total = _total(lines.get(name))
        if seen:
            return total
    return None


def _values(lines: list[str] | None) -> tuple[bool, list[float]]:
    """(whether any of the sample lines has a value, the finite values)."""
    seen = False
    values: list[float] = []
    for rest in lines or ():
        if rest[0] == "{":
            close = rest.rfind("}")
            if close == -1:
                continue  # a broken label set: not a sample
            rest = rest[close + 1 :]
        fields = rest.split()
        if fields:
            seen = True
            try:
                value = float(fields[0])
            except ValueError:
                value = math.nan
            if math.isfinite(value):
                values.append(value)
    return seen, values


def _cache_config(lines: list[str] | None) -> tuple[int | None, int | None, bool | None]:
    """(block_size, num_gpu_blocks, enable_prefix_caching) from an info metric's labels,
    each None if unstated."""
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    caching: bool | None = None
    for rest in lines or ():
        close = rest.rfind("}")
        labels = _parse_labels(rest[1:close]) if rest[0] == "{" and close != -1 else None
        if labels is None:
            continue
        if block_size is None:
            block_size = _positive_int(labels.get("block_size"))
        if num_gpu_blocks is None:
            num_gpu_blocks = _positive_int(labels.get("num_gpu_blocks"))
        if caching is None:
            # Python's str(bool) in vLLM's labels.
            caching = {"True": True, "False": False}.get(labels.get("enable_prefix_caching", ""))
        if block_size is not None and num_gpu_blocks is not None and caching is not None:
            break  # the other engines' lines repeat the same config
    return block_size, num_gpu_blocks, caching


def _positive_int(value: str | None) -> int | None:
    """A label's integer; vLLM writes `str(None)` = "None" before the cache is sized."""
    if value is None or not value.isdigit():
        return None
    number = int(value)
    return number if number > 0 else None


# One `name="value"` pair and its separator; a value runs to the first unescaped quote.
_LABEL: Final = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_ESCAPE: Final = re.compile(r"\\(.)")
_UNESCAPE: Final = {"n": "\n"}  # `\\` and `\"` stand for the character itself


def _parse_labels(body: str) -> dict[str, str] | None:
    """`a="x",b="y\\"z"` -> {"a": "x", "b": 'y"z'}; None when malformed."""
    labels: dict[str, str] = {}
    pos, size = 0, len(body)
    match = _LABEL.match
    while pos < size:
        pair = match(body, pos)
        if pair is None:
            return None
        key, value = pair.groups()
        if "\\" in value:
            value = _ESCAPE.sub(lambda m: _UNESCAPE.get(m[1], m[1]), value)
        labels[key] = value
        pos = pair.end()
    return labels
