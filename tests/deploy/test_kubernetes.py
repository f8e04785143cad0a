"""deploy/kubernetes: valid Kubernetes objects, and a Narwhal configuration that works there.

The manifests are checked against Kubernetes' own schemas by `kubernetes-validate` (the
schemas ship in the package; nothing is downloaded), strictly, so a misspelt field fails.
The ConfigMap's narwhal.yaml is checked by `narwhal check-config` with the secrets the
Deployment passes in, and started as a router where nothing it names resolves, as a pod
does before the engines, etcd and the Kubernetes API answer. What ties the files together
is checked too: probes, ports, selectors, the grace period against the shutdown timings,
etcd's members, and the leader label (the key the routers set, the Service's selector,
the ServiceAccount allowed to patch pods, the pod name from the downward API).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
import yaml

from tests.processes import narwhal_process

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
# The Prometheus Operator's kinds (monitoring.coreos.com): kubernetes-validate has no
# schema for them and kustomization.yaml leaves them out, so
# tests/deploy/test_prometheus_operator.py checks them instead.
OPERATOR_MANIFESTS = (DEPLOY / "servicemonitor.yaml", DEPLOY / "prometheusrule.yaml")
MANIFESTS = sorted(
    p
    for p in DEPLOY.glob("*.yaml")
    if p.name != "kustomization.yaml" and p not in OPERATOR_MANIFESTS
)
# The oldest Kubernetes the manifests claim, and the newest the package bundles schemas of.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
# What the downward API gives the router as its pod's name (metadata.name) in these tests.
POD_NAME = "narwhal-5d8f7c9b4-abcde"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _resource(kind: str, name: str) -> dict[str, Any]:
    found = [
        doc
        for path in MANIFESTS
        for doc in _documents(path)
        if doc["kind"] == kind and doc["metadata"]["name"] == name
    ]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def _router_container() -> dict[str, Any]:
    containers = _resource("Deployment", "narwhal")["spec"]["template"]["spec"]["containers"]
    (container,) = (c for c in containers if c["name"] == "narwhal")
    return dict(container)


def _kubernetes_validate(version: str, *paths: Path) -> list[str]:
    """kubernetes-validate's report on `paths`, one line a resource, every one passed."""
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", version]
        + [str(p) for p in paths],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    # An unknown kind or apiVersion is only a WARN, with exit status 0: it fails here.
    assert [line for line in lines if not line.startswith("INFO ")] == []
    return lines


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_a_valid_kubernetes_object(version: str) -> None:
    passed = [line for line in _kubernetes_validate(version, *MANIFESTS) if " passed for " in line]
    assert len(passed) == sum(len(_documents(p)) for p in MANIFESTS)


def test_only_the_operators_manifests_are_left_to_other_checks() -> None:
    # A new file of a core kind would otherwise escape kubernetes-validate.
    for path in OPERATOR_MANIFESTS:
        for doc in _documents(path):
            assert doc["apiVersion"] == "monitoring.coreos.com/v1", path.name
    for path in MANIFESTS:
        for doc in _documents(path):
            assert not doc["apiVersion"].startswith("monitoring.coreos.com/"), path.name


def test_kustomization_applies_every_manifest_but_the_examples() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    applied = {p.name for p in MANIFESTS if not p.name.endswith(".example.yaml")}
    assert sorted(kustomization["resources"]) == sorted(applied)
    images = {image["name"] for image in kustomization["images"]}
    assert _router_container()["image"].split(":")[0] in images


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_kustomization_renders_the_applied_manifests(tmp_path: Path) -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    expected = [
        (doc["kind"], doc["metadata"]["name"])
        for name in kustomization["resources"]
        for doc in _documents(DEPLOY / name)
    ]
    objects = [doc for doc in yaml.safe_load_all(rendered) if doc]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objects) == sorted(expected)
    output = tmp_path / "rendered.yaml"
    output.write_text(rendered)
    assert len(_kubernetes_validate(KUBERNETES_VERSIONS[0], output)) == len(objects)


@dataclass
class PodConfig:
    """The ConfigMap's narwhal.yaml as the router reads it in the pod: the environment
    variables the Deployment sets from the Secret, and its mounted files (here under a
    temporary directory in place of the mount path)."""

    path: Path
    env: dict[str, str]


