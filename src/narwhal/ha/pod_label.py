"""The label the active router keeps on its own pod, so that the clients' Service selects it.

On Kubernetes every healthy router pod passes its readiness probe (process health:
`/health`), and the clients' Service selects, beside the routers' own labels, one label
that only the leader's pod carries: the router sets it on its own pod through the
Kubernetes API when it becomes the leader and removes it when it stops being one. That is
Patroni's pattern on Kubernetes; rollouts, node drains and scale-downs then see ready pods
and go on by themselves (deploy/kubernetes/README.md has the sequence).

The label steers traffic; it never decides who admits. A router that is not active
refuses every completion request with 503 whatever its pod's labels say (`RouterState`,
and its guard), so a label the API could not remove in time (a fenced leader cut off from
the API as well as from etcd) costs some 503s that clients retry, never two routers
admitting at once.

What the label follows is leadership: neither the shutdown nor high availability has a
reason set (standby, fenced, shutting down remove it). Whole-fleet maintenance and degraded
monitoring are the fleet's states, not the router's: the leader keeps its label and
answers them with 503 `router_unavailable` and Retry-After itself, where a Service with no
endpoint would refuse the connection.

How it is kept in step: one task reads the pod and patches the difference (`label_patch`)
whenever the wanted state differs from what the API last confirmed, and every `resync_s`
again (a label removed by hand comes back; one an earlier process in the same pod left
goes at start). The wanted state is read anew before each attempt, so a quick
active -> standby -> active ends as the last one says, and each patch carries the
resourceVersion it was computed from (`kubernetes.py`): no stale patch lands over a newer
one. (One whose answer was lost and that the API server applied after all, when the router
had moved on with nothing to write, is undone at the next resync.) While the API fails,
attempts back off (`retry_s` doubling up to `max_retry_s`), with one warning a streak and
one line when it answers again; a change of the wanted state is tried at once. Closing
(the router's cleanup) removes the label first, within a bound. With a deletion cost, the
labelled pod also carries `controller.kubernetes.io/pod-deletion-cost`, so a ReplicaSet
scaling down (the old one in a rollout, `kubectl scale`) removes the standbys before the
leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from narwhal.ha.kubernetes import (
    Conflict,
    KubernetesAPI,
    KubernetesRefused,
    KubernetesUnavailable,
    NotInCluster,
    PodMetadata,
)
from narwhal.ops.state import RouterState

log = logging.getLogger("narwhal.ha")
DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"
# How long shutting down waits for the API to confirm the label gone before going on.
WITHDRAW_TIMEOUT_S: Final = 1.0
# Patches in a row that may meet a pod changed since it was read, before backing off.
_CONFLICT_ATTEMPTS: Final = 3


@dataclass(frozen=True, slots=True)
class PodMark:
    """What the leader's pod carries: the label, and the deletion cost (None: none)."""

    key: str
    value: str
    deletion_cost: int | None = None


@dataclass(frozen=True, slots=True)
class LabelTiming:
    retry_s: float = 0.2  # the first retry after a failed call
    max_retry_s: float = 5.0
    # The pod read again while in step: a label changed by hand, or a patch whose answer
    # was lost and that the API server applied after all, is put right within this.
    resync_s: float = 10.0


def label_patch(pod: PodMetadata, lead: bool, mark: PodMark) -> dict[str, Any] | None:
    """The merge patch that brings `pod` to carry `mark` (`lead`) or not, conditional on
    the version read; None when the pod is that way already. Not leading removes the key
    whatever its value, and the deletion cost only where it is this mark's."""
    labels: dict[str, str | None] = {}
    annotations: dict[str, str | None] = {}
    if lead and pod.labels.get(mark.key) != mark.value:
        labels[mark.key] = mark.value
    elif not lead and mark.key in pod.labels:
        labels[mark.key] = None  # null deletes the key in a merge patch
    if mark.deletion_cost is not None:
        cost = str(mark.deletion_cost)
        if lead and pod.annotations.get(DELETION_COST) != cost:
            annotations[DELETION_COST] = cost
        elif not lead and pod.annotations.get(DELETION_COST) == cost:
            annotations[DELETION_COST] = None
    if not labels and not annotations:
        return None
    metadata: dict[str, Any] = {"resourceVersion": pod.resource_version}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata}


