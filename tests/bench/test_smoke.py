"""`python -m narwhal bench` as a subprocess, against the test engine and `narwhal sim`
(the `sim_url` fixture is in conftest)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest


def run_bench(
    url: str, tmp_path: Path, *flags: str
) -> tuple[subprocess.CompletedProcess[str], Any]:
    out_json = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "narwhal", "bench", "--url", url, "--json", str(out_json), *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    doc = json.loads(out_json.read_text()) if out_json.exists() else None
    return proc, doc


def check(proc: subprocess.CompletedProcess[str], doc: Any, requests: int) -> None:
    assert proc.returncode == 0, proc.stderr
    assert "== closed c=4 ==" in proc.stdout and "client CPU" in proc.stdout
    summary = doc["stages"][0]["summary"]
    assert summary["requests"] == requests
    assert summary["ok"] + summary["errors"] == requests
    assert summary["ok"] == requests, summary["error_counts"]


def test_subprocess_against_test_engine(engine_url: str, tmp_path: Path) -> None:
    proc, doc = run_bench(
        engine_url, tmp_path, "-n", "16", "-c", "4", "--max-tokens", "8", "--progress"
    )
    check(proc, doc, 16)
    assert doc["stages"][0]["summary"]["output_tokens"] == 16 * 8


def test_subprocess_against_narwhal_sim(sim_url: str, tmp_path: Path) -> None:
    proc, doc = run_bench(sim_url, tmp_path, "-n", "12", "-c", "4", "--max-tokens", "8")
    check(proc, doc, 12)
    requests = doc["stages"][0]["requests"]
    assert all(r["output_tokens"] > 0 for r in requests)


def test_token_throughput_against_narwhal_sim_with_exact_lengths(
    sim_url: str, tmp_path: Path
) -> None:
    """Fixed prompt and output lengths with ignore_eos, the sim never sleeping: the output
    is exactly n * --max-tokens, the input what the sim's usage counted, and every rate is
    its count over the window of the requests' own times."""
    proc, doc = run_bench(
        sim_url, tmp_path, "-n", "12", "-c", "4", "--prompt-tokens", "200", "--max-tokens",
        "16", "--ignore-eos", "--percentiles", "50,90,95,99",
    )  # fmt: skip
    check(proc, doc, 12)
    (stage,) = doc["stages"]
    s, requests = stage["summary"], stage["requests"]
    assert s["output_tokens"] == 12 * 16
    assert all(r["output_tokens"] == 16 and r["usage_prompt_tokens"] > 0 for r in requests)
    prompt = sum(r["usage_prompt_tokens"] for r in requests)
    assert (s["input_tokens"], s["input_tokens_from_usage"]) == (prompt, 12)
    window = max(r["start_s"] + r["latency_s"] for r in requests) - min(
        r["start_s"] for r in requests
    )
    assert s["window_s"] == pytest.approx(window)
    assert s["input_tokens_per_s"] == pytest.approx(prompt / window)
    assert s["output_tokens_per_s"] == pytest.approx(12 * 16 / window)
    assert s["total_tokens_per_s"] == pytest.approx((prompt + 12 * 16) / window)
    assert s["itl_s"]["count"] == 12 * 15  # the sim streams one token an event
    assert "p95" in s["ttft_s"] and "p95" in s["itl_s"]
    assert "tokens/s      input" in proc.stdout and "ITL" in proc.stdout


def test_ctrl_c_reports_what_finished_and_exits_130(engine_url: str, tmp_path: Path) -> None:
    out_json = tmp_path / "bench.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "narwhal", "bench", "--url", engine_url, "-n", "100000",
         "-c", "4", "--max-tokens", "20", "--extra", '{"test_token_delay": 0.005}',
         "--duration", "30", "--progress", "--json", str(out_json)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        seen = b""
        while b"closed c=4 [" not in seen:  # the bar of the measured stage is drawn
            chunk = proc.stderr.read1(4096)
            assert chunk, "bench ended before it was interrupted"
            seen += chunk
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130
    assert time.monotonic() - started < 5
    assert b"(interrupted)" in out
    doc = json.loads(out_json.read_text())
    assert doc["interrupted"] is True
    summary = doc["stages"][0]["summary"]
    assert (
        summary["ok"] + summary["errors"]
        == summary["requests"]
        == len(doc["stages"][0]["requests"])
    )
