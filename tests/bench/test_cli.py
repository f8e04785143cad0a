"""`narwhal bench` end to end, in process, against the test engine on a real socket."""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from narwhal.bench import cli
from narwhal.bench.config import from_args
from narwhal.bench.runner import arrival_offsets


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def bench(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = cli.run(parse(argv))
    out, err = capsys.readouterr()
    return status, out, err


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def check_counts(doc: dict[str, Any]) -> None:
    for stage in doc["stages"]:
        s = stage["summary"]
        assert s["ok"] + s["errors"] == s["requests"] == len(stage["requests"])
        assert sum(s["error_counts"].values()) == s["errors"]


def test_closed_loop_json_and_table(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "r.json"
    status, out, _ = bench(
        ["--url", engine_url, "-n", "20", "-c", "4", "--max-tokens", "8", "--json", str(out_json),
         "--slo-ttft", "5", "--slo-tpot", "1", "--token-times"],
        capsys,
    )  # fmt: skip
    assert status == 0
    assert "requests      20 (ok 20, errors 0)" in out
    assert "TTFT" in out and "attainment 100.0%" in out and "client CPU" in out
    assert "admission" not in out and "refusal" not in out  # no 429: the report is as before
    doc = load(out_json)
    assert doc["schema"] == "narwhal-bench/1"
    assert doc["config"]["model"] == "test-model"  # asked /v1/models
    (stage,) = doc["stages"]
    assert stage["mode"] == "closed" and stage["concurrency"] == 4
    check_counts(doc)
    summary = stage["summary"]
    assert summary["output_tokens"] == 20 * 8
    assert summary["ttft_s"]["count"] == 20 and summary["ttft_s"]["p50"] > 0
    assert summary["attainment"] == 1.0 and summary["client_cpu_per_request_s"] > 0
    first = stage["requests"][0]
    assert first["status"] == 200 and first["error"] is None and first["output_tokens"] == 8
    assert first["events"] == 10  # role + 8 tokens + usage
    assert sum(k for _, k in first["token_times"]) == 8
    assert first["ttft_s"] <= first["last_token_s"] <= first["latency_s"]
    assert sorted(r["index"] for r in stage["requests"]) == list(range(20))


def test_errors_are_grouped_and_counts_add_up(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = tmp_path / "faults.jsonl"
    lines = ["plain", "#fault:429", "#fault:truncate", "#fault:error", "#fault:nodone"]
    dataset.write_text("".join(json.dumps({"prompt": p, "max_tokens": 6}) + "\n" for p in lines))
    out_json = tmp_path / "r.json"
    status, out, _ = bench(
        ["--url", engine_url, "--dataset", str(dataset), "-n", "10", "-c", "2",
         "--warmup", "0", "--json", str(out_json)],
        capsys,
    )  # fmt: skip
    assert status == 0
    doc = load(out_json)
    check_counts(doc)
    summary = doc["stages"][0]["summary"]
    assert summary["error_counts"] == {"HTTP 429": 2, "error_event": 2, "truncated": 2}
    assert summary["ok"] == 4  # plain and nodone (ends with a finish reason and usage)
    assert "HTTP 429: 2" in out
    assert "busy" in doc["error_samples"]["HTTP 429"]
    assert "engine died" in doc["error_samples"]["error_event"]
    assert "ClientPayloadError" in doc["error_samples"]["truncated"]
    assert "first error of each kind:" in out


ADMISSION_LINES = [
    {"prompt": "plain"},
    {"prompt": "plain"},
    {"prompt": "plain"},
    {"prompt": "late", "test_first_delay": 0.5},  # admitted, misses --slo-ttft 0.25
    {"prompt": "#fault:error"},  # admitted, failed: a miss
    {"prompt": "down", "test_error": {"status": 503, "code": "backend_unavailable"}},
    {"prompt": "r1", "test_error": {"code": "ttft_budget_exceeded", "retry_after": 1}},
    {"prompt": "r3", "test_error": {"code": "ttft_budget_exceeded", "retry_after": 3}},
    {"prompt": "long", "test_error": {"code": "prompt_exceeds_ttft_budget"}},
    {"prompt": "full", "test_error": {"code": "rate_limit_exceeded", "retry_after": 1}},
    {"prompt": "#fault:429"},  # vLLM's integer code: a 429 without a reason
    # Its code lies past the 64 KiB the client reads, so it counts as a rejection.
    {"prompt": "big", "test_error": {"code": "ttft_budget_exceeded", "pad": 100_000}},
]


@pytest.mark.alone  # its attainment is TTFTs against a 0.25 s SLO: wall-clock bound
def test_admission_refusals_over_a_sweep(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = tmp_path / "admission.jsonl"
    dataset.write_text("".join(json.dumps(line) + "\n" for line in ADMISSION_LINES))
    out_json = tmp_path / "r.json"
    n = len(ADMISSION_LINES)  # each stage sends every line once
    status, out, _ = bench(
        ["--url", engine_url, "--dataset", str(dataset), "--sweep", "40,80", "-n", str(n),
         "--max-tokens", "4", "--warmup", "0", "--slo-ttft", "0.25", "--json", str(out_json)],
        capsys,
    )  # fmt: skip
    assert status == 0
    doc = load(out_json)
    check_counts(doc)
    for stage in doc["stages"]:
        a = stage["summary"]["admission"]
        assert (a["offered"], a["admitted"], a["refused"], a["rejected"]) == (n, 6, 3, 3)
        assert a["refused_by_code"] == {"ttft_budget_exceeded": 2, "prompt_exceeds_ttft_budget": 1}
        assert a["admitted_attainment"] == 0.5
        retry = a["retry_after_s"]
        assert (retry["count"], retry["min"], retry["p50"], retry["max"]) == (2, 1.0, 2.0, 3.0)
        assert a["refusal_latency_s"]["count"] == 3
        assert 0 < a["refusal_latency_s"]["p50"] <= a["refusal_latency_s"]["p99"] < 1.0
        assert stage["summary"]["error_counts"] == {
            "HTTP 429": 2, "HTTP 429 prompt_exceeds_ttft_budget": 1,
            "HTTP 429 rate_limit_exceeded": 1, "HTTP 429 ttft_budget_exceeded": 2,
            "HTTP 503": 1, "error_event": 1,
        }  # fmt: skip
        refusals = [r for r in stage["requests"] if r["admission"] == "refused"]
        assert sorted(r["retry_after_s"] or 0 for r in refusals) == [0, 1.0, 3.0]
        for r in refusals:
            assert r["status"] == 429 and r["error"] == "http" and r["latency_s"] > 0
            assert r["error_code"] in ("ttft_budget_exceeded", "prompt_exceeds_ttft_budget")
        outcomes = sorted(r["admission"] for r in stage["requests"])
        assert outcomes == ["admitted"] * 6 + ["refused"] * 3 + ["rejected"] * 3
    first, second = doc["stages"]
    # The next stage starts from an idle client: after the last response of the one before.
    assert min(r["start_s"] for r in second["requests"]) >= max(
        r["start_s"] + r["latency_s"] for r in first["requests"]
    )
    assert "admission     offered 12: admitted 6, refused 3, rejected 3" in out
    assert "refused by    ttft_budget_exceeded 2, prompt_exceeds_ttft_budget 1" in out
    assert "admitted      attainment 50.0% (TTFT <= 0.25 s; failures count as misses)" in out
    assert "Retry-After min 1 s, median 2 s, max 3 s" in out
    table = out.split("== sweep admission")[1]
    assert table.count("        12        6        3        3      50.0%") == 2


def test_timeout_and_connect_errors(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = tmp_path / "slow.jsonl"
    dataset.write_text('{"prompt": "#fault:slow"}\n')
    status, out, _ = bench(
        ["--url", engine_url, "--dataset", str(dataset), "-n", "2", "-c", "2", "--warmup", "0",
         "--timeout", "0.3"],
        capsys,
    )  # fmt: skip
    assert status == 1  # nothing succeeded
    assert "timeout: 2" in out
    dead = f"http://127.0.0.1:{free_port()}"
    status, out, _ = bench(
        ["--url", dead, "--model", "m", "-n", "3", "-c", "1", "--warmup", "0"], capsys
    )
    assert status == 1 and "connect: 3" in out
    status, _, err = bench(["--url", dead, "-n", "1"], capsys)
    assert status == 1 and "/v1/models" in err


def test_warm_up_failures_are_reported(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Warm-up requests are not recorded, but a target that fails them is told."""
    out_json = tmp_path / "r.json"
    dataset = tmp_path / "busy.jsonl"
    dataset.write_text('{"prompt": "#fault:429"}\n')
    status, out, _ = bench(
        ["--url", engine_url, "--dataset", str(dataset), "-n", "2", "-c", "1", "--warmup", "3",
         "--json", str(out_json)],
        capsys,
    )  # fmt: skip
    assert status == 1
    assert "warm-up: 3 of 3 requests failed (HTTP 429: 3)" in out
    assert "HTTP 429:" in out.split("first error of each kind:")[1]
    assert load(out_json)["warmup_errors"] == {"HTTP 429": 3}
    status, out, _ = bench(["--url", engine_url, "-n", "2", "--warmup", "2"], capsys)
    assert status == 0 and "warm-up:" not in out


def test_sweep_open_loop_stages(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "r.json"
    status, out, _ = bench(
        ["--url", engine_url, "--sweep", "200,400", "-n", "12", "--max-tokens", "4",
         "--json", str(out_json), "--slo-ttft", "2"],
        capsys,
    )  # fmt: skip
    assert status == 0
    assert "== sweep (times in ms) ==" in out and "rate=200/s" in out
    doc = load(out_json)
    check_counts(doc)
    assert [s["rate"] for s in doc["stages"]] == [200.0, 400.0]
    assert all(s["mode"] == "open" and s["issued"] == 12 for s in doc["stages"])
    indices = [r["index"] for s in doc["stages"] for r in s["requests"]]
    assert sorted(indices) == list(range(24))  # positions continue across stages


def test_duration_caps_an_open_loop(engine_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    status, out, _ = bench(
        ["--url", engine_url, "--rate", "50", "-n", "100000", "--duration", "0.4",
         "--max-tokens", "2", "--warmup", "1"],
        capsys,
    )  # fmt: skip
    assert status == 0
    assert time.monotonic() - started < 10
    requests = int(out.split("requests")[1].split()[0])
    assert 3 <= requests <= 60


@pytest.mark.parametrize(
    ("flags", "tokens"),
    [
        (["--no-stream"], 5),
        (["--no-token-ids"], 5),  # from usage
        (["--endpoint", "completions"], 5),
        (["--extra", '{"test_ids_per_chunk": 2}'], 5),
    ],
)
def test_request_shapes(
    engine_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    tokens: int,
) -> None:
    out_json = tmp_path / "r.json"
    argv = ["--url", engine_url, "-n", "3", "-c", "1", "--max-tokens", "5"]
    status, _, _ = bench([*argv, "--json", str(out_json), *flags], capsys)
    assert status == 0
    doc = load(out_json)
    check_counts(doc)
    assert all(r["output_tokens"] == tokens for r in doc["stages"][0]["requests"])


def test_header_and_url_forms(engine_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = bench(
        ["--url", engine_url + "/v1/", "--url", engine_url, "--header", "X-Test: 1", "-n", "4",
         "-c", "2", "--max-tokens", "2"],
        capsys,
    )  # fmt: skip
    assert status == 0 and "(ok 4, errors 0)" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rate", "5", "--sweep", "1,2"], "exclude each other"),
        (["--sweep", "1,x"], "--sweep"),
        (["--rate", "0"], "--rate must be positive"),
        (["-n", "0"], "--requests"),
        (["--prompt-tokens", "9:3"], "--prompt-tokens"),
        (["--extra", "[1]"], "--extra must be a JSON object"),
        (["--extra", "{"], "--extra is not valid JSON"),
        (["--header", "nocolon"], "--header"),
        (["--timeout", "-1"], "--timeout"),
        (["--percentiles", "50,abc"], "--percentiles must be numbers separated by commas"),
        (["--percentiles", "0"], "--percentiles must each be above 0 and at most 100"),
        (["--percentiles", "50,100.5"], "--percentiles must each be above 0 and at most 100"),
        (["--percentiles", "nan"], "--percentiles must each be above 0 and at most 100"),
        (["--percentiles", "90,"], "--percentiles must be numbers separated by commas"),
    ],
)
def test_bad_flags_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = bench(["--url", "http://127.0.0.1:1", *argv], capsys)
    assert status == 2
    assert message in err


def test_bad_url_and_dataset_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = bench(["--url", "ftp://x"], capsys)
    assert status == 2 and "--url" in err
    status, _, err = bench(
        ["--url", "http://127.0.0.1:1", "--dataset", str(tmp_path / "no.jsonl")], capsys
    )
    assert status == 2 and "--dataset" in err


def test_config_defaults() -> None:
    closed = from_args(parse(["--url", "http://h:1/v1"]))
    assert closed.urls == ("http://h:1",)
    assert closed.stages[0].concurrency == 64 and closed.warmup == 64
    assert closed.stages[0].rate is None and closed.stream and closed.token_ids
    opened = from_args(parse(["--url", "http://h:1", "--rate", "3"]))
    assert opened.stages[0].concurrency == 1024 and opened.warmup == 64
    small = from_args(parse(["--url", "http://h:1", "-c", "8", "--sweep", "1,2"]))
    assert [s.rate for s in small.stages] == [1.0, 2.0] and small.warmup == 8


def test_plot_without_matplotlib_exits_2_with_hint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    status, out, err = bench(["--url", "http://127.0.0.1:1", "--plot", str(tmp_path)], capsys)
    assert status == 2
    assert "pip install '.[plot]'" in err
    assert out == ""  # failed before sending anything


def test_plots_are_written(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    status, _, _ = bench(
        ["--url", engine_url, "--sweep", "100,200", "-n", "6", "--max-tokens", "3",
         "--plot", str(tmp_path / "plots"), "--slo-ttft", "1"],
        capsys,
    )  # fmt: skip
    assert status == 0
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == [
        "admission_outcomes.png", "attainment.png", "goodput.png", "latency_over_time.png",
        "latency_throughput.png", "sweep.png", "tpot_itl_cdf.png", "ttft_cdf.png",
    ]  # fmt: skip
    assert all((tmp_path / "plots" / n).read_bytes()[:4] == b"\x89PNG" for n in names)
    status, _, _ = bench(
        ["--url", engine_url, "-n", "3", "--max-tokens", "3", "--plot", str(tmp_path / "one")],
        capsys,
    )  # fmt: skip
    assert status == 0  # one closed-loop stage: no sweep figures
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == ["latency_over_time.png", "tpot_itl_cdf.png", "ttft_cdf.png"]


def test_throughput_figures_are_exact_against_known_token_counts(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The test engine's usage says 5 prompt tokens and sends exactly --max-tokens, one per
    event: every figure follows from the counts and the window of the requests' own times."""
    for flags, from_usage in (([], True), (["--no-stream"], True), (NO_USAGE, False)):
        out_json = tmp_path / "r.json"
        status, out, _ = bench(
            ["--url", engine_url, "-n", "20", "-c", "4", "--max-tokens", "8",
             "--prompt-tokens", "50", "--json", str(out_json), *flags],
            capsys,
        )  # fmt: skip
        assert status == 0, flags
        (stage,) = load(out_json)["stages"]
        s, requests = stage["summary"], stage["requests"]
        window = max(r["start_s"] + r["latency_s"] for r in requests) - min(
            r["start_s"] for r in requests
        )
        assert s["window_s"] == pytest.approx(window)
        input_tokens = 20 * 5 if from_usage else sum(r["prompt_tokens"] for r in requests)
        assert s["input_tokens"] == input_tokens and s["output_tokens"] == 20 * 8, flags
        assert s["input_tokens_from_usage"] == (20 if from_usage else 0)
        assert s["input_tokens_per_s"] == pytest.approx(input_tokens / window)
        assert s["output_tokens_per_s"] == pytest.approx(160 / window)
        assert s["total_tokens_per_s"] == pytest.approx((input_tokens + 160) / window)
        assert s["requests_per_s"] == pytest.approx(20 / window)
        # one gap per token after the first of each streamed reply; none without a stream
        assert s["itl_s"]["count"] == (0 if "--no-stream" in flags else 20 * 7)
        assert f"tokens/s      input {input_tokens / s['window_s']:.1f}, output" in out
        assert f"(input from usage: {20 if from_usage else 0} of 20)" in out


NO_USAGE = ["--extra", '{"stream_options": {"include_usage": false}}']


def test_percentiles_in_the_table_and_the_json(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "r.json"
    status, out, _ = bench(
        ["--url", engine_url, "-n", "10", "-c", "2", "--max-tokens", "4", "--json",
         str(out_json), "--percentiles", "99.9,50,95,50"],
        capsys,
    )  # fmt: skip
    assert status == 0
    assert "(ms)                mean       p50       p95     p99.9" in out
    for row in ("TTFT", "TPOT", "ITL", "E2E latency"):
        cells = next(line for line in out.splitlines() if line.startswith(f"{row:<14}"))
        assert len(cells.split()) - len(row.split()) == 4, row  # mean and three percentiles
    doc = load(out_json)
    assert doc["config"]["percentiles"] == [50, 95, 99.9]  # sorted, once each
    summary = doc["stages"][0]["summary"]
    for key in ("ttft_s", "tpot_s", "itl_s", "latency_s"):
        d = summary[key]
        # the keys of before stay; each percentile asked for adds its own
        assert {"count", "mean", "p50", "p90", "p99", "min", "max", "p95", "p99.9"} <= set(d)
        assert d["min"] <= d["p50"] <= d["p95"] <= d["p99.9"] <= d["max"], key


def test_duration_bounds_starts_and_a_request_in_flight_is_counted(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Closed loop, one worker: its first request starts at once and answers only after
    0.6 s, past --duration 0.2, so no second one starts; the first runs to its end and is
    recorded, counted and part of the window."""
    out_json = tmp_path / "r.json"
    status, out, _ = bench(
        ["--url", engine_url, "-n", "1000", "-c", "1", "--warmup", "0", "--max-tokens", "3",
         "--duration", "0.2", "--extra", '{"test_first_delay": 0.6}', "--json", str(out_json)],
        capsys,
    )  # fmt: skip
    assert status == 0
    assert "requests      1 (ok 1, errors 0)" in out
    (stage,) = load(out_json)["stages"]
    (request,) = stage["requests"]
    assert request["error"] is None and request["output_tokens"] == 3
    assert request["latency_s"] >= 0.6 and request["ttft_s"] >= 0.6
    assert stage["duration_s"] == 0.2 and stage["summary"]["window_s"] >= 0.6


def test_duration_in_an_open_loop_sends_the_arrivals_before_it(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The arrivals are seeded: pick a duration between the second and third, and exactly
    two requests start; both are still in flight at the duration and both are counted."""
    offsets = arrival_offsets(0, 0, 4.0)
    first, second, third = next(offsets), next(offsets), next(offsets)
    assert first == 0.0 and second < third
    duration = (second + third) / 2
    out_json = tmp_path / "r.json"
    status, out, _ = bench(
        ["--url", engine_url, "--rate", "4", "-n", "1000", "--warmup", "0", "--max-tokens", "2",
         "--duration", str(duration), "--extra", f'{{"test_first_delay": {third + 0.5}}}',
         "--json", str(out_json)],
        capsys,
    )  # fmt: skip
    assert status == 0
    (stage,) = load(out_json)["stages"]
    assert stage["issued"] == 2 and len(stage["requests"]) == 2
    assert all(r["error"] is None for r in stage["requests"])
    assert all(
        r["start_s"] + r["latency_s"] - stage["started_s"] > duration for r in stage["requests"]
    )
    assert "requests      2 (ok 2, errors 0)" in out


def test_start_at_holds_the_first_stage_until_its_instant(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A step across processes: the bench is up, warmed, and sends nothing until the
    instant named; its stage's requests all start after it."""
    out_json = tmp_path / "r.json"
    start_at = time.time() + 1.0
    status, _, _ = bench(
        ["--url", engine_url, "-n", "3", "-c", "1", "--warmup", "1", "--max-tokens", "2",
         "--start-at", str(start_at), "--json", str(out_json)],
        capsys,
    )  # fmt: skip
    assert status == 0
    assert time.time() >= start_at
    (stage,) = load(out_json)["stages"]
    assert len(stage["requests"]) == 3 and all(r["error"] is None for r in stage["requests"])


def test_a_start_at_already_past_starts_at_once(
    engine_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    began = time.monotonic()
    status, out, _ = bench(
        ["--url", engine_url, "-n", "2", "-c", "1", "--warmup", "0", "--max-tokens", "2",
         "--start-at", str(time.time() - 60)],
        capsys,
    )  # fmt: skip
    assert status == 0 and "requests      2 (ok 2, errors 0)" in out
    assert time.monotonic() - began < 30


def test_the_health_probe_reports_the_floor_without_counting_as_requests(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "r.json"
    status, out, _ = bench(
        ["--url", engine_url, "-n", "30", "-c", "2", "--max-tokens", "8", "--warmup", "0",
         "--health-probe", "0.005", "--json", str(out_json)],
        capsys,
    )  # fmt: skip
    assert status == 0
    assert "requests      30 (ok 30, errors 0)" in out  # the probes are not the stage's
    (line,) = [line for line in out.splitlines() if line.startswith("GET /health")]
    assert "probes from this client" in line
    (stage,) = load(out_json)["stages"]
    health = stage["summary"]["health_probe_s"]
    assert health["count"] >= 1 and 0 < health["p50"] <= health["p99"] <= health["max"]
    assert len(stage["requests"]) == 30
    # Without the flag: no probe, no line, an empty distribution.
    status, out, _ = bench(
        ["--url", engine_url, "-n", "2", "-c", "1", "--max-tokens", "2", "--warmup", "0",
         "--json", str(out_json)],
        capsys,
    )  # fmt: skip
    assert status == 0 and "GET /health" not in out
    assert load(out_json)["stages"][0]["summary"]["health_probe_s"]["count"] == 0


@pytest.mark.parametrize("every", ["0", "-1", "nan", "61"])
def test_a_health_probe_interval_out_of_range_exits_2(
    every: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = bench(["--url", "http://127.0.0.1:9", "--health-probe", every], capsys)
    assert status == 2 and "--health-probe" in err
