"""Every series the Grafana dashboard and the Prometheus rules read is on a running
router's /metrics, with the labels and label values they select, and each is used as its
type allows (rate over counters, histogram_quantile over buckets).

Some series appear only with a configuration: the models' (`narwhal_engine_profiled`,
`narwhal_engine_backlog_seconds`, ..., `narwhal_ttft_projection_factor`) in predictive
mode, the prefix index's (`narwhal_prefix_*`) with `fleet.policy: cache_aware`, its hit
ratios once a window has traffic, `narwhal_prefill_seconds` with `role: prefill` engines,
and the engines' scraped gauges after a good scrape. So the router here is all of these at
once: predictive, cache_aware, a prefill and a decode `narwhal sim` (real processes over
loopback), and it serves a few requests sharing a long prefix before /metrics is read.
The leader label's series (`narwhal_pod_label_*`, with `ha.kubernetes_label`, which needs
etcd and a pod) are added from the collectors the label registers in the registry the
router hands it; `tests/ha/test_pod_label.py` checks their values.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from narwhal.ha.kubernetes import KubernetesAPI
from narwhal.ha.pod_label import PodLabel, PodMark
from narwhal.ops.state import RouterState
from tests.deploy.deploy_files import (
    Expression,
    LabelValues,
    dashboard_expressions,
    dashboard_label_values,
    recorded_names,
    rule_expressions,
)
from tests.deploy.promql import Selector, grouping_labels, selectors
from tests.e2e.conftest import MODEL, sim_process
from tests.processes import router_process

# Labels Prometheus attaches when it scrapes, so never on /metrics itself.
TARGET_LABELS = frozenset({"job", "instance"})
_COUNTER_FUNCTIONS = frozenset({"rate", "irate", "increase"})
_ALTERNATION = re.compile(r"[\w.:-]+(?:\|[\w.:-]+)*")


@dataclass(frozen=True)
class Exposed:
    """A /metrics page: each sample name's label sets, and which names count up."""

    series: dict[str, list[dict[str, str]]]
    counter_like: frozenset[str]  # counters' _total, histograms' _bucket, _sum, _count


def read_exposition(text: str) -> Exposed:
    series: dict[str, list[dict[str, str]]] = {}
    counter_like: set[str] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series.setdefault(sample.name, []).append(dict(sample.labels))
            if family.type in ("counter", "histogram"):
                counter_like.add(sample.name)
    return Exposed(series, frozenset(counter_like))


def selector_problems(selector: Selector, exposed: Exposed) -> list[str]:
    """What is wrong with reading `selector` from `exposed` (nothing: [])."""
    samples = exposed.series.get(selector.name)
    if not samples:
        return [f"{selector.name} is not on /metrics"]
    problems: list[str] = []
    matchers = [m for m in selector.matchers if m[0] not in TARGET_LABELS]
    for label, op, value in matchers:
        if not any(label in s for s in samples):
            problems.append(f"{selector.name} has no label {label}")
        elif op == "=~" and _ALTERNATION.fullmatch(value):
            for alternative in value.split("|"):
                if not any(s.get(label) == alternative for s in samples):
                    problems.append(f'{selector.name} has no {label}="{alternative}"')
    if not problems and not any(_selects(matchers, s) for s in samples):
        shown = ", ".join(f'{label}{op}"{value}"' for label, op, value in matchers)
        problems.append(f"{selector.name}{{{shown}}} selects no series")
    innermost = selector.functions[-1] if selector.functions else None
    if innermost in _COUNTER_FUNCTIONS and selector.name not in exposed.counter_like:
        problems.append(f"{innermost}() over {selector.name}, which is no counter")
    if "histogram_quantile" in selector.functions and not selector.name.endswith("_bucket"):
        problems.append(f"histogram_quantile over {selector.name}, not a _bucket series")
    return problems


def _selects(matchers: Iterable[tuple[str, str, str]], labels: dict[str, str]) -> bool:
    for label, op, value in matchers:
        actual = labels.get(label, "")
        matched = actual == value if op in ("=", "!=") else re.fullmatch(value, actual) is not None
        if matched != (op in ("=", "=~")):
            return False
    return True


def expression_problems(
    expression: Expression, exposed: Exposed, recorded: frozenset[str] = frozenset()
) -> list[str]:
    problems: list[str] = []
    labels = set(TARGET_LABELS)
    for selector in selectors(expression.expr):
        if selector.name in recorded:
            continue
        problems += selector_problems(selector, exposed)
        for sample in exposed.series.get(selector.name, []):
            labels.update(sample)
    for label in sorted(grouping_labels(expression.expr) - labels):
        problems.append(f"groups by {label}, which none of its series has")
    return [f"{expression.where}: {p}" for p in problems]


