"""Reading engine load from /metrics pages (narwhal.fleet.scrape), sans-IO."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from narwhal.fleet.scrape import EngineScrape, parse_engine_metrics
from tests.fleet.exposition import MODEL, SGLANG_PAGE, VLLM_PAGE, vllm_page

L0 = f'{{engine="0",model_name="{MODEL}"}}'
L1 = f'{{engine="1",model_name="{MODEL}"}}'


def test_vllm_page_sums_dp_engines_and_averages_kv_usage() -> None:
    # running 3+2, waiting 4+1 (not the by-reason lines), kv (0.5+0.25)/2
    assert parse_engine_metrics(VLLM_PAGE, "vllm") == EngineScrape(5.0, 5.0, 0.375)


def test_sglang_page() -> None:
    assert parse_engine_metrics(SGLANG_PAGE, "sglang") == EngineScrape(7.0, 2.0, 0.42)


def test_dialect_decides_the_names() -> None:
    assert parse_engine_metrics(SGLANG_PAGE, "vllm") is None
    assert parse_engine_metrics(VLLM_PAGE, "sglang") is None


def test_openai_dialect_reads_either_engines_names() -> None:
    assert parse_engine_metrics(VLLM_PAGE, "openai") == EngineScrape(5.0, 5.0, 0.375)
    assert parse_engine_metrics(SGLANG_PAGE, "openai") == EngineScrape(7.0, 2.0, 0.42)


def test_unknown_dialect_reads_nothing() -> None:
    assert parse_engine_metrics(VLLM_PAGE, "tgi") is None


@pytest.mark.parametrize("text", ["", "\n", "# HELP x y\n# TYPE x gauge\nx 1\n", "not metrics"])
def test_page_without_load_metrics_is_none(text: str) -> None:
    assert parse_engine_metrics(text, "vllm") is None


def test_missing_names_read_as_none() -> None:
    text = f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{L0} 2\n"
    assert parse_engine_metrics(text, "vllm") == EngineScrape(2.0, None, None)


def test_legacy_kv_name_is_a_fallback() -> None:
    legacy = f"vllm:gpu_cache_usage_perc{L0} 0.75\nvllm:num_requests_running{L0} 1\n"
    assert parse_engine_metrics(legacy, "vllm") == EngineScrape(1.0, None, 0.75)


def test_current_kv_name_wins_over_legacy() -> None:
    both = f"vllm:gpu_cache_usage_perc{L0} 0.75\nvllm:kv_cache_usage_perc{L0} 0.5\n"
    assert parse_engine_metrics(both, "vllm") == EngineScrape(None, None, 0.5)


def test_nan_and_infinite_samples_are_ignored() -> None:
    text = (
        f"vllm:num_requests_running{L0} NaN\n"
        f"vllm:num_requests_running{L1} 4\n"
        f"vllm:num_requests_waiting{L0} +Inf\n"
        f"vllm:num_requests_waiting{L1} -Inf\n"
        f"vllm:kv_cache_usage_perc{L0} NaN\n"
    )
    # The names are present, so the page is an engine's; the unusable values are None.
    assert parse_engine_metrics(text, "vllm") == EngineScrape(4.0, None, None)


def test_created_samples_and_longer_names_are_not_confused() -> None:
    text = (
        f"vllm:num_requests_running_created{L0} 1.718e+09\n"
        f"vllm:num_requests_waiting_by_reason{L0} 9\n"
        f"vllm:num_requests_running{L0} 1\n"
        f"xvllm:num_requests_running{L0} 100\n"
        f"# vllm:num_requests_waiting{L0} 100\n"
    )
    assert parse_engine_metrics(text, "vllm") == EngineScrape(1.0, None, None)


def test_first_line_without_newline_before_and_no_newline_at_end() -> None:
    text = f"vllm:num_requests_running{L0} 6\nvllm:num_requests_waiting{L0} 2"
    assert parse_engine_metrics(text, "vllm") == EngineScrape(6.0, 2.0, None)


def test_unlabelled_samples_timestamps_tabs_and_crlf() -> None:
    text = (
        "vllm:num_requests_running 2 1718000000000\r\n"
        "vllm:num_requests_waiting\t3\r\n"
        'vllm:kv_cache_usage_perc{engine="0"} 0.1 1718000000000\r\n'
    )
    assert parse_engine_metrics(text, "vllm") == EngineScrape(2.0, 3.0, 0.1)


def test_label_values_with_braces_and_escaped_quotes() -> None:
    text = (
        'vllm:num_requests_running{model_name="a}b\\"c{",engine="0"} 2\n'
        'vllm:num_requests_running{model_name="x\\\\",engine="1"} 3\n'
    )
    assert parse_engine_metrics(text, "vllm") == EngineScrape(5.0, None, None)


def test_malformed_sample_lines_are_skipped() -> None:
    text = (
        f"vllm:num_requests_running{L0} lots\n"
        f"vllm:num_requests_running{L1}\n"
        f"vllm:num_requests_running{L1} 1\n"
        "vllm:num_requests_waiting{engine=\n"
    )
    assert parse_engine_metrics(text, "vllm") == EngineScrape(1.0, None, None)


def _reference(text: str) -> EngineScrape:
    """The same reading done with prometheus_client's full parser."""
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if math.isfinite(sample.value):
                values.setdefault(sample.name, []).append(sample.value)

    def total(name: str) -> float | None:
        return sum(values[name]) if name in values else None

    kv = values.get("vllm:kv_cache_usage_perc") or values.get("vllm:gpu_cache_usage_perc")
    return EngineScrape(
        total("vllm:num_requests_running"),
        total("vllm:num_requests_waiting"),
        sum(kv) / len(kv) if kv else None,
    )


@pytest.mark.parametrize("dp_engines", [1, 2, 8])
@pytest.mark.parametrize("legacy", [False, True])
def test_full_page_agrees_with_prometheus_client(dp_engines: int, legacy: bool) -> None:
    for seed in range(3):
        text = vllm_page(dp_engines, seed, legacy_kv_name=legacy)
        got = parse_engine_metrics(text, "vllm")
        want = _reference(text)
        assert got is not None
        assert got.running == want.running
        assert got.waiting == want.waiting
        assert got.kv_usage == pytest.approx(want.kv_usage)
