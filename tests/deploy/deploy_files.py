"""The PromQL that deploy/ holds: the Grafana dashboard's queries and the Prometheus rules'
expressions, with where each comes from, ready for tests/deploy/promql.py."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "narwhal.json"
RULES = ROOT / "deploy" / "prometheus" / "narwhal-alerts.yaml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "narwhal-alerts.test.yaml"
GENERATOR = ROOT / "scripts" / "grafana_dashboard.py"
PROMETHEUS_RULE = ROOT / "deploy" / "kubernetes" / "prometheusrule.yaml"
RULE_GENERATOR = ROOT / "scripts" / "prometheus_rule.py"

# What Grafana puts in place of its variables before a query reaches Prometheus: a window
# for the interval, and the "All" value (`.*`) for each selector variable.
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$job": ".*",
    "$instance": ".*",
    "$engine": ".*",
}
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")


@dataclass(frozen=True)
class Expression:
    where: str  # "panel 'TTFT' query A", "rule NarwhalEngineDown"
    expr: str


@dataclass(frozen=True)
class LabelValues:
    """A template variable's `label_values(selector, label)`."""

    where: str
    selector: str
    label: str


def load_dashboard() -> dict[str, Any]:
    result: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return result


def load_rules() -> dict[str, Any]:
    result: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return result


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows' collapsed panels included, rows themselves not."""
    found: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def substitute(query: str) -> str:
    """`query` as Grafana sends it, every variable replaced (an unknown one is an error)."""
    for variable, value in GRAFANA_VARIABLES.items():
        query = query.replace(variable, value)
    if "$" in query:
        raise ValueError(f"a Grafana variable this check does not know in {query!r}")
    return query


def dashboard_expressions() -> list[Expression]:
    return [
        Expression(f"panel {panel['title']!r} query {target['refId']}", substitute(target["expr"]))
        for panel in panels(load_dashboard())
        for target in panel["targets"]
    ]


def dashboard_label_values() -> list[LabelValues]:
    found: list[LabelValues] = []
    for variable in load_dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = _LABEL_VALUES.match(variable["query"])
        if match is None:
            raise ValueError(f"variable {variable['name']}: not label_values(...)")
        found.append(
            LabelValues(
                f"variable {variable['name']}",
                substitute(match.group("selector")),
                match.group("label"),
            )
        )
    return found


def rules() -> list[dict[str, Any]]:
    return [rule for group in load_rules()["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def recorded_names() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def rule_expressions() -> list[Expression]:
    return [
        Expression(f"rule {rule.get('alert') or rule['record']}", rule["expr"]) for rule in rules()
    ]


def generator() -> ModuleType:
    """scripts/grafana_dashboard.py, imported as running it would."""
    return _script(GENERATOR)


def rule_generator() -> ModuleType:
    """scripts/prometheus_rule.py, imported as running it would."""
    return _script(RULE_GENERATOR)


def _script(path: Path) -> ModuleType:
    """A script of scripts/, imported as running it would: scripts/ is not a package, and
    a script may import its siblings (grafana_dashboard imports grafana_panels), so
    scripts/ is on the path only while it runs, so that nothing else there shadows a
    module."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it runs
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module