@pytest.fixture
def pod_config(tmp_path: Path) -> PodConfig:
    secret = _resource("Secret", "narwhal-secrets")["stringData"]
    container = _router_container()
    pod = _resource("Deployment", "narwhal")["spec"]["template"]["spec"]
    env: dict[str, str] = {}
    for variable in container["env"]:
        source = variable["valueFrom"]
        if "fieldRef" in source:  # the downward API: the pod's own name
            assert source["fieldRef"]["fieldPath"] == "metadata.name"
            env[variable["name"]] = POD_NAME
            continue
        ref = source["secretKeyRef"]
        assert ref["name"] == "narwhal-secrets"
        env[variable["name"]] = secret[ref["key"]]
    text = _resource("ConfigMap", "narwhal-config")["data"]["narwhal.yaml"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        source = volumes[mount["name"]].get("secret")
        if source is None:
            continue
        directory = tmp_path / mount["name"]
        directory.mkdir()
        for item in source["items"]:
            (directory / item["path"]).write_text(secret[item["key"]])
        text = text.replace(mount["mountPath"], str(directory))
    path = tmp_path / "narwhal.yaml"
    path.write_text(text)
    return PodConfig(path, env)


def _check_config(config: PodConfig) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "narwhal", "check-config", str(config.path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **config.env},
    )


@pytest.fixture
def effective(pod_config: PodConfig) -> dict[str, Any]:
    """The configuration the router would run with, defaults made explicit."""
    result = _check_config(pod_config)
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def test_the_configmap_passes_check_config_with_engines_that_do_not_resolve(
    pod_config: PodConfig, effective: dict[str, Any]
) -> None:
    # check-config checks the URLs' form, not their hosts: these names exist only in a
    # cluster, and the pod's config is checked before the engines are there.
    assert [e["url"] for e in effective["engines"]] == [
        "http://vllm-0.vllm:8000",
        "http://vllm-1.vllm:8000",
    ]
    assert effective["ha"]["backend"] == "etcd"
    assert effective["fleet"]["policy"] == "cache_aware"
    # The secrets were read from where the Deployment puts them.
    assert effective["serving"]["admin_token_env"] in pod_config.env


def test_check_config_fails_without_the_secrets_the_deployment_passes(
    pod_config: PodConfig,
) -> None:
    missing = PodConfig(pod_config.path, {})
    result = _check_config(missing)
    assert result.returncode == 2
    assert "NARWHAL_ADMIN_TOKEN" in result.stderr


def test_the_grace_period_covers_the_shutdown_delay_and_the_drain(
    effective: dict[str, Any],
) -> None:
    serving = effective["serving"]
    shutdown = serving["shutdown_delay_s"]
    pod = _resource("Deployment", "narwhal")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > shutdown + serving["drain_timeout_s"]


def test_probes_ask_health_on_the_serving_port(effective: dict[str, Any]) -> None:
    container = _router_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    readiness = container["readinessProbe"]["httpGet"]
    liveness = container["livenessProbe"]["httpGet"]
    # Readiness was /ready, 200 on the active router only: two pods of three were never
    # ready, so rollouts waited on a human, drains were blocked and availability alerts
    # fired for ever. It is process health now, and the leader label steers the traffic
    # (test_the_clients_service_selects_the_leader_label_the_router_sets).
    assert (readiness["path"], liveness["path"]) == ("/health", "/health")
    assert ports[readiness["port"]] == ports[liveness["port"]] == effective["serving"]["port"]
    # Probes and the Service come to the pod's IP, never to its loopback.
    assert effective["serving"]["host"] in ("0.0.0.0", "::")
    service = _resource("Service", "narwhal")
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [readiness["port"]]


def test_the_services_and_the_budget_select_the_routers(effective: dict[str, Any]) -> None:
    labels = _resource("Deployment", "narwhal")["spec"]["template"]["metadata"]["labels"]
    leader = effective["ha"]["kubernetes_label"]
    clients = dict(_resource("Service", "narwhal")["spec"]["selector"])
    del clients[leader["key"]]  # the one label the template does not give: the leader's
    selectors = [
        clients,
        _resource("Service", "narwhal-routers")["spec"]["selector"],
        _resource("PodDisruptionBudget", "narwhal")["spec"]["selector"]["matchLabels"],
        _resource("Deployment", "narwhal")["spec"]["selector"]["matchLabels"],
    ]
    for selector in selectors:
        assert selector.items() <= labels.items()


