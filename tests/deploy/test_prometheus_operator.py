"""deploy/kubernetes's objects for the Prometheus Operator, which kubernetes-validate has
no schemas for: the ServiceMonitor scrapes every router's /metrics through the headless
Service of the routers (standbys included), the
pods' scrape annotations say the same, and the PrometheusRule carries exactly the groups
of deploy/prometheus/narwhal-alerts.yaml (which promtool checks), as
scripts/prometheus_rule.py builds it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.deploy_files import PROMETHEUS_RULE, load_rules, rule_generator
from tests.deploy.test_kubernetes import DEPLOY, _resource, _router_container

SERVICE_MONITOR = DEPLOY / "servicemonitor.yaml"


def _only(path: Path, kind: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["kind"] == kind
    assert doc["metadata"]["name"] == "narwhal"
    assert "namespace" not in doc["metadata"]  # like the others: applied with -n
    return dict(doc)


def test_the_service_monitor_scrapes_metrics_on_the_services_port() -> None:
    monitor = _only(SERVICE_MONITOR, "ServiceMonitor")
    # Every router, through the headless Service: the clients' Service selects the leader
    # alone (its leader label), and the alerts need the standbys' state as well.
    service = _resource("Service", "narwhal-routers")
    spec = monitor["spec"]
    # A ServiceMonitor selects Services by their own labels, not their pods'.
    assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    clients = _resource("Service", "narwhal")["metadata"]["labels"]
    assert not spec["selector"]["matchLabels"].items() <= clients.items()
    assert set(spec) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    # The job the rules group a fleet by is `narwhal`, the clients' Service's name.
    assert service["metadata"]["labels"][spec["jobLabel"]] == "narwhal"
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert re.fullmatch(r"\d+s", endpoint["interval"])
    assert re.fullmatch(r"\d+s", endpoint["scrapeTimeout"])
    assert int(endpoint["scrapeTimeout"][:-1]) < int(endpoint["interval"][:-1])
    for relabeling in endpoint.get("relabelings", []):
        assert all(label.startswith("__meta_kubernetes_") for label in relabeling["sourceLabels"])


def test_the_scrape_annotations_name_the_serving_port_and_metrics() -> None:
    template = _resource("Deployment", "narwhal")["spec"]["template"]["metadata"]
    annotations = template["annotations"]
    ports = {p["name"]: p["containerPort"] for p in _router_container()["ports"]}
    monitor = _only(SERVICE_MONITOR, "ServiceMonitor")["spec"]["endpoints"][0]
    service_ports = {
        p["name"]: p["targetPort"] for p in _resource("Service", "narwhal-routers")["spec"]["ports"]
    }
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(ports[service_ports[monitor["port"]]])
    assert annotations["prometheus.io/path"] == monitor["path"]


def test_the_checked_in_prometheus_rule_is_what_the_script_builds() -> None:
    assert PROMETHEUS_RULE.read_text() == rule_generator().rendered(), (
        "run python scripts/prometheus_rule.py"
    )


def test_the_prometheus_rule_carries_exactly_the_rule_files_groups() -> None:
    rule = _only(PROMETHEUS_RULE, "PrometheusRule")
    assert set(rule["spec"]) == {"groups"}
    assert rule["spec"]["groups"] == load_rules()["groups"]
    assert (
        rule["metadata"]["labels"].items()
        <= _resource("Service", "narwhal")["metadata"]["labels"].items()
    )


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_listing_them_in_the_kustomization_renders_them(tmp_path: Path) -> None:
    # As kustomization.yaml's comment says to where the cluster has the operator's CRDs.
    copy = tmp_path / "kubernetes"
    shutil.copytree(DEPLOY, copy)
    kustomization = copy / "kustomization.yaml"
    text = kustomization.read_text()
    for name in ("servicemonitor.yaml", "prometheusrule.yaml"):
        text, found = re.subn(rf"^  # - {re.escape(name)}\b", f"  - {name}", text, flags=re.M)
        assert found == 1, name
    kustomization.write_text(text)
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    kinds = {doc["kind"] for doc in yaml.safe_load_all(rendered) if doc}
    assert {"ServiceMonitor", "PrometheusRule", "Deployment", "Service"} <= kinds
