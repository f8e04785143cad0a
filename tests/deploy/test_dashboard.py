"""deploy/grafana/narwhal.json: what scripts/grafana_dashboard.py builds, importable into
Grafana as it is (a data source variable, no fixed data source uid), laid out on
Grafana's grid, and showing what an operator needs."""

from __future__ import annotations

import json
from typing import Any

from tests.deploy.deploy_files import (
    DASHBOARD,
    dashboard_expressions,
    generator,
    load_dashboard,
    panels,
)
from tests.deploy.promql import selectors

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def test_the_checked_in_dashboard_is_what_the_script_builds() -> None:
    assert DASHBOARD.read_text() == generator().rendered(), (
        "run python scripts/grafana_dashboard.py"
    )


def variables() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in load_dashboard()["templating"]["list"]}


def test_it_has_a_prometheus_data_source_variable_and_selectors() -> None:
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] and dashboard["title"]
    found = variables()
    assert found["datasource"]["type"] == "datasource"
    assert found["datasource"]["query"] == "prometheus"
    assert found["engine"]["query"].startswith("label_values(narwhal_engine_up")
    assert found["engine"]["query"].endswith(", engine)")
    for name in ("job", "instance", "engine"):
        assert found[name]["datasource"] == DATASOURCE
    # Multi-valued selectors go to regex matchers, "All" as .*.
    for name in ("instance", "engine"):
        assert found[name]["multi"] and found[name]["allValue"] == ".*"


def test_every_panel_and_query_uses_the_data_source_variable() -> None:
    for panel in panels(load_dashboard()):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids), panel["title"]


def test_every_query_selects_the_chosen_routers() -> None:
    raw = [t["expr"] for p in panels(load_dashboard()) for t in p["targets"]]
    for expr in raw:
        for selector in selectors(expr.replace("$__rate_interval", "5m")):
            matchers = {(label, op, value) for label, op, value in selector.matchers}
            assert ("job", "=~", "$job") in matchers, expr
            assert ("instance", "=~", "$instance") in matchers, expr
            if any(label == "engine" for label, _, _ in matchers):
                assert ("engine", "=~", "$engine") in matchers, expr


def test_panels_have_unique_ids_and_do_not_overlap_on_the_grid() -> None:
    everything = load_dashboard()["panels"]
    ids = [p["id"] for p in everything]
    assert len(set(ids)) == len(ids)
    taken: set[tuple[int, int]] = set()
    for panel in everything:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_it_shows_what_an_operator_watches() -> None:
    used = {s.name for e in dashboard_expressions() for s in selectors(e.expr)}
    for name in (
        "narwhal_offered_total",  # traffic
        "narwhal_outcomes_total",  # outcomes
        "narwhal_request_duration_seconds_bucket",
        "narwhal_refused_total",  # refusals and rejections by reason
        "narwhal_rejected_total",
        "narwhal_ttft_seconds_bucket",  # latency per engine
        "narwhal_tpot_seconds_bucket",
        "narwhal_engine_up",  # engine health and eligibility
        "narwhal_engine_eligible",
        "narwhal_engine_drained",
        "narwhal_engine_in_maintenance",
        "narwhal_engine_scrape_age_seconds",
        "narwhal_admission_queue_depth",  # admission queue and slots
        "narwhal_prefill_slots_in_use",
        "narwhal_decode_slots_in_use",
        "narwhal_prefix_predicted_hit_ratio",  # prefix cache
        "narwhal_prefix_engine_hit_ratio",
        "process_cpu_seconds_total",  # the router process
        "process_resident_memory_bytes",
        "narwhal_event_loop_lag_seconds_bucket",
        "narwhal_event_loop_tasks",
        "narwhal_router_state",
        "narwhal_router_leadership_revision",
    ):
        assert name in used, name


def test_the_file_is_plain_json_grafana_can_import() -> None:
    # No exported-dashboard inputs to fill in: the data source is chosen in the variable.
    dashboard = json.loads(DASHBOARD.read_text())
    assert "__inputs" not in dashboard and "id" not in dashboard