def test_the_clients_service_selects_the_leader_label_the_router_sets(
    effective: dict[str, Any],
) -> None:
    leader = effective["ha"]["kubernetes_label"]
    selector = _resource("Service", "narwhal")["spec"]["selector"]
    assert selector[leader["key"]] == leader["value"]
    # No pod starts with it, or every pod would get traffic until its router removed it.
    template = _resource("Deployment", "narwhal")["spec"]["template"]["metadata"]["labels"]
    assert leader["key"] not in template
    # The monitoring Service reaches every router, standbys included.
    assert leader["key"] not in _resource("Service", "narwhal-routers")["spec"]["selector"]


def test_the_router_finds_its_pod_and_may_patch_it(effective: dict[str, Any]) -> None:
    leader = effective["ha"]["kubernetes_label"]
    pod = _resource("Deployment", "narwhal")["spec"]["template"]["spec"]
    (variable,) = [v for v in _router_container()["env"] if v["name"] == leader["pod_name_env"]]
    assert variable["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert pod["serviceAccountName"] == "narwhal"
    assert pod["automountServiceAccountToken"] is True
    assert leader["service_account_dir"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    _resource("ServiceAccount", pod["serviceAccountName"])
    binding = _resource("RoleBinding", "narwhal-pod-label")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"]}]
    assert binding["roleRef"]["kind"] == "Role"
    role = _resource("Role", binding["roleRef"]["name"])
    # Exactly what the label needs: read the pod and patch it, nothing more.
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]


def test_rollouts_and_drains_keep_a_standby_and_need_no_one() -> None:
    deployment = _resource("Deployment", "narwhal")["spec"]
    rolling = deployment["strategy"]["rollingUpdate"]
    # A new router is ready before an old one goes; one leaves at a time.
    assert (rolling["maxSurge"], rolling["maxUnavailable"]) == (1, 0)
    assert "progressDeadlineSeconds" not in deployment  # the default suffices now
    budget = _resource("PodDisruptionBudget", "narwhal")["spec"]
    assert budget["maxUnavailable"] == 1 and "minAvailable" not in budget
    assert deployment["replicas"] - budget["maxUnavailable"] >= 2  # a leader and a standby


def test_the_ha_endpoints_are_the_etcd_members(effective: dict[str, Any]) -> None:
    etcd = _resource("StatefulSet", "narwhal-etcd")["spec"]
    members = [
        f"http://narwhal-etcd-{i}.{etcd['serviceName']}:2379" for i in range(etcd["replicas"])
    ]
    assert list(effective["ha"]["endpoints"]) == members
    assert _resource("Service", etcd["serviceName"])["spec"]["clusterIP"] == "None"


@pytest.fixture
def pod_router(pod_config: PodConfig, tmp_path: Path, closed_port: int) -> Iterator[str]:
    """The ConfigMap's router on a loopback port, where no engine and no etcd resolves and
    the Kubernetes API refuses connections: its ServiceAccount's files are there (a
    token, a CA, the namespace), as in the pod, in a directory of the test's."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("token")
    (account / "namespace").write_text("narwhal")
    trustme.CA().cert_pem.write_to_path(str(account / "ca.crt"))
    config = yaml.safe_load(pod_config.path.read_text())
    label = config["ha"]["kubernetes_label"]
    assert "service_account_dir" not in label  # the default, where the kubelet mounts it
    label["service_account_dir"] = str(account)
    pod_config.path.write_text(yaml.safe_dump(config))
    api = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(closed_port)}
    args = ["serve", "--config", str(pod_config.path), "--host", "127.0.0.1", "--port", "0"]
    with narwhal_process(args, env={**pod_config.env, **api}) as process:
        yield process.url


async def test_the_router_starts_alive_and_unready_before_engines_etcd_and_the_api(
    pod_router: str,
) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{pod_router}/health") as health:
            assert health.status == 200
        async with session.get(f"{pod_router}/ready") as ready:
            assert ready.status == 503
            assert (await ready.json())["ready"] is False
