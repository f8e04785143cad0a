"""What a run was, in words: the table's header and every plot's title say the same.

A figure passed around without its run (a PNG in a chat, a slide) should still
say what it measured: target, endpoint, model, workload and lengths, SLO, when
and with which narwhal.
"""

from __future__ import annotations

from datetime import datetime
from importlib import metadata

from narwhal.bench.config import ENDPOINT_PATHS, MULTI_TURN, BenchConfig
from narwhal.bench.session import BenchResult
from narwhal.bench.stats import Slo
from narwhal.bench.workload import LengthRange

TITLE_URLS = 2  # URLs named in a plot's title; the rest are counted


def narwhal_version() -> str | None:
    try:
        return metadata.version("narwhal-router")  # the distribution's name, not the package's
    except metadata.PackageNotFoundError:
        return None


def length_range(r: LengthRange) -> str:
    return str(r.low) if r.low == r.high else f"{r.low}:{r.high}"


def slo_text(slo: Slo) -> str | None:
    """`TTFT <= 2 s and TPOT <= 0.05 s`; None when no SLO is set."""
    parts = []
    if slo.ttft_s is not None:
        parts.append(f"TTFT <= {slo.ttft_s:g} s")
    if slo.tpot_s is not None:
        parts.append(f"TPOT <= {slo.tpot_s:g} s")
    return " and ".join(parts) if parts else None


def _prefix_text(c: BenchConfig) -> str:
    """The prefix workload's shape."""
    prefix = c.prefix
    assert prefix is not None
    parts: list[str] = [c.workload]
    if c.workload == MULTI_TURN:
        if c.dataset is not None:
            replies = "its own replies" if prefix.dataset_replies else "the replies received"
            parts.append(f"conversations of {c.dataset} with {replies}")
        else:
            turns, suffix = length_range(prefix.turns), length_range(prefix.suffix_tokens)
            parts.append(f"{turns} turns of {suffix} tokens")
        think = prefix.think_s
        seconds = f"{think.low:g}" if think.low == think.high else f"{think.low:g}:{think.high:g}"
        parts.append(f"think {seconds} s")
    else:
        parts.append(f"suffix {length_range(prefix.suffix_tokens)} tokens")
    system = prefix.system_prompts
    if system is not None:
        pick = "uniform" if system.zipf is None else f"Zipf {system.zipf:g}"
        tokens = length_range(system.tokens)
        parts.append(f"{system.count} system prompts of {tokens} tokens ({pick})")
    return ", ".join(parts)


def lengths_text(c: BenchConfig) -> str:
    """The workload and its prompt and output lengths."""
    output = f"max {length_range(c.max_tokens)} output tokens"
    if c.ignore_eos:
        output += " (ignore_eos)"
    if c.prefix is not None:
        return f"{_prefix_text(c)}, {output}"
    if c.dataset is not None:
        return f"dataset {c.dataset}"
    return f"prompt {length_range(c.prompt_tokens)} tokens, {output}"


def targets_text(c: BenchConfig, limit: int | None = None) -> str:
    """The base URLs (the first `limit` of them, the rest counted) and the endpoint."""
    urls = list(c.urls)
    shown = urls if limit is None else urls[:limit]
    text = ", ".join(shown)
    if len(urls) > len(shown):
        text += f" (+{len(urls) - len(shown)} more)"
    return f"{text} {ENDPOINT_PATHS[c.endpoint]}"


def when_text(started_at: datetime | None) -> str | None:
    """`2025-06-01 12:00:03 UTC, narwhal 0.1.0`, or what of it is known."""
    parts = []
    if started_at is not None:
        parts.append(started_at.strftime("%Y-%m-%d %H:%M:%S %Z").strip())
    version = narwhal_version()
    if version is not None:
        parts.append(f"narwhal {version}")
    return ", ".join(parts) if parts else None


def plot_title(result: BenchResult) -> str:
    """Three lines for the top of every figure."""
    c = result.config
    mode = "stream" if c.stream else "no-stream"
    first = f"{targets_text(c, TITLE_URLS)}, model {result.model}, {mode}"
    last = [f"SLO {slo_text(c.slo) or 'none'}"]
    when = when_text(result.started_at)
    if when is not None:
        last.append(when)
    return "\n".join([first, lengths_text(c), ", ".join(last)])
