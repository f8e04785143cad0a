"""Reading engine load from /metrics pages (narwhal.fleet.scrape), sans-IO."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from narwhal.fleet.scrape import EngineScrape, parse_engine_metrics
from narwhal.protocol.dialects import capabilities
from tests.fleet.exposition import (
    CACHE_CONFIG,
    MODEL,
    SGLANG_PAGE,
    VLLM_CACHE_PAGE,
    VLLM_PAGE,
    vllm_page,
)

L0 = f'{{engine="0",model_name="{MODEL}"}}'
L1 = f'{{engine="1",model_name="{MODEL}"}}'


def test_vllm_page_sums_dp_engines_and_averages_kv_usage() -> None:
    # running 3+2, waiting 4+1 (not the by-reason lines), kv (0.5+0.25)/2
    assert parse_engine_metrics(VLLM_PAGE, ("vllm",)) == EngineScrape(5.0, 5.0, 0.375)


def test_sglang_page() -> None:
    assert parse_engine_metrics(SGLANG_PAGE, ("sglang",)) == EngineScrape(7.0, 2.0, 0.42)


def test_dialect_decides_the_names() -> None:
    assert parse_engine_metrics(SGLANG_PAGE, ("vllm",)) is None
    assert parse_engine_metrics(VLLM_PAGE, ("sglang",)) is None


def test_openai_dialect_reads_either_engines_names() -> None:
    assert parse_engine_metrics(VLLM_PAGE, capabilities("openai").metrics_vendors) == EngineScrape(
        5.0, 5.0, 0.375
    )
    assert parse_engine_metrics(
        SGLANG_PAGE, capabilities("openai").metrics_vendors
    ) == EngineScrape(7.0, 2.0, 0.42)


def test_no_vendor_reads_nothing() -> None:
    assert parse_engine_metrics(VLLM_PAGE, ()) is None


@pytest.mark.parametrize("text", ["", "\n", "# HELP x y\n# TYPE x gauge\nx 1\n", "not metrics"])
def test_page_without_load_metrics_is_none(text: str) -> None:
    assert parse_engine_metrics(text, ("vllm",)) is None


def test_missing_names_read_as_none() -> None:
    text = f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{L0} 2\n"
    assert parse_engine_metrics(text, ("vllm",)) == EngineScrape(2.0, None, None)


def test_legacy_kv_name_is_a_fallback() -> None:
    legacy = f"vllm:gpu_cache_usage_perc{L0} 0.75\nvllm:num_requests_running{L0} 1\n"
    assert parse_engine_metrics(legacy, ("vllm",)) == EngineScrape(1.0, None, 0.75)


def test_current_kv_name_wins_over_legacy() -> None:
    both = f"vllm:gpu_cache_usage_perc{L0} 0.75\nvllm:kv_cache_usage_perc{L0} 0.5\n"
    assert parse_engine_metrics(both, ("vllm",)) == EngineScrape(None, None, 0.5)


def test_nan_and_infinite_samples_are_ignored() -> None:
    text = (
        f"vllm:num_requests_running{L0} NaN\n"
        f"vllm:num_requests_running{L1} 4\n"
        f"vllm:num_requests_waiting{L0} +Inf\n"
        f"vllm:num_requests_waiting{L1} -Inf\n"
        f"vllm:kv_cache_usage_perc{L0} NaN\n"
    )
    # The names are present, so the page is an engine's; the unusable values are None.
    assert parse_engine_metrics(text, ("vllm",)) == EngineScrape(4.0, None, None)


def test_created_samples_and_longer_names_are_not_confused() -> None:
    text = (
        f"vllm:num_requests_running_created{L0} 1.718e+09\n"
        f"vllm:num_requests_waiting_by_reason{L0} 9\n"
        f"vllm:num_requests_running{L0} 1\n"
        f"xvllm:num_requests_running{L0} 100\n"
        f"# vllm:num_requests_waiting{L0} 100\n"
    )
    assert parse_engine_metrics(text, ("vllm",)) == EngineScrape(1.0, None, None)


def test_first_line_without_newline_before_and_no_newline_at_end() -> None:
    text = f"vllm:num_requests_running{L0} 6\nvllm:num_requests_waiting{L0} 2"
    assert parse_engine_metrics(text, ("vllm",)) == EngineScrape(6.0, 2.0, None)


def test_unlabelled_samples_timestamps_tabs_and_crlf() -> None:
    text = (
        "vllm:num_requests_running 2 1718000000000\r\n"
        "vllm:num_requests_waiting\t3\r\n"
        'vllm:kv_cache_usage_perc{engine="0"} 0.1 1718000000000\r\n'
    )
    assert parse_engine_metrics(text, ("vllm",)) == EngineScrape(2.0, 3.0, 0.1)


def test_label_values_with_braces_and_escaped_quotes() -> None:
    text = (
        'vllm:num_requests_running{model_name="a}b\\"c{",engine="0"} 2\n'
        'vllm:num_requests_running{model_name="x\\\\",engine="1"} 3\n'
    )
    assert parse_engine_metrics(text, ("vllm",)) == EngineScrape(5.0, None, None)


def test_malformed_sample_lines_are_skipped() -> None:
    text = (
        f"vllm:num_requests_running{L0} lots\n"
        f"vllm:num_requests_running{L1}\n"
        f"vllm:num_requests_running{L1} 1\n"
        "vllm:num_requests_waiting{engine=\n"
    )
    assert parse_engine_metrics(text, ("vllm",)) == EngineScrape(1.0, None, None)


def test_prefix_cache_counters_and_cache_config() -> None:
    # Counters summed over DP engines; num_gpu_blocks repeated on each line, read once.
    assert parse_engine_metrics(VLLM_CACHE_PAGE, ("vllm",)) == EngineScrape(
        5.0, 5.0, 0.375, prefix_cache_queries=8000.0, prefix_cache_hits=3072.0,
        block_size=16, num_gpu_blocks=58000, prefix_caching=True,
    )  # fmt: skip


def test_prefix_caching_turned_off_is_read_from_the_cache_config() -> None:
    # vLLM --no-enable-prefix-caching: nothing is a hit there, whatever the router sent.
    text = (
        f"vllm:num_requests_running{L0} 0\n"
        'vllm:cache_config_info{block_size="16",enable_prefix_caching="False",engine="0",'
        'num_gpu_blocks="100"} 1.0\n'
    )
    scrape = parse_engine_metrics(text, ("vllm",))
    assert scrape is not None and scrape.prefix_caching is False


def test_prefix_cache_fields_are_none_when_absent() -> None:
    # An older vLLM, or an engine with its stats logging off: load only.
    scrape = parse_engine_metrics(VLLM_PAGE, ("vllm",))
    assert scrape is not None
    assert (scrape.prefix_cache_queries, scrape.prefix_cache_hits) == (None, None)
    assert (scrape.block_size, scrape.num_gpu_blocks) == (None, None)
    # SGLang has no such series (its radix cache reports a hit rate, not these).
    sglang = parse_engine_metrics(SGLANG_PAGE, ("sglang",))
    assert sglang is not None and sglang.prefix_cache_queries is None
    assert sglang.block_size is None and sglang.num_gpu_blocks is None


def test_cache_config_before_the_cache_is_sized() -> None:
    # vLLM writes str(None) until profiling has set num_gpu_blocks.
    text = (
        f"vllm:num_requests_running{L0} 0\n"
        'vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="None"} 1.0\n'
    )
    scrape = parse_engine_metrics(text, ("vllm",))
    assert scrape is not None and (scrape.block_size, scrape.num_gpu_blocks) == (32, None)


def test_legacy_prefix_cache_names_are_a_fallback() -> None:
    legacy = (
        f"vllm:num_requests_running{L0} 1\n"
        f"vllm:gpu_prefix_cache_queries_total{L0} 300\n"
        f"vllm:gpu_prefix_cache_hits_total{L0} 100\n"
    )
    scrape = parse_engine_metrics(legacy, ("vllm",))
    assert scrape is not None
    assert (scrape.prefix_cache_queries, scrape.prefix_cache_hits) == (300.0, 100.0)
    # Both names on one page (vLLM 0.9-0.10): the current one is read, not the sum.
    both = (
        f"{legacy}vllm:prefix_cache_queries_total{L0} 310\nvllm:prefix_cache_hits_total{L0} 110\n"
    )
    scrape = parse_engine_metrics(both, ("vllm",))
    assert scrape is not None
    assert (scrape.prefix_cache_queries, scrape.prefix_cache_hits) == (310.0, 110.0)


def test_cache_config_labels_in_any_order_with_escapes_and_lookalikes() -> None:
    text = (
        f"vllm:num_requests_running{L0} 1\n"
        # A lookalike label name before the real one, and a value with `"`, `}` and `,`.
        'vllm:cache_config_info{num_gpu_blocks_override="7",note="a\\"},b=\\\\",'
        'num_gpu_blocks="4096",engine="0",block_size="64",} 1.0\n'
        'vllm:cache_config_info_created{block_size="8"} 1.7e9\n'
    )
    scrape = parse_engine_metrics(text, ("vllm",))
    assert scrape is not None and (scrape.block_size, scrape.num_gpu_blocks) == (64, 4096)


@pytest.mark.parametrize(
    "line",
    [
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="12} 1.0',  # unterminated
        "vllm:cache_config_info{block_size=16,num_gpu_blocks=12} 1.0",  # unquoted
        'vllm:cache_config_info{block_size="sixteen",num_gpu_blocks="-3"} 1.0',  # not counts
        'vllm:cache_config_info{block_size="0",num_gpu_blocks=""} 1.0',
    ],
)
def test_malformed_cache_config_reads_as_none(line: str) -> None:
    scrape = parse_engine_metrics(f"vllm:num_requests_running{L0} 1\n{line}\n", ("vllm",))
    assert scrape is not None and (scrape.block_size, scrape.num_gpu_blocks) == (None, None)


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
    info = [
        sample.labels
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vllm:cache_config_info"
    ]
    return EngineScrape(
        total("vllm:num_requests_running"),
        total("vllm:num_requests_waiting"),
        sum(kv) / len(kv) if kv else None,
        prefix_cache_queries=total("vllm:prefix_cache_queries_total"),
        prefix_cache_hits=total("vllm:prefix_cache_hits_total"),
        block_size=int(info[0]["block_size"]) if info else None,
        num_gpu_blocks=int(info[0]["num_gpu_blocks"]) if info else None,
    )


@pytest.mark.parametrize("dp_engines", [1, 2, 8])
@pytest.mark.parametrize("legacy", [False, True])
def test_full_page_agrees_with_prometheus_client(dp_engines: int, legacy: bool) -> None:
    for seed in range(3):
        text = vllm_page(dp_engines, seed, legacy_kv_name=legacy)
        got = parse_engine_metrics(text, ("vllm",))
        want = _reference(text)
        assert got is not None
        assert got.running == want.running
        assert got.waiting == want.waiting
        assert got.kv_usage == pytest.approx(want.kv_usage)
        assert got.prefix_cache_queries == want.prefix_cache_queries
        assert got.prefix_cache_hits == want.prefix_cache_hits
        assert (got.block_size, got.num_gpu_blocks) == (want.block_size, want.num_gpu_blocks)
        assert str(got.num_gpu_blocks) == CACHE_CONFIG["num_gpu_blocks"]
