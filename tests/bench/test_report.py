"""Table, JSON document, progress bar, and the package's import boundary."""

from __future__ import annotations

import argparse
import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest

import narwhal.bench
from narwhal.bench import cli
from narwhal.bench.config import BenchConfig, StagePlan, from_args
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