class PodLabel:
    def __init__(
        self,
        state: RouterState,
        api: KubernetesAPI,
        pod: str,
        mark: PodMark,
        registry: CollectorRegistry | None = None,
        timing: LabelTiming = LabelTiming(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._state = state
        self._api = api
        self._pod = pod
        self._mark = mark
        self._timing = timing
        self._clock = clock
        self._closing = False
        self._wanted = False
        # What the API last confirmed; None while unknown (before the first answer, and
        # while a call that may change it is out).
        self._labelled: bool | None = None
        self._checked_at = 0.0
        self._wake = asyncio.Event()
        self._confirmed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._gauge: Gauge | None = None
        self._failures: Counter | None = None
        if registry is not None:
            self._gauge = Gauge(
                "narwhal_pod_label_active",
                "1 while this router's pod carries the leader label (ha.kubernetes_label), "
                "as the Kubernetes API last confirmed; 0 otherwise",
                registry=registry,
            )
            self._failures = Counter(
                "narwhal_pod_label_failures",
                "Attempts to read or patch this router's pod through the Kubernetes API "
                "that failed (each is retried with backoff)",
                registry=registry,
            )

    @classmethod
    def in_cluster(
        cls,
        state: RouterState,
        mark: PodMark,
        *,
        pod_name_env: str,
        service_account_dir: str,
        registry: CollectorRegistry | None = None,
        environ: Mapping[str, str] | None = None,
        timing: LabelTiming = LabelTiming(),
        timeout_s: float = 5.0,
    ) -> PodLabel:
        """For the pod this process runs in: its name from `pod_name_env` (the downward
        API), the API server and ServiceAccount from the pod (NotInCluster without).
        `timeout_s`: the most one call to the API may take."""
        environ = os.environ if environ is None else environ
        pod = environ.get(pod_name_env)
        if not pod:
            raise NotInCluster(
                f"the environment variable {pod_name_env} (the pod's name, from the downward "
                "API's metadata.name) is not set"
            )
        api = KubernetesAPI.in_cluster(environ, service_account_dir, timeout_s)
        return cls(state, api, pod, mark, registry, timing)

    @property
    def labelled(self) -> bool | None:
        """Whether the pod carries the mark, as the API last confirmed (None: unknown)."""
        return self._labelled

    async def start(self) -> None:
        self._state.subscribe(self._follow)
        self._follow(None)
        self._task = asyncio.create_task(self._run(), name="narwhal-pod-label")

    async def withdraw(self, timeout_s: float = WITHDRAW_TIMEOUT_S) -> bool:
        """Wait, at most `timeout_s`, until the API has confirmed the label off this pod
        (once the router no longer leads): True when it has."""
        try:
            async with asyncio.timeout(timeout_s), self._confirmed:
                await self._confirmed.wait_for(lambda: not self._wanted and self._labelled is False)
        except TimeoutError:
            return False
        return self._labelled is False

    async def close(self, timeout_s: float = WITHDRAW_TIMEOUT_S) -> None:
        """Remove the label (best effort, within `timeout_s`), then stop."""
        self._closing = True
        self._want(False)
        task, self._task = self._task, None
        if task is not None:
            if not task.done() and not await self.withdraw(timeout_s):
                log.warning(
                    "kubernetes: pod %s may still carry %s=%s: the API did not confirm its "
                    "removal within %g s (this router refuses traffic regardless)",
                    self._pod,
                    self._mark.key,
                    self._mark.value,
                    timeout_s,
                )
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._api.close()

    def _follow(self, _reason: str | None) -> None:
        state = self._state
        self._want(state.reason("shutdown") is None and state.reason("ha") is None)

    def _want(self, lead: bool) -> None:
        lead = lead and not self._closing
        if lead != self._wanted:
            self._wanted = lead
            self._wake.set()

    async def _run(self) -> None:
        failures = 0
        while True:
            self._wake.clear()
            wanted = self._wanted
            if self._labelled is wanted:
                wait = self._checked_at + self._timing.resync_s - self._clock()
                if wait > 0:
                    await self._sleep(wait)
                    continue
            try:
                await self._reconcile(wanted)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                failures += 1
                self._failed(e, failures)
                delay = self._timing.retry_s * 2 ** (failures - 1)
                await self._sleep(min(self._timing.max_retry_s, delay))
                continue
            if failures:
                log.info("kubernetes: the API answered again after %d failed attempt(s)", failures)
                failures = 0

    async def _reconcile(self, lead: bool) -> None:
        before, self._labelled = self._labelled, None
        patched = False
        for _ in range(_CONFLICT_ATTEMPTS):
            pod = await self._api.get_pod(self._pod)
            patch = label_patch(pod, lead, self._mark)
            if patch is None:
                break
            try:
                pod = await self._api.patch_pod(self._pod, patch)
            except Conflict:
                continue  # changed since it was read: read it again
            if label_patch(pod, lead, self._mark) is not None:
                raise KubernetesUnavailable("the patched pod does not show the change")
            patched = True
            break
        else:
            raise Conflict(409, f"the pod changed under {_CONFLICT_ATTEMPTS} patches in a row")
        await self._confirm(lead, before, patched)

    async def _confirm(self, lead: bool, before: bool | None, patched: bool) -> None:
        self._labelled = lead
        self._checked_at = self._clock()
        if self._gauge is not None:
            self._gauge.set(1 if lead else 0)
        if patched:
            mark = self._mark
            reason = "stopping" if self._closing else self._state.unavailable_reason() or "active"
            if before is lead and lead:
                log.warning(
                    "kubernetes: pod %s had lost %s=%s (changed outside this router): "
                    "labelled again",
                    self._pod,
                    mark.key,
                    mark.value,
                )
            elif before is lead:
                log.warning(
                    "kubernetes: pod %s carried %s=%s though this router is %s (changed "
                    "outside this router, or a patch applied late): removed again",
                    self._pod,
                    mark.key,
                    mark.value,
                    reason,
                )
            elif lead:
                log.info(
                    "kubernetes: pod %s labelled %s=%s (%s): the clients' Service selects it",
                    self._pod,
                    mark.key,
                    mark.value,
                    reason,
                )
            else:
                log.info(
                    "kubernetes: label %s removed from pod %s (%s)", mark.key, self._pod, reason
                )
        async with self._confirmed:
            self._confirmed.notify_all()

    def _failed(self, error: Exception, failures: int) -> None:
        if self._failures is not None:
            self._failures.inc()
        if failures > 1:
            return
        doing = "set the label on" if self._wanted else "remove the label from"
        if isinstance(error, KubernetesUnavailable | KubernetesRefused):
            log.warning(
                "kubernetes: cannot %s pod %s (%s); retrying with backoff. Admission does "
                "not depend on it: a router that is not active refuses traffic regardless",
                doing,
                self._pod,
                error,
            )
        else:  # a bug: keep following the state
            log.error("kubernetes: trying to %s pod %s raised", doing, self._pod, exc_info=error)

    async def _sleep(self, delay: float) -> None:
        """Until `delay` has passed or the wanted state changes (or closing)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._wake.wait()
