"""The end of a run: the summary table (stdout) and the JSON document (`--json`).

JSON values that were not observed (a TTFT of a failed request, a percentile of
nothing) are `null`. Times are seconds in JSON and milliseconds in the table.
Every distribution in the JSON has `count`, `mean`, `p50`, `p90`, `p99`, `min`
and `max`, and a `p<N>` key for each of `--percentiles` (`p95`, `p99.9`); the
table's columns are the mean and `--percentiles`.
The admission figures (`stats.AdmissionSummary`) are always in the JSON, but in
the table only for stages that saw a 429, so a plain engine's report is as it was;
so are the prompt cache figures (in the table where a server reported cached
tokens). Conversation stages add how their conversations ended, the turns each
recorded and the TTFT of each turn number.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgspec

from narwhal.bench.admission import outcome
from narwhal.bench.config import MULTI_TURN, BenchConfig
from narwhal.bench.context import lengths_text, narwhal_version, slo_text, when_text
from narwhal.bench.record import Record
from narwhal.bench.runner import StageResult
from narwhal.bench.session import BenchResult
from narwhal.bench.stats import (
    AdmissionSummary,
    ConversationSummary,
    Distribution,
    StageSummary,
    meets_slo,
    percentile_label,
    record_tpot,
    summarize,
)

SCHEMA = "narwhal-bench/1"
TABLE_TURNS = 10  # turn numbers shown in the table; the JSON has every one


def summaries(result: BenchResult) -> list[StageSummary]:
    c = result.config
    return [
        summarize(
            s.records,
            s.window_s,
            s.cpu_s,
            c.slo,
            s.conversations,
            itl=s.itl,
            percentiles=c.percentiles,
            health_latency_s=s.health_latency_s,
        )
        for s in result.stages
    ]


# -- table --------------------------------------------------------------------------------


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1e3:.2f}"


def _num(value: float, digits: int = 1) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 100:.1f}%"


def _slo_text(result: BenchResult) -> str:
    return slo_text(result.config.slo) or "none set (success only)"


def _header(result: BenchResult) -> list[str]:
    c = result.config
    mode = "stream" if c.stream else "no-stream"
    ids = "token ids" if c.token_ids else "no token ids"
    lines = [
        f"narwhal bench  model {result.model}  {c.endpoint}  {mode}  {ids}",
        f"  {', '.join(c.urls)}",
        f"  {lengths_text(c)}, warm-up {c.warmup}, seed {c.seed}",
    ]
    when = when_text(result.started_at)
    if when is not None:
        lines.append(f"  started {when}")
    if result.warmup_errors:
        failed = sum(result.warmup_errors.values())
        kinds = ", ".join(f"{k}: {v}" for k, v in result.warmup_errors.items())
        lines.append(f"  warm-up: {failed} of {c.warmup} requests failed ({kinds})")
    return lines


def _dist_heading(name: str, percentiles: tuple[float, ...]) -> str:
    return f"{name:<14}{'mean':>10}" + "".join(f"{percentile_label(p):>10}" for p in percentiles)


def _dist_row(name: str, d: Distribution, percentiles: tuple[float, ...]) -> str:
    return f"{name:<14}{_ms(d.mean):>10}" + "".join(f"{_ms(d.at(p)):>10}" for p in percentiles)


def _tokens_line(s: StageSummary) -> str:
    return (
        f"{'tokens/s':<14}input {_num(s.input_tokens_per_s)}, output "
        f"{_num(s.output_tokens_per_s)}, total {_num(s.total_tokens_per_s)} "
        f"(input from usage: {s.input_from_usage} of {s.ok})"
    )


def _stage_block(result: BenchResult, stage: StageResult, s: StageSummary) -> list[str]:
    lines = [f"== {stage.plan.name}{'  (interrupted)' if stage.interrupted else ''} =="]
    lines.append(f"{'requests':<14}{s.requests} (ok {s.ok}, errors {s.errors})")
    lines.append(f"{'window':<14}{s.window_s:.3f} s (first request sent to last response ended)")
    if stage.plan.rate is not None:
        queued = f", {stage.client_queued} waited for a connection" if stage.client_queued else ""
        arrivals = "Poisson"
        if stage.conversations is not None:
            arrivals = f"as conversations Poisson at {stage.conversation_rate:.3g}/s"
        lines.append(
            f"{'offered':<14}{stage.plan.rate:g} req/s {arrivals} (generated "
            f"{_num(stage.offered_per_s)} req/s, start lag max {stage.max_lag_s * 1e3:.1f} ms"
            f"{queued})"
        )
    lines.append(
        f"{'throughput':<14}{_num(s.requests_per_s)} req/s, "
        f"{_num(s.output_tokens_per_s)} output tok/s, {_num(s.events_per_s)} events/s"
    )
    lines.append(_tokens_line(s))
    pcts = result.config.percentiles
    lines.append(_dist_heading("(ms)", pcts))
    lines.append(_dist_row("TTFT", s.ttft, pcts))
    lines.append(_dist_row("TPOT", s.tpot, pcts))
    lines.append(_dist_row("ITL", s.itl, pcts))
    lines.append(_dist_row("E2E latency", s.latency, pcts))
    lines.append(
        f"{'SLO':<14}{_slo_text(result)}: attainment {_pct(s.attainment)}, "
        f"goodput {_num(s.goodput_per_s)} req/s"
    )
    if s.conversations is not None:
        lines.extend(_conversation_lines(s.conversations, pcts))
    cache = s.prompt_cache
    if cache.responses:
        lines.append(
            f"{'prompt cache':<14}{_pct(cache.cached_share)} of prompt tokens cached "
            f"({cache.cached_tokens} of {cache.prompt_tokens}, {cache.responses} responses)"
        )
    if s.admission.saw_429:
        lines.extend(_admission_lines(result, s.admission))
    if s.error_counts:
        errors = ", ".join(f"{k}: {v}" for k, v in s.error_counts.items())
        lines.append(f"{'errors':<14}{errors}")
    if s.health.count:
        lines.append(
            f"{'GET /health':<14}p50 {_ms(s.health.p50)} ms, p99 {_ms(s.health.p99)} ms, "
            f"max {_ms(s.health.max)} ms ({s.health.count} probes from this client)"
        )
    lines.append(
        f"{'client CPU':<14}{_num(s.cpu_per_request_s * 1e3, 3)} ms/request "
        f"({s.cpu_s:.3f} s over the stage)"
    )
    return lines


def _conversation_lines(c: ConversationSummary, percentiles: tuple[float, ...]) -> list[str]:
    ended = [f"{c.completed} completed", f"{c.failed} ended by a failed turn"]
    if c.unreadable:
        ended.append(f"{c.unreadable} by a reply it could not read")
    ended.append(f"{c.cut} cut by the stage's end")
    t = c.turns
    lines = [
        f"{'conversations':<14}{c.started} started: {', '.join(ended)}",
        f"{'turns':<14}mean {_num(t.mean)} per conversation, max {_num(t.max, 0)}",
        _dist_heading("TTFT by turn", percentiles),
    ]
    for row in c.ttft_by_turn[:TABLE_TURNS]:
        lines.append(_dist_row(f"  turn {row.turn}", row.ttft, percentiles))
    if len(c.ttft_by_turn) > TABLE_TURNS:
        lines.append(f"  turns {TABLE_TURNS + 1}-{c.ttft_by_turn[-1].turn}: in the JSON")
    return lines


def _admission_lines(result: BenchResult, a: AdmissionSummary) -> list[str]:
    codes = ", ".join(f"{code} {n}" for code, n in a.refused_by_code.items())
    latency = a.refusal_latency_s
    refusal = f"latency p50 {_ms(latency.p50)} ms, p99 {_ms(latency.p99)} ms"
    r = a.retry_after_s
    if r.count:
        refusal += f"; Retry-After min {r.min:g} s, median {r.p50:g} s, max {r.max:g} s"
    ttft = result.config.slo.ttft_s
    promise = f"TTFT <= {ttft:g} s" if ttft is not None else "success only, no --slo-ttft"
    return [
        f"{'admission':<14}offered {a.offered}: admitted {a.admitted}, refused {a.refused}, "
        f"rejected {a.rejected}",
        f"{'refused by':<14}{codes}",
        f"{'refusal':<14}{refusal}",
        f"{'admitted':<14}attainment {_pct(a.admitted_attainment)} ({promise}; "
        "failures count as misses)",
    ]


# A sweep table's columns: heading, width and the cell of one stage's summary.
Column = tuple[str, int, Callable[[StageSummary], str]]

_SWEEP: tuple[Column, ...] = (
    ("req/s", 9, lambda s: _num(s.requests_per_s)),
    ("tok/s", 10, lambda s: _num(s.output_tokens_per_s)),
    ("TTFT p50", 10, lambda s: _ms(s.ttft.p50)),
    ("TTFT p99", 10, lambda s: _ms(s.ttft.p99)),
    ("TPOT p50", 10, lambda s: _ms(s.tpot.p50)),
    ("TPOT p99", 10, lambda s: _ms(s.tpot.p99)),
    ("attain", 8, lambda s: _pct(s.attainment)),
    ("goodput", 9, lambda s: _num(s.goodput_per_s)),
    ("errors", 8, lambda s: str(s.errors)),
)
_SWEEP_ADMISSION: tuple[Column, ...] = (
    ("offered", 9, lambda s: str(s.admission.offered)),
    ("admitted", 9, lambda s: str(s.admission.admitted)),
    ("refused", 9, lambda s: str(s.admission.refused)),
    ("rejected", 9, lambda s: str(s.admission.rejected)),
    ("adm attain", 11, lambda s: _pct(s.admission.admitted_attainment)),
    ("goodput", 9, lambda s: _num(s.goodput_per_s)),
    ("refusal p99", 12, lambda s: _ms(s.admission.refusal_latency_s.p99)),
)


def _stage_table(
    title: str, columns: tuple[Column, ...], result: BenchResult, sums: list[StageSummary]
) -> list[str]:
    lines = [title, f"{'stage':<14}" + "".join(f"{name:>{w}}" for name, w, _ in columns)]
    for stage, s in zip(result.stages, sums, strict=True):
        cells = "".join(f"{cell(s):>{w}}" for _, w, cell in columns)
        lines.append(f"{stage.plan.name:<14}{cells}")
    return lines


def table(result: BenchResult, sums: list[StageSummary]) -> str:
    lines = _header(result)
    for stage, s in zip(result.stages, sums, strict=True):
        lines.append("")
        lines.extend(_stage_block(result, stage, s))
    if len(result.stages) > 1:
        lines.append("")
        lines.extend(_stage_table("== sweep (times in ms) ==", _SWEEP, result, sums))
        if any(s.admission.saw_429 for s in sums):
            title = "== sweep admission (goodput in req/s, refusal latency in ms) =="
            lines.append("")
            lines.extend(_stage_table(title, _SWEEP_ADMISSION, result, sums))
    shown = {
        k: v
        for k, v in result.error_samples.items()
        if k in result.warmup_errors or any(k in s.error_counts for s in sums)
    }
    if shown:
        lines.append("")
        lines.append("first error of each kind:")
        for key, text in shown.items():
            line = " ".join(text.split())
            lines.append(f"  {key}: {line[:150]}{'...' if len(line) > 150 else ''}")
    if result.interrupted:
        lines.append("")
        lines.append("interrupted: requests in flight were cancelled and are not counted")
    return "\n".join(lines)


# -- JSON ---------------------------------------------------------------------------------


def distribution_dict(d: Distribution) -> dict[str, Any]:
    """count, mean, p50, p90, p99, min, max, then a p<N> for each percentile asked for."""
    out: dict[str, Any] = {
        "count": d.count,
        "mean": d.mean,
        "p50": d.p50,
        "p90": d.p90,
        "p99": d.p99,
        "min": d.min,
        "max": d.max,
    }
    out.update((percentile_label(p), value) for p, value in d.percentiles)
    return out


def summary_dict(s: StageSummary) -> dict[str, Any]:
    return {
        "requests": s.requests,
        "ok": s.ok,
        "errors": s.errors,
        "error_counts": s.error_counts,
        "window_s": s.window_s,
        "requests_per_s": s.requests_per_s,
        "output_tokens": s.output_tokens,
        "output_tokens_per_s": s.output_tokens_per_s,
        "input_tokens": s.input_tokens,
        "input_tokens_per_s": s.input_tokens_per_s,
        "input_tokens_from_usage": s.input_from_usage,
        "total_tokens_per_s": s.total_tokens_per_s,
        "events_per_s": s.events_per_s,
        "ttft_s": distribution_dict(s.ttft),
        "tpot_s": distribution_dict(s.tpot),
        "itl_s": distribution_dict(s.itl),
        "latency_s": distribution_dict(s.latency),
        "attainment": s.attainment,
        "goodput_per_s": s.goodput_per_s,
        "admission": _admission_dict(s.admission),
        "client_cpu_s": s.cpu_s,
        "client_cpu_per_request_s": s.cpu_per_request_s,
        "health_probe_s": distribution_dict(s.health),
        "prompt_cache": {**asdict(s.prompt_cache), "cached_share": s.prompt_cache.cached_share},
        "conversations": None if s.conversations is None else _conversation_dict(s.conversations),
    }


def _admission_dict(a: AdmissionSummary) -> dict[str, Any]:
    return {
        **{k: v for k, v in asdict(a).items() if k not in ("refusal_latency_s", "retry_after_s")},
        "refusal_latency_s": distribution_dict(a.refusal_latency_s),
        "retry_after_s": distribution_dict(a.retry_after_s),
    }


def _conversation_dict(c: ConversationSummary) -> dict[str, Any]:
    return {
        "started": c.started,
        "completed": c.completed,
        "failed": c.failed,
        "unreadable": c.unreadable,
        "cut": c.cut,
        "turns": distribution_dict(c.turns),
        "ttft_by_turn_s": [
            {"turn": row.turn, **distribution_dict(row.ttft)} for row in c.ttft_by_turn
        ],
    }


def _known(value: int) -> int | None:
    return None if value < 0 else value


def record_dict(r: Record, result: BenchResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": r.index,
        "url": r.target,
        "start_s": r.start,
        "status": r.status or None,
        "error": r.error,
        "error_code": r.code,
        "retry_after_s": r.retry_after,
        "admission": outcome(r),
        "ttft_s": r.ttft,
        "tpot_s": record_tpot(r),
        "last_token_s": r.last_token,
        "latency_s": r.latency,
        "output_tokens": r.tokens,
        "events": r.events,
        "prompt_tokens": r.prompt_tokens,
        "max_tokens": r.max_tokens,
        "usage_prompt_tokens": _known(r.usage_prompt_tokens),
        "cached_prompt_tokens": _known(r.cached_tokens),
        "conversation": _known(r.conversation),
        "turn": r.turn or None,
        "system_prompt": _known(r.system_prompt),
        "meets_slo": meets_slo(r, result.config.slo),
    }
    if r.marks is not None:
        m = r.marks
        out["token_times"] = [[m[i], int(m[i + 1])] for i in range(0, len(m) - 1, 2)]
    return out


def _config_dict(result: BenchResult) -> dict[str, Any]:
    c = result.config
    return {
        "urls": list(c.urls),
        "endpoint": c.endpoint,
        "model": result.model,
        "stream": c.stream,
        "token_ids": c.token_ids,
        "ignore_eos": c.ignore_eos,
        "prompt_tokens": [c.prompt_tokens.low, c.prompt_tokens.high],
        "max_tokens": [c.max_tokens.low, c.max_tokens.high],
        "dataset": str(c.dataset) if c.dataset is not None else None,
        "seed": c.seed,
        "timeout_s": c.timeout_s,
        "warmup": c.warmup,
        "extra": c.extra,
        "slo_ttft_s": c.slo.ttft_s,
        "slo_tpot_s": c.slo.tpot_s,
        "workload": c.workload,
        "prefix": None if c.prefix is None else _prefix_dict(c),
        "percentiles": list(c.percentiles),
    }


def _prefix_dict(c: BenchConfig) -> dict[str, Any]:
    prefix = c.prefix
    assert prefix is not None
    system = prefix.system_prompts
    return {
        "turns": [prefix.turns.low, prefix.turns.high] if c.workload == MULTI_TURN else None,
        "think_time_s": [prefix.think_s.low, prefix.think_s.high],
        "suffix_tokens": [prefix.suffix_tokens.low, prefix.suffix_tokens.high],
        "system_prompts": 0 if system is None else system.count,
        "system_prompt_tokens": None if system is None else [system.tokens.low, system.tokens.high],
        "system_prompt_zipf": None if system is None else system.zipf,
        "dataset_replies": prefix.dataset_replies,
    }


def document(result: BenchResult, sums: list[StageSummary]) -> dict[str, Any]:
    """The whole run as one JSON-ready object (NaN becomes null when encoded)."""
    return {
        "schema": SCHEMA,
        "started_at": None if result.started_at is None else result.started_at.isoformat(),
        "narwhal_version": narwhal_version(),
        "interrupted": result.interrupted,
        "config": _config_dict(result),
        "error_samples": result.error_samples,
        "warmup_errors": result.warmup_errors,
        "stages": [
            {
                "name": stage.plan.name,
                "mode": "closed" if stage.plan.rate is None else "open",
                "rate": stage.plan.rate,
                "concurrency": stage.plan.concurrency,
                "requests_planned": stage.plan.requests,
                "duration_s": stage.plan.duration_s,
                "started_s": stage.started,
                "issued": stage.issued,
                "offered_per_s": stage.offered_per_s,
                "conversation_rate": stage.conversation_rate,
                "max_lag_s": stage.max_lag_s,
                "client_queued": stage.client_queued,
                "interrupted": stage.interrupted,
                "summary": summary_dict(s),
                "requests": [record_dict(r, result) for r in stage.records],
            }
            for stage, s in zip(result.stages, sums, strict=True)
        ],
    }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode(doc) + b"\n")