def label_values_problems(variable: LabelValues, exposed: Exposed) -> list[str]:
    (selector,) = selectors(variable.selector)
    problems = selector_problems(selector, exposed)
    samples = exposed.series.get(selector.name, [])
    if variable.label not in TARGET_LABELS and not any(variable.label in s for s in samples):
        problems.append(f"{selector.name} has no label {variable.label}")
    return [f"{variable.where}: {p}" for p in problems]


def used_names() -> set[str]:
    exprs = [e.expr for e in dashboard_expressions() + rule_expressions()]
    exprs += [v.selector for v in dashboard_label_values()]
    return {s.name for expr in exprs for s in selectors(expr)} - recorded_names()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def _chat(url: str, question: str) -> int:
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You answer questions about tides. " * 80},
            {"role": "user", "content": question},
        ],
        "max_tokens": 4,
    }
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(response.status)


@pytest.fixture(scope="module")
def exposed() -> Iterator[Exposed]:
    """/metrics of a router with every series present (see the module's docstring)."""
    with ExitStack() as stack:
        prefill = stack.enter_context(sim_process("--role", "prefill", "--time-scale", "0.05"))
        decode = stack.enter_context(sim_process("--role", "decode", "--time-scale", "0.05"))
        config = {
            "model": MODEL,
            "engines": [
                {"name": "p0", "url": prefill.url, "role": "prefill"},
                {"name": "d0", "url": decode.url, "role": "decode"},
            ],
            "admission": {"mode": "predictive", "ttft_target_s": 5},
            "fleet": {"policy": "cache_aware", "probe_interval_s": 0.2},
        }
        router = stack.enter_context(router_process(config))
        for n in range(8):
            assert _chat(router.url, f"Question {n}?") == 200
        # The hit ratios appear once the engines' counters have been scraped after the
        # traffic; wait for every series the files use, for a while, then report what is
        # still missing through the tests' own assertions.
        wanted = used_names()
        deadline = time.monotonic() + 20
        while True:
            page = read_exposition(_get(router.url + "/metrics"))
            if wanted <= page.series.keys() or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        pod_label = read_exposition(generate_latest(pod_label_registry()).decode())
        page.series.update(pod_label.series)
        yield Exposed(page.series, page.counter_like | pod_label.counter_like)


def pod_label_registry() -> CollectorRegistry:
    """A registry with what the leader label registers, as `Router._pod_label` builds it
    (never started: no call reaches the API)."""
    registry = CollectorRegistry()
    api = KubernetesAPI("http://127.0.0.1:9", "narwhal", Path("/nonexistent"), None)
    PodLabel(RouterState(registry), api, "pod", PodMark("narwhal.io/leader", "true"), registry)
    return registry


def test_every_series_the_dashboard_queries_is_on_a_router(exposed: Exposed) -> None:
    problems = [p for e in dashboard_expressions() for p in expression_problems(e, exposed)]
    problems += [p for v in dashboard_label_values() for p in label_values_problems(v, exposed)]
    assert not problems, "\n".join(problems)


def test_every_series_the_rules_read_is_on_a_router_or_recorded(exposed: Exposed) -> None:
    recorded = frozenset(recorded_names())
    problems = [p for e in rule_expressions() for p in expression_problems(e, exposed, recorded)]
    assert not problems, "\n".join(problems)


def test_alerts_read_only_recorded_series_the_file_defines() -> None:
    used = {s.name for e in rule_expressions() for s in selectors(e.expr) if ":" in s.name}
    assert used <= recorded_names()


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("rate(narwhal_offered[5m])", "narwhal_offered is not on /metrics"),
        ('narwhal_outcomes_total{outcome="upstream_errors"}', "selects no series"),
        (
            'narwhal_outcomes_total{outcome=~"upstream_error|internal_errors"}',
            'no outcome="internal_errors"',
        ),
        ('narwhal_engine_up{enigne="d0"}', "has no label enigne"),
        ("rate(narwhal_engine_up[5m])", "rate() over narwhal_engine_up, which is no counter"),
        (
            "histogram_quantile(0.9, rate(narwhal_ttft_seconds_count[5m]))",
            "not a _bucket series",
        ),
        ("sum by (engien) (narwhal_engine_up)", "groups by engien"),
    ],
)
def test_the_check_finds_what_a_router_would_not_answer(
    exposed: Exposed, expr: str, problem: str
) -> None:
    (found,) = expression_problems(Expression("test", expr), exposed)
    assert problem in found
