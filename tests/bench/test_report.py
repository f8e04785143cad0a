"""Table, JSON document, progress bar, and the package's import boundary."""

from __future__ import annotations

import argparse
import ast
import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

import narwhal.bench
from narwhal.bench import cli
from narwhal.bench.config import BenchConfig, StagePlan, from_args
from narwhal.bench.conversation import ConversationCounts
from narwhal.bench.progress import Counters, render
from narwhal.bench.record import HTTP, Record
from narwhal.bench.report import document, summaries, table, write_json
from narwhal.bench.runner import StageResult
from narwhal.bench.session import BenchResult
from narwhal.bench.stats import Slo


def config() -> BenchConfig:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--url", "http://127.0.0.1:1", "--rate", "2", "-c", "16"])
    return replace(from_args(args), slo=Slo(ttft_s=0.2))


def result() -> BenchResult:
    ok = Record(0, 0, 128, 4)
    ok.start, ok.status, ok.ttft, ok.last_token, ok.latency = 0.0, 200, 0.1, 0.4, 0.5
    ok.tokens, ok.events = 4, 6
    failed = Record(1, 0, 128, 4)
    failed.start, failed.status, failed.error, failed.latency = 0.01, 429, HTTP, 0.002
    stage = StageResult(
        plan=StagePlan("rate=2/s", 2.0, 16, 2, None),
        records=[ok, failed],
        started=0.0,
        window_s=1.0,
        cpu_s=0.002,
        issued=2,
        client_queued=0,
        interrupted=False,
    )
    return BenchResult(config(), "m", [stage], False, {"HTTP 429": '{"error": "busy"}'})


def test_table_and_document(tmp_path: Path) -> None:
    res = result()
    sums = summaries(res)
    text = table(res, sums)
    assert "== rate=2/s ==" in text
    assert "requests      2 (ok 1, errors 1)" in text
    assert "HTTP 429: 1" in text and "attainment 50.0%" in text
    assert 'HTTP 429: {"error": "busy"}' in text
    path = tmp_path / "out" / "r.json"
    write_json(path, document(res, sums))
    doc = json.loads(path.read_text())
    (stage,) = doc["stages"]
    assert doc["error_samples"] == {"HTTP 429": '{"error": "busy"}'}
    assert stage["summary"]["error_counts"] == {"HTTP 429": 1}
    assert stage["summary"]["client_cpu_per_request_s"] == 0.001
    ok, failed = stage["requests"]
    assert ok["tpot_s"] == pytest.approx(0.1) and ok["meets_slo"] is True
    assert failed["ttft_s"] is None and failed["tpot_s"] is None  # NaN becomes null
    assert failed["status"] == 429 and failed["error"] == "http" and failed["meets_slo"] is False
    assert stage["summary"]["tpot_s"]["p99"] == pytest.approx(0.1)


def test_progress_render_fits_and_fills() -> None:
    counters = Counters()
    counters.begin("closed c=4", 100, None)
    counters.finished, counters.failed = 50, 2
    line = render(counters, counters.started + 2.0, 80)
    assert len(line) <= 80
    assert "50/100 err 2 25.0 req/s 2.0s" in line
    assert line.count("#") == 15  # half of 30
    assert len(render(counters, counters.started + 1.0, 20)) <= 20
    counters.begin("rate=1/s", 10**6, 4.0)
    assert render(counters, counters.started + 4.0, 80).count("#") == 30  # by time


def test_bench_imports_nothing_of_the_router() -> None:
    package = Path(narwhal.bench.__file__).parent
    for module in package.glob("*.py"):
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.startswith("narwhal"):
                    assert name.startswith(("narwhal.bench", "narwhal.protocol")), (module, name)


