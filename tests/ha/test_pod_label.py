"""The leader label on Kubernetes: the router keeps a label on its own pod in step with its
state, against a loopback server speaking the Kubernetes API's pod endpoints
(`tests/kubernetes_api.py`: no Kubernetes API server can run where the suite runs).

The sequence: a router that becomes active labels its pod; one that steps down (standby),
fences or shuts down removes the label; while the API is unreachable it retries with
backoff, and admission never waits on it (a fenced router refuses whatever its pod says).
Each test drives a real `RouterState` (and, in the last ones, a real election on etcd),
and checks what the server was sent."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from narwhal.ha.election import Timing
from narwhal.ha.etcd import EtcdClient
from narwhal.ha.kubernetes import MAX_ANSWER_BYTES, KubernetesAPI, NotInCluster, PodMetadata
from narwhal.ha.leadership import Leadership
from narwhal.ha.pod_label import DELETION_COST, LabelTiming, PodLabel, PodMark, label_patch
from narwhal.ops.state import RouterState
from tests.etcd_server import EtcdServer, etcd_server
from tests.kubernetes_api import MERGE_PATCH, KubernetesAPIServer, Pod

POD = "narwhal-7d4b9c-x2x9q"
MARK = PodMark("narwhal.io/leader", "true", deletion_cost=1000)
FAST = LabelTiming(retry_s=0.02, max_retry_s=0.2, resync_s=60.0)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[KubernetesAPIServer]:
    server = KubernetesAPIServer(tmp_path / "serviceaccount")
    server.pods[POD] = Pod(labels={"app.kubernetes.io/name": "narwhal"})
    await server.start()
    yield server
    await server.stop()


def pod_label(
    api: KubernetesAPIServer,
    state: RouterState,
    pod: str = POD,
    registry: CollectorRegistry | None = None,
    timing: LabelTiming = FAST,
    timeout_s: float = 1.0,
) -> PodLabel:
    """As the router builds it in a pod: the pod's name from the downward API's variable,
    the API server and ServiceAccount as the kubelet provides them."""
    return PodLabel.in_cluster(
        state,
        MARK,
        pod_name_env="POD_NAME",
        service_account_dir=str(api.service_account_dir),
        registry=registry,
        environ={**api.environ, "POD_NAME": pod},
        timing=timing,
        timeout_s=timeout_s,
    )


async def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not within the time allowed"
        await asyncio.sleep(0.005)


def labelled(api: KubernetesAPIServer, pod: str = POD) -> bool:
    return api.pods[pod].labels.get(MARK.key) == MARK.value


def standby() -> RouterState:
    """A router with high availability, as it starts: refusing as standby."""
    return RouterState(initial={"ha": "standby"})


# --- the patch itself (sans-IO) -----------------------------------------------------------


def test_the_patch_is_conditional_on_the_version_read_and_empty_when_in_step() -> None:
    bare = PodMetadata("7", {"app": "narwhal"}, {})
    assert label_patch(bare, True, MARK) == {
        "metadata": {
            "resourceVersion": "7",
            "labels": {MARK.key: "true"},
            "annotations": {DELETION_COST: "1000"},
        }
    }
    assert label_patch(bare, False, MARK) is None
    marked = PodMetadata("8", {MARK.key: "true"}, {DELETION_COST: "1000"})
    assert label_patch(marked, True, MARK) is None
    assert label_patch(marked, False, MARK) == {
        "metadata": {
            "resourceVersion": "8",
            "labels": {MARK.key: None},
            "annotations": {DELETION_COST: None},
        }
    }


def test_stepping_down_removes_the_key_whatever_its_value_but_only_its_own_cost() -> None:
    # A deletion cost someone else set stays; the key means "leader" whatever it says.
    pod = PodMetadata("3", {MARK.key: "false"}, {DELETION_COST: "-5"})
    assert label_patch(pod, False, MARK) == {
        "metadata": {"resourceVersion": "3", "labels": {MARK.key: None}}
    }
    no_cost = PodMark(MARK.key, MARK.value, deletion_cost=None)
    assert label_patch(PodMetadata("3", {}, {}), True, no_cost) == {
        "metadata": {"resourceVersion": "3", "labels": {MARK.key: "true"}}
    }


# --- acquire, step down, fenced, shutdown ---------------------------------------------------


async def test_a_router_that_becomes_active_labels_its_pod(api: KubernetesAPIServer) -> None:
    state = standby()
    registry = CollectorRegistry()
    label = pod_label(api, state, registry=registry)
    await label.start()
    await eventually(lambda: label.labelled is False)
    assert api.patches() == []  # standby, and no label to remove: read, nothing written
    assert registry.get_sample_value("narwhal_pod_label_active") == 0
    state.set("ha", None, "won")
    await eventually(lambda: label.labelled is True)
    assert labelled(api)
    assert api.pods[POD].annotations[DELETION_COST] == "1000"
    assert api.pods[POD].labels["app.kubernetes.io/name"] == "narwhal"  # others kept
    (patch,) = [r for r in api.requests if r.method == "PATCH"]
    assert patch.content_type == MERGE_PATCH
    assert patch.body == {
        "metadata": {
            "resourceVersion": "1",
            "labels": {MARK.key: "true"},
            "annotations": {DELETION_COST: "1000"},
        }
    }
    assert registry.get_sample_value("narwhal_pod_label_active") == 1
    await label.close()


@pytest.mark.parametrize("reason", ["standby", "fenced"])
async def test_a_router_that_stops_being_active_removes_its_label(
    api: KubernetesAPIServer, reason: str
) -> None:
    state = RouterState()
    label = pod_label(api, state)
    await label.start()
    await eventually(lambda: labelled(api))
    state.set("ha", reason, "lost it")
    await eventually(lambda: label.labelled is False)
    assert MARK.key not in api.pods[POD].labels
    assert DELETION_COST not in api.pods[POD].annotations
    assert api.patches()[-1]["metadata"]["labels"] == {MARK.key: None}
    await label.close()


async def test_maintenance_and_degraded_monitoring_keep_the_label_on_the_leader(
    api: KubernetesAPIServer,
) -> None:
    # The leader answers them itself (503 router_unavailable, Retry-After): a Service
    # with no endpoint would refuse connections instead.
    state = RouterState()
    label = pod_label(api, state)
    await label.start()
    await eventually(lambda: label.labelled is True)
    state.set("maintenance", "maintenance")
    state.set("monitoring", "monitoring_degraded")
    await asyncio.sleep(0.1)
    assert labelled(api) and len(api.patches()) == 1
    state.set("shutdown", "shutting_down")
    await eventually(lambda: not labelled(api))
    await label.close()


async def test_shutting_down_withdraws_the_label_before_resigning(
    api: KubernetesAPIServer,
) -> None:
    state = RouterState()
    label = pod_label(api, state)
    await label.start()
    await eventually(lambda: label.labelled is True)
    state.set("shutdown", "shutting_down", "stopping")  # Router.stop_admitting
    assert await label.withdraw(timeout_s=2.0)
    assert not labelled(api)
    await label.close()


async def test_closing_removes_the_label_even_from_an_active_router(
    api: KubernetesAPIServer,
) -> None:
    # A router that stops without the shutdown sequence (a failed start-up, a test).
    state = RouterState()
    label = pod_label(api, state)
    await label.start()
    await eventually(lambda: labelled(api))
    await label.close()
    assert not labelled(api)
    assert state.unavailable_reason() is None  # the label is not the router's state


async def test_a_label_an_earlier_process_left_goes_at_start(api: KubernetesAPIServer) -> None:
    # The container restarted in place after the leader died: the pod keeps its labels.
    api.pods[POD].labels[MARK.key] = "true"
    api.pods[POD].annotations[DELETION_COST] = "1000"
    label = pod_label(api, standby())
    await label.start()
    await eventually(lambda: label.labelled is False)
    assert not labelled(api) and DELETION_COST not in api.pods[POD].annotations
    await label.close()


# --- the API unreachable, failing, slow --------------------------------------------------


async def test_an_unreachable_api_is_retried_and_admission_does_not_wait_for_it(
    api: KubernetesAPIServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "narwhal.ha")
    registry = CollectorRegistry()
    await api.stop()  # connections refused
    state = standby()
    label = pod_label(api, state, registry=registry)
    await label.start()
    state.set("ha", None, "won")
    await eventually(
        lambda: (registry.get_sample_value("narwhal_pod_label_failures_total") or 0) >= 4
    )
    assert state.unavailable_reason() is None  # active: admits, label or not
    assert label.labelled is None
    await api.start()
    await eventually(lambda: label.labelled is True)
    assert labelled(api)
    messages = [r.getMessage() for r in caplog.records if r.name == "narwhal.ha"]
    warnings = [m for m in messages if m.startswith("kubernetes: cannot")]
    assert len(warnings) == 1, messages  # one a failure streak
    assert "set the label on pod" in warnings[0]
    assert sum("answered again" in m for m in messages) == 1
    assert sum("labelled narwhal.io/leader=true" in m for m in messages) == 1
    await label.close()


async def test_a_fenced_router_cut_off_from_the_api_still_refuses(
    api: KubernetesAPIServer,
) -> None:
    # The label steers traffic only: the Service may still send here for a while, and
    # every completion request gets 503 router_unavailable meanwhile.
    state = RouterState()
    label = pod_label(api, state)
    await label.start()
    await eventually(lambda: label.labelled is True)
    await api.stop()
    state.set("ha", "fenced", "no renewal")
    assert state.unavailable_reason() == "fenced"
    await asyncio.sleep(0.2)
    assert labelled(api)  # the API never heard
    await api.start()
    await eventually(lambda: not labelled(api))
    assert label.labelled is False
    await label.close()


@pytest.mark.parametrize("status", [503, 500, 429, 403, 401])
async def test_an_api_answering_errors_is_retried_with_backoff(
    api: KubernetesAPIServer, status: int
) -> None:
    api.fail_next(status, 5)
    state = RouterState()
    label = pod_label(api, state)
    started = time.monotonic()
    await label.start()
    await eventually(lambda: label.labelled is True)
    # 0.02 + 0.04 + 0.08 + 0.16 + 0.2 s of backoff: not a tight loop.
    assert time.monotonic() - started >= 0.45
    assert labelled(api)
    await label.close()


async def test_a_slow_api_is_given_up_on_at_the_call_timeout_and_retried(
    api: KubernetesAPIServer,
) -> None:
    api.delay_s = 1.0
    state = RouterState()
    label = pod_label(api, state, timeout_s=0.2)
    await label.start()
    await asyncio.sleep(0.5)
    assert label.labelled is None and not labelled(api)
    api.delay_s = 0.0
    await eventually(lambda: label.labelled is True)
    await label.close()


async def test_an_answer_past_the_read_bound_is_a_failure(api: KubernetesAPIServer) -> None:
    api.huge = True
    registry = CollectorRegistry()
    label = pod_label(api, RouterState(), registry=registry)
    await label.start()
    await eventually(
        lambda: (registry.get_sample_value("narwhal_pod_label_failures_total") or 0) >= 2
    )
    assert label.labelled is None
    api.huge = False
    await eventually(lambda: label.labelled is True)
    await label.close()
    assert MAX_ANSWER_BYTES < 3 * 1024 * 1024  # the server's padding


async def test_closing_with_the_api_unreachable_is_bounded(api: KubernetesAPIServer) -> None:
    state = RouterState()
    label = pod_label(api, state)
    await label.start()
    await eventually(lambda: label.labelled is True)
    api.delay_s = 10.0
    started = time.monotonic()
    await label.close(timeout_s=0.3)
    assert time.monotonic() - started < 1.0


# --- the latest state wins ----------------------------------------------------------------


@pytest.mark.parametrize("flips", [["standby", None], ["standby", None, "fenced"]])
async def test_a_quick_flip_ends_in_the_last_state(
    api: KubernetesAPIServer, flips: list[str | None]
) -> None:
    state = RouterState()
    label = pod_label(api, state)
    await label.start()
    await eventually(lambda: label.labelled is True)
    api.delay_s = 0.05  # each call outlasts the flips
    for reason in flips:
        state.set("ha", reason)
        await asyncio.sleep(0.01)
    lead = flips[-1] is None
    await eventually(lambda: label.labelled is lead and labelled(api) is lead)
    await asyncio.sleep(0.2)
    assert labelled(api) is lead  # nothing late undoes it
    # Every patch named the version it was computed from.
    assert all("resourceVersion" in p["metadata"] for p in api.patches())
    await label.close()


async def test_a_pod_changed_between_read_and_patch_is_read_again(
    api: KubernetesAPIServer,
) -> None:
    # Another client (the kubelet, kubectl) changes the pod under the patch: the API answers
    # 409, and the label is patched on the new version, the other change kept.
    def someone_else(name: str, pod: Pod) -> None:
        api.on_patch = None
        pod.labels["team"] = "a"
        pod.resource_version += 1

    api.on_patch = someone_else
    label = pod_label(api, RouterState())
    await label.start()
    await eventually(lambda: label.labelled is True)
    assert labelled(api) and api.pods[POD].labels["team"] == "a"
    versions = [p["metadata"]["resourceVersion"] for p in api.patches()]
    assert versions == ["1", "2"]
    await label.close()


async def test_a_lost_patch_that_lands_late_is_undone_at_the_next_resync(
    api: KubernetesAPIServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The label's patch reaches the API server, its answer does not (the call times out);
    # the router steps down and finds nothing to remove; then the server applies the
    # patch. Nothing was written in between for its resourceVersion to be refused by, so
    # the resync reads the pod and removes the label.
    caplog.set_level(logging.WARNING, "narwhal.ha")
    api.hold_next_patch_s = 0.4
    timing = LabelTiming(retry_s=0.02, max_retry_s=0.2, resync_s=0.3)
    state = RouterState()
    label = pod_label(api, state, timing=timing, timeout_s=0.2)
    await label.start()
    await eventually(lambda: len(api.patches()) == 1)
    state.set("ha", "standby")
    await eventually(lambda: label.labelled is False)
    await eventually(lambda: labelled(api))  # the late one
    await eventually(lambda: not labelled(api))  # the resync
    # (logged once the patch's answer is in, maybe after the API server applied it)
    await eventually(
        lambda: any("changed outside this router" in r.getMessage() for r in caplog.records)
    )
    await label.close()


async def test_a_label_removed_by_hand_comes_back_at_the_next_resync(
    api: KubernetesAPIServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "narwhal.ha")
    timing = LabelTiming(retry_s=0.02, max_retry_s=0.2, resync_s=0.1)
    label = pod_label(api, RouterState(), timing=timing)
    await label.start()
    await eventually(lambda: labelled(api))
    del api.pods[POD].labels[MARK.key]  # kubectl label pod ... narwhal.io/leader-
    await eventually(lambda: labelled(api))
    # Logged once the patch's answer is in, which may be after the API server applied it
    # (a loaded machine let the check above see the label first).
    await eventually(
        lambda: any("changed outside this router" in r.getMessage() for r in caplog.records)
    )
    await label.close()


async def test_a_rotated_token_is_read_again_after_a_401(api: KubernetesAPIServer) -> None:
    state = standby()
    label = pod_label(api, state)
    await label.start()
    await eventually(lambda: label.labelled is False)
    api.write_token("token-two")  # the kubelet rotated it
    state.set("ha", None)
    await eventually(lambda: label.labelled is True)
    assert labelled(api)
    await label.close()


# --- outside a pod ---------------------------------------------------------------------------


def test_outside_a_pod_the_label_cannot_be_built(tmp_path: Path) -> None:
    state = RouterState()
    with pytest.raises(NotInCluster, match="POD_NAME"):
        PodLabel.in_cluster(
            state, MARK, pod_name_env="POD_NAME", service_account_dir=str(tmp_path), environ={}
        )
    with pytest.raises(NotInCluster, match="KUBERNETES_SERVICE_HOST"):
        PodLabel.in_cluster(
            state,
            MARK,
            pod_name_env="POD_NAME",
            service_account_dir=str(tmp_path),
            environ={"POD_NAME": POD},
        )
    environ = {"POD_NAME": POD, "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    environ["KUBERNETES_SERVICE_PORT"] = "443"
    with pytest.raises(NotInCluster, match="automountServiceAccountToken"):
        KubernetesAPI.in_cluster(environ, str(tmp_path / "missing"))


# --- with a real election on etcd ------------------------------------------------------------


class NoOperatorState:
    """The replicated operator state, empty (what the election reads back on winning)."""

    async def load(self) -> None:
        return None


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    with etcd_server() as server:
        yield server


class Router:
    """The HA half of one router: its state, its election on etcd, its pod's label."""

    def __init__(
        self, name: str, etcd: EtcdServer, api: KubernetesAPIServer, session: aiohttp.ClientSession
    ) -> None:
        self.pod = name
        api.pods[name] = Pod()
        self.state = standby()
        timing = Timing(ttl_s=1, renew_interval_s=0.3, margin_s=0.2, retry_s=0.05)
        client = EtcdClient([etcd.url], session, timeout_s=0.3)
        self.leadership = Leadership(
            client, timing, "/label-test/leader", name, self.state, NoOperatorState()
        )
        self.label = pod_label(api, self.state, pod=name)

    async def start(self) -> None:
        await self.label.start()
        await self.leadership.start()

    async def stop(self) -> None:
        """SIGTERM, as the router runs it: shutting down, the label off, the lease revoked."""
        self.state.set("shutdown", "shutting_down")
        await self.label.withdraw()
        await self.leadership.resign()
        await self.label.close()


async def test_the_label_follows_the_election_from_one_router_to_the_next(
    api: KubernetesAPIServer, etcd: EtcdServer
) -> None:
    async with aiohttp.ClientSession() as session:
        a = Router("narwhal-a", etcd, api, session)
        await a.start()
        await eventually(lambda: labelled(api, "narwhal-a"))  # acquire
        assert a.state.unavailable_reason() is None
        b = Router("narwhal-b", etcd, api, session)
        await b.start()
        await eventually(lambda: b.label.labelled is False)
        assert b.state.unavailable_reason() == "standby"
        await a.stop()  # a rollout deletes the old leader's pod
        assert not labelled(api, "narwhal-a")
        await eventually(lambda: labelled(api, "narwhal-b"))  # the standby took over
        assert b.state.unavailable_reason() is None
        etcd.pause()  # b cannot renew: it fences, and its label goes
        try:
            await eventually(lambda: b.state.unavailable_reason() == "fenced")
            await eventually(lambda: not labelled(api, "narwhal-b"))
        finally:
            etcd.resume()
        await eventually(lambda: labelled(api, "narwhal-b"), timeout=10)  # its lease held
        await b.stop()
        assert not any(labelled(api, pod) for pod in ("narwhal-a", "narwhal-b"))
