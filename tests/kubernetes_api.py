"""A loopback stand-in for the Kubernetes API's pod endpoints, for the pod label's tests.

No Kubernetes API server can run on the machines the suite runs on, so this server speaks
the part of it the leader label uses, as the API server does it: `GET` and `PATCH
/api/v1/namespaces/{namespace}/pods/{name}` over HTTPS (a trustme CA, written into a
ServiceAccount directory with the token and the namespace), a bearer token checked on
every request (401 `Status` otherwise), a JSON merge patch (RFC 7386) applied to the pod's
metadata, with its `resourceVersion` as a precondition (409 Conflict when it is not the
pod's), and a new resourceVersion after each change. Anything else a patch would touch is
refused with 422, so a test sees what the client sends: `requests` records each request
(method, pod, content type, body).

It fails on demand: `fail_next(status, n)` answers the next n requests with that status,
`delay_s` holds every answer, `hold_next_patch_s` applies the next patch that long after
it came (its client gone by then), `huge` answers a pod padded past the client's read bound,
`stop()` closes the port (connection refused) and `start()` opens it again on the same
port. `on_patch` runs before a patch is applied (a test changes the pod under it there,
as another client would).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme
from aiohttp import web

MERGE_PATCH = "application/merge-patch+json"


@dataclass
class Pod:
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    resource_version: int = 1

    def as_json(self, name: str, namespace: str) -> dict[str, Any]:
        return {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "resourceVersion": str(self.resource_version),
                "labels": dict(self.labels),
                "annotations": dict(self.annotations),
            },
            "spec": {"containers": [{"name": "narwhal", "image": "narwhal:0.1.0"}]},
        }


@dataclass(frozen=True)
class Request:
    method: str
    pod: str
    content_type: str | None
    body: Any  # the decoded JSON body of a PATCH; None for a GET


class KubernetesAPIServer:
    def __init__(self, directory: Path, namespace: str = "narwhal-test") -> None:
        """`directory`: where the ServiceAccount's files are written (token, ca.crt,
        namespace), as the kubelet mounts them."""
        self.namespace = namespace
        self.service_account_dir = directory
        self.token = "token-one"
        self.pods: dict[str, Pod] = {}
        self.requests: list[Request] = []
        self.delay_s = 0.0
        self.hold_next_patch_s = 0.0
        self.huge = False
        self.on_patch: Callable[[str, Pod], None] | None = None
        self._failures: list[int] = []
        self._ca = trustme.CA()
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ca.issue_cert("127.0.0.1").configure_cert(self._context)
        self._runner: web.AppRunner | None = None
        self.port = 0
        directory.mkdir(parents=True, exist_ok=True)
        self._ca.cert_pem.write_to_path(str(directory / "ca.crt"))
        (directory / "namespace").write_text(namespace)
        self.write_token(self.token)

    def write_token(self, token: str) -> None:
        """Rotate the token: the file the client reads, and the one the server accepts."""
        self.token = token
        (self.service_account_dir / "token").write_text(token + "\n")

    @property
    def environ(self) -> dict[str, str]:
        """What the kubelet sets in the container to find the API server."""
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.port)}

    def fail_next(self, status: int, n: int = 1) -> None:
        self._failures.extend([status] * n)

    def patches(self, pod: str | None = None) -> list[Any]:
        return [r.body for r in self.requests if r.method == "PATCH" and pod in (None, r.pod)]

    async def start(self) -> None:
        """Listen (again, on the same port after stop())."""
        app = web.Application()
        path = "/api/v1/namespaces/{namespace}/pods/{name}"
        app.router.add_get(path, self._get)
        app.router.add_patch(path, self._patch)
        runner = self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port, ssl_context=self._context).start()
        self.port = runner.addresses[0][1]

    async def stop(self) -> None:
        """Close the port and every connection: connections are refused until start()."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _get(self, request: web.Request) -> web.Response:
        refused = await self._refused(request)
        if refused is not None:
            return refused
        name = request.match_info["name"]
        self.requests.append(Request("GET", name, None, None))
        return self._pod(name)

    async def _patch(self, request: web.Request) -> web.Response:
        refused = await self._refused(request)
        if refused is not None:
            return refused
        name = request.match_info["name"]
        content_type = request.headers.get("Content-Type")
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _status(400, "BadRequest", "the body is not JSON")
        self.requests.append(Request("PATCH", name, content_type, body))
        hold, self.hold_next_patch_s = self.hold_next_patch_s, 0.0
        if hold:
            # Received, then applied late: the client has given up on the answer by then
            # (aiohttp runs a handler to its end after the client goes, as the API server
            # may still apply a request whose client timed out).
            await asyncio.sleep(hold)
        if content_type != MERGE_PATCH:
            return _status(415, "UnsupportedMediaType", f"{content_type} is not {MERGE_PATCH}")
        pod = self.pods.get(name)
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        if self.on_patch is not None:
            self.on_patch(name, pod)
        problem = _metadata_only(body)
        if problem is not None:
            return _status(422, "Invalid", problem)
        metadata = body["metadata"]
        version = metadata.get("resourceVersion")
        if version is not None and version != str(pod.resource_version):
            return _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
            )
        _merge(pod.labels, metadata.get("labels", {}))
        _merge(pod.annotations, metadata.get("annotations", {}))
        pod.resource_version += 1
        return self._pod(name)

    async def _refused(self, request: web.Request) -> web.Response | None:
        """The answer when the request is not served as asked: a failure on demand, a
        wrong token, a namespace that is not the ServiceAccount's."""
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self._failures:
            status = self._failures.pop(0)
            return _status(status, "Failure", f"failing on demand with {status}")
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "Unauthorized")
        if request.match_info["namespace"] != self.namespace:
            return _status(403, "Forbidden", "not this ServiceAccount's namespace")
        return None

    def _pod(self, name: str) -> web.Response:
        pod = self.pods.get(name)
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        answer = pod.as_json(name, self.namespace)
        if self.huge:
            answer["metadata"]["annotations"]["padding"] = "x" * (3 * 1024 * 1024)
        return web.json_response(answer)


def _metadata_only(body: object) -> str | None:
    """What a leader-label patch must not hold: anything but metadata's resourceVersion,
    labels and annotations, or values that are not strings (or null, to delete)."""
    if not isinstance(body, dict) or set(body) != {"metadata"}:
        return "the patch touches more than metadata"
    metadata = body["metadata"]
    if not isinstance(metadata, dict) or not set(metadata) <= {
        "resourceVersion",
        "labels",
        "annotations",
    }:
        return "the patch touches metadata beyond labels and annotations"
    for section in ("labels", "annotations"):
        values = metadata.get(section, {})
        if not isinstance(values, dict):
            return f"metadata.{section} is not a mapping"
        if not all(v is None or isinstance(v, str) for v in values.values()):
            return f"metadata.{section}: values must be strings"
    return None


def _merge(target: dict[str, str], patch: dict[str, str | None]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value


def _status(code: int, reason: str, message: str) -> web.Response:
    """The API server's error body: a `Status` object."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)