def test_conversation_stage_table_and_document(tmp_path: Path) -> None:
    records = []
    for number, (conversation, turn) in enumerate([(0, 1), (0, 2), (1, 1)]):
        r = Record(number, 0, 100, 4)
        r.start, r.status, r.ttft, r.last_token, r.latency = number * 0.1, 200, 0.2, 0.3, 0.3
        r.tokens, r.events, r.conversation, r.turn, r.system_prompt = 4, 6, conversation, turn, 1
        r.usage_prompt_tokens, r.cached_tokens = 200, 100 if turn == 2 else 0
        records.append(r)
    counts = ConversationCounts(started=2, completed=1, cut=1)
    stage = StageResult(
        plan=StagePlan("rate=2/s", 2.0, 16, 3, None),
        records=records,
        started=0.0,
        window_s=1.0,
        cpu_s=0.003,
        issued=3,
        interrupted=False,
        conversations=counts,
        conversation_rate=1.0,
    )
    res = BenchResult(config(), "m", [stage], False, {})
    sums = summaries(res)
    text = table(res, sums)
    assert "2 req/s as conversations Poisson at 1/s (generated" in text
    assert "conversations 2 started: 1 completed, 0 ended by a failed turn, 1 cut" in text
    assert "turns         mean 1.5 per conversation, max 2" in text
    assert "  turn 1" in text and "  turn 2" in text
    assert "prompt cache  16.7% of prompt tokens cached (100 of 600, 3 responses)" in text
    doc = document(res, sums)
    write_json(tmp_path / "r.json", doc)
    doc = json.loads((tmp_path / "r.json").read_text())
    (stage_doc,) = doc["stages"]
    assert stage_doc["conversation_rate"] == 1.0
    c = stage_doc["summary"]["conversations"]
    assert (c["started"], c["completed"], c["failed"], c["cut"]) == (2, 1, 0, 1)
    assert [(t["turn"], t["count"]) for t in c["ttft_by_turn_s"]] == [(1, 2), (2, 1)]
    assert stage_doc["summary"]["prompt_cache"]["cached_share"] == pytest.approx(1 / 6)
    first = stage_doc["requests"][0]
    assert (first["conversation"], first["turn"], first["system_prompt"]) == (0, 1, 1)
    assert (first["usage_prompt_tokens"], first["cached_prompt_tokens"]) == (200, 0)


def test_a_single_workload_document_has_the_new_fields_null() -> None:
    res = result()
    doc = document(res, summaries(res))
    assert doc["config"]["workload"] == "single" and doc["config"]["prefix"] is None
    stage = doc["stages"][0]
    assert stage["summary"]["conversations"] is None
    assert "conversations" not in table(res, summaries(res))
    first = stage["requests"][0]
    assert first["conversation"] is None and first["turn"] is None
    assert first["system_prompt"] is None and first["usage_prompt_tokens"] is None


# The summary's keys before the vLLM-comparable figures: readers of older documents rely on
# every one of them, and on a distribution's.
SUMMARY_KEYS_V1 = {
    "requests", "ok", "errors", "error_counts", "window_s", "requests_per_s", "output_tokens",
    "output_tokens_per_s", "events_per_s", "ttft_s", "tpot_s", "latency_s", "attainment",
    "goodput_per_s", "admission", "client_cpu_s", "client_cpu_per_request_s", "prompt_cache",
    "conversations",
}  # fmt: skip
DISTRIBUTION_KEYS_V1 = {"count", "mean", "p50", "p90", "p99", "min", "max"}


def test_the_document_keeps_every_key_of_before_and_adds_the_new_figures() -> None:
    res = result()
    res.started_at = datetime(2025, 6, 1, 12, 0, 3, tzinfo=UTC)
    res.config = replace(res.config, percentiles=(50.0, 95.0, 99.0))
    doc = document(res, summaries(res))
    assert doc["schema"] == "narwhal-bench/1" and doc["started_at"] == "2025-06-01T12:00:03+00:00"
    assert doc["config"]["percentiles"] == [50.0, 95.0, 99.0]
    summary = doc["stages"][0]["summary"]
    assert set(summary) > SUMMARY_KEYS_V1
    new = set(summary) - SUMMARY_KEYS_V1
    assert new == {
        "input_tokens", "input_tokens_per_s", "input_tokens_from_usage", "total_tokens_per_s",
        "itl_s", "health_probe_s",
    }  # fmt: skip
    for key in ("ttft_s", "tpot_s", "latency_s", "itl_s", "health_probe_s"):
        assert set(summary[key]) == DISTRIBUTION_KEYS_V1 | {"p95"}, key
    for key in ("refusal_latency_s", "retry_after_s"):
        assert set(summary["admission"][key]) == DISTRIBUTION_KEYS_V1, key
    # the one success: 128 prompt tokens as sized (no usage), 4 output tokens, window 1 s
    assert (summary["input_tokens"], summary["input_tokens_from_usage"]) == (128, 0)
    assert summary["total_tokens_per_s"] == pytest.approx(132.0)


def test_the_table_names_its_rows_and_its_window() -> None:
    res = result()
    res.started_at = datetime(2025, 6, 1, 12, 0, 3, tzinfo=UTC)
    text = table(res, summaries(res))
    assert "  started 2025-06-01 12:00:03 UTC" in text
    assert "window        1.000 s (first request sent to last response ended)" in text
    assert "tokens/s      input 128.0, output 4.0, total 132.0 (input from usage: 0 of 1)" in text
    heading = text.index("(ms)  ")
    rows = [line[:14].strip() for line in text[heading:].splitlines()[1:5]]
    assert rows == ["TTFT", "TPOT", "ITL", "E2E latency"]
    assert "ITL                    -         -         -         -" in text  # no histogram
