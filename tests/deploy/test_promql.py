"""The PromQL selector reader that the dashboard and alert checks stand on: it must find
every metric an expression reads and nothing that is not one."""

from __future__ import annotations

import pytest

from tests.deploy.promql import PromQLError, Selector, grouping_labels, selectors


def names(expr: str) -> list[str]:
    return [s.name for s in selectors(expr)]


def test_a_bare_name_a_selector_and_a_range() -> None:
    assert selectors("narwhal_engine_up") == [Selector("narwhal_engine_up", (), ())]
    assert selectors('rate(narwhal_outcomes_total{outcome="completed"}[5m])') == [
        Selector("narwhal_outcomes_total", (("outcome", "=", "completed"),), ("rate",))
    ]


def test_every_matcher_operator_and_quoting() -> None:
    (selector,) = selectors("""x{a="1", b!='2', c=~"u|v", d!~`raw\\d`, e="say \\"hi\\"",}""")
    assert selector.matchers == (
        ("a", "=", "1"),
        ("b", "!=", "2"),
        ("c", "=~", "u|v"),
        ("d", "!~", "raw\\d"),
        ("e", "=", 'say "hi"'),
    )


def test_grouping_label_lists_are_not_metrics() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, engine) "
        '(rate(narwhal_ttft_seconds_bucket{engine=~"d0|d1"}[5m])))'
    )
    assert selectors(expr) == [
        Selector(
            "narwhal_ttft_seconds_bucket",
            (("engine", "=~", "d0|d1"),),
            ("histogram_quantile", "sum", "rate"),
        )
    ]
    assert names("sum(rate(a_total[1m])) without (instance, job)") == ["a_total"]
    assert names("SUM BY (engine) (b)") == ["b"]  # keywords are case-insensitive
    assert selectors("count without (engine) (c)")[0].functions == ("count",)


def test_vector_matching_keywords_and_their_label_lists() -> None:
    expr = (
        "narwhal_engine_up == 0 unless on (job, instance, engine) "
        "narwhal_engine_in_maintenance == 1"
    )
    assert names(expr) == ["narwhal_engine_up", "narwhal_engine_in_maintenance"]
    expr = "a * on(instance) group_left(state) b / ignoring(stage) group_right c"
    assert names(expr) == ["a", "b", "c"]
    assert names("a > bool 0 and b or c") == ["a", "b", "c"]


def test_numbers_durations_offsets_and_subqueries_are_not_metrics() -> None:
    assert names("changes(s[15m]) > 4") == ["s"]
    assert names("a offset 1h30m") == ["a"]
    assert names("max_over_time(rate(x_total[1m])[10m:30s]) * 1e-3 + 0x1f - .5") == ["x_total"]
    assert names("a @ end()") == ["a"]
    assert names("-a + inf - NaN") == ["a"]


def test_strings_hold_no_metrics() -> None:
    expr = 'label_replace(up_total, "dst", "fake_metric{", "src", "(.*)")'
    assert selectors(expr) == [Selector("up_total", (), ("label_replace",))]


def test_functions_record_the_innermost_call_last() -> None:
    (selector,) = selectors("sum(increase((x_total)[1h:]))")
    assert selector.functions == ("sum", "increase")  # a grouping parenthesis is no call
    first, second = selectors("rate(a[5m]) / (b)")
    assert first.functions == ("rate",) and second.functions == ()


def test_recorded_series_names_with_colons() -> None:
    assert names("job:narwhal_error_ratio:rate5m > 0.05") == ["job:narwhal_error_ratio:rate5m"]


def test_comments_are_skipped() -> None:
    assert names("a # not_a_metric{\n + b") == ["a", "b"]


@pytest.mark.parametrize(
    "expr",
    [
        '{__name__="narwhal_engine_up"}',  # no name to check
        "rate(x[5m]",
        "x)",
        "x{a=1}",
        'x{a="1"',
        "sum by (engine)",
        'rate(x{engine=~"$engine"}[$__rate_interval])',  # a variable left in
    ],
)
def test_what_it_cannot_read_is_an_error(expr: str) -> None:
    with pytest.raises(PromQLError):
        selectors(expr)


def test_grouping_labels_from_every_kind_of_list() -> None:
    expr = (
        "sum by (job, engine) (a) * on (job) group_left (state) b "
        "/ ignoring (stage) group_right c + sum(d) without (le) and e"
    )
    assert grouping_labels(expr) == {"job", "engine", "state", "stage", "le"}
    assert grouping_labels('a{on="x"} unless group_left') == set()
