"""Build the Prometheus Operator's copy of Narwhal's rules, deploy/kubernetes/prometheusrule.yaml.

    python scripts/prometheus_rule.py           # write the file
    python scripts/prometheus_rule.py --check   # exit 1 if the file is not what this builds

The rules are written once, in deploy/prometheus/narwhal-alerts.yaml, where promtool
checks them and runs their unit tests; the PrometheusRule carries the same groups for a
cluster whose Prometheus the operator runs. Built rather than copied by hand, so that the
two cannot drift: tests/deploy checks that the checked-in file is this script's output.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from generated_file import write_or_check

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "narwhal-alerts.yaml"
OUTPUT = ROOT / "deploy" / "kubernetes" / "prometheusrule.yaml"

HEADER = """\
# Narwhal's recording and alerting rules for the Prometheus Operator (the
# monitoring.coreos.com CRDs): the groups of deploy/prometheus/narwhal-alerts.yaml, whose
# comments say what each rule is for. Built by scripts/prometheus_rule.py: edit that file
# and run the script, never this one.
#
# Not in kustomization.yaml: a cluster without the operator's CRDs refuses the kind, and
# the whole `kubectl apply -k` with it. Apply it on its own (README.md). The operator
# loads only the PrometheusRules its Prometheus's ruleSelector matches: add the label it
# selects (kube-prometheus-stack: `release: <its release name>`) to metadata.labels.
"""


class _Dumper(yaml.SafeDumper):
    """The source file's layout: lists indented under their key, PromQL as literal blocks,
    descriptions folded, summaries quoted (their templates start with braces)."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)

    def write_double_quoted(self, text: str, split: bool = True) -> None:
        # A summary on one line, as in the source: a break would be an escaped "\ ".
        super().write_double_quoted(text, split=False)


class _Folded(str):
    pass


class _Quoted(str):
    pass


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _styled(style: str) -> Any:
    def represent(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        return dumper.represent_scalar("tag:yaml.org,2002:str", str(value), style=style)

    return represent


_Dumper.add_representer(str, _string)
_Dumper.add_representer(_Folded, _styled(">"))
_Dumper.add_representer(_Quoted, _styled('"'))


def _annotated(rule: dict[str, Any]) -> dict[str, Any]:
    annotations = rule.get("annotations")
    if annotations is None:
        return rule
    styled = {"summary": _Quoted, "description": _Folded}
    return {
        **rule,
        "annotations": {k: styled.get(k, str)(v) for k, v in annotations.items()},
    }


def prometheus_rule() -> dict[str, Any]:
    groups = [
        {**group, "rules": [_annotated(rule) for rule in group["rules"]]}
        for group in yaml.safe_load(RULES.read_text())["groups"]
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "narwhal",
            "labels": {
                "app.kubernetes.io/name": "narwhal",
                "app.kubernetes.io/component": "router",
            },
        },
        "spec": {"groups": groups},
    }


def rendered() -> str:
    body = yaml.dump(
        prometheus_rule(), Dumper=_Dumper, sort_keys=False, width=88, allow_unicode=True
    )
    return HEADER + body


def main() -> int:
    return write_or_check(OUTPUT, rendered(), script=__file__, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
