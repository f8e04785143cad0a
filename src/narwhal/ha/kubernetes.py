"""The two calls the pod label needs from the Kubernetes API: read this pod, patch it.

In a pod the API server is at `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`
(the kubelet sets both in every container, `enableServiceLinks: false` included), and the
pod's ServiceAccount is mounted at `/var/run/secrets/kubernetes.io/serviceaccount`:
`token` (a bound token the kubelet rotates, so it is read again every TOKEN_REREAD_S and
after a 401), `ca.crt` (the API server's CA) and `namespace`. That is what client-go's
in-cluster configuration reads; these calls go over the aiohttp Narwhal already uses, so
no Kubernetes client library is needed.

A patch is a JSON merge patch (RFC 7386, `application/merge-patch+json`) of the pod's
metadata that carries the `resourceVersion` it was computed from: the API server applies
it to that version of the pod only and answers 409 Conflict otherwise, so a patch that a
slow network delivers late never lands over a newer one.

Every call has one deadline, and every answer is read to at most MAX_ANSWER_BYTES (a pod
is a few kilobytes): a server that is not the API server cannot fill memory. Failures are
`KubernetesUnavailable` (no answer, a 5xx or 429, an answer that is not a pod: try again
later) or `KubernetesRefused` (the API said no: 401, 403 without the Role, 404 for a pod
name that is wrong, 422), with `Conflict` (409) apart.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import aiohttp

# Far above any pod's metadata and spec (kilobytes; the API server's own limit on an
# object is about 1.5 MB, etcd's request size).
MAX_ANSWER_BYTES: Final = 2 * 1024 * 1024
# The kubelet rewrites a projected token well before it expires (at 80% of its life, an
# hour by default); client-go reads it again every minute.
TOKEN_REREAD_S: Final = 60.0
_MERGE_PATCH: Final = "application/merge-patch+json"
_SHOWN_CHARS: Final = 200  # of an error's message, in exceptions and logs


class NotInCluster(ValueError):
    """What an in-cluster client needs is missing (not in a pod, no ServiceAccount)."""


class KubernetesUnavailable(Exception):
    """No usable answer: try again later."""


class KubernetesRefused(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Conflict(KubernetesRefused):
    """409: the pod changed since the resourceVersion the patch names."""


@dataclass(frozen=True, slots=True)
class PodMetadata:
    """What the label logic reads of a pod."""

    resource_version: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


class KubernetesAPI:
    """The pods of one namespace, as one ServiceAccount sees them."""

    def __init__(
        self,
        base_url: str,
        namespace: str,
        token_path: Path,
        ca_path: Path | None,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`ca_path`: the CA that signed the API server's certificate (None: the system's
        trust store, or plain HTTP for a `http://` base URL)."""
        self._base = base_url.rstrip("/")
        self.namespace = namespace
        self._token_path = token_path
        self._ssl: ssl.SSLContext | bool = True
        if ca_path is not None:
            try:
                self._ssl = ssl.create_default_context(cafile=str(ca_path))
            except (OSError, ssl.SSLError) as e:
                raise NotInCluster(f"cannot read the API server's CA {ca_path}: {e}") from None
        self._timeout_s = timeout_s
        self._clock = clock
        self._token: str | None = None
        self._token_read_at = 0.0
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def in_cluster(
        cls, environ: Mapping[str, str], service_account_dir: str, timeout_s: float = 5.0
    ) -> KubernetesAPI:
        """The API server and the ServiceAccount of the pod this process runs in; checks
        that the token can be read now (NotInCluster otherwise)."""
        host = environ.get("KUBERNETES_SERVICE_HOST")
        port = environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise NotInCluster(
                "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: not in a pod"
            )
        directory = Path(service_account_dir)
        try:
            namespace = (directory / "namespace").read_text(encoding="utf-8").strip()
            (directory / "token").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise NotInCluster(
                f"cannot read the pod's ServiceAccount in {directory} ({e}): is its token "
                "mounted (automountServiceAccountToken, or a projected volume there)?"
            ) from None
        if not namespace:
            raise NotInCluster(f"{directory / 'namespace'} is empty")
        shown = f"[{host}]" if ":" in host else host
        return cls(
            f"https://{shown}:{port}",
            namespace,
            directory / "token",
            directory / "ca.crt",
            timeout_s=timeout_s,
        )

    async def get_pod(self, name: str) -> PodMetadata:
        return _pod_metadata(await self._call("GET", name, None))

    async def patch_pod(self, name: str, patch: Mapping[str, Any]) -> PodMetadata:
        """Apply a JSON merge patch; the pod as it is after it."""
        body = json.dumps(patch).encode()
        return _pod_metadata(await self._call("PATCH", name, body))

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def _call(self, method: str, name: str, body: bytes | None) -> dict[str, Any]:
        url = f"{self._base}/api/v1/namespaces/{quote(self.namespace)}/pods/{quote(name)}"
        try:
            async with asyncio.timeout(self._timeout_s):
                headers = {
                    "Authorization": f"Bearer {await self._bearer()}",
                    "Accept": "application/json",
                    # What is counted below is what came over the wire.
                    "Accept-Encoding": "identity",
                }
                if body is not None:
                    headers["Content-Type"] = _MERGE_PATCH
                async with self._open().request(
                    method, url, data=body, headers=headers, allow_redirects=False
                ) as response:
                    status = response.status
                    raw = await _read_bounded(response)
        except TimeoutError:
            raise KubernetesUnavailable(f"no answer within {self._timeout_s:g} s") from None
        except (aiohttp.ClientError, OSError, ValueError) as e:
            raise KubernetesUnavailable(f"{method} {url}: {e!r}"[:_SHOWN_CHARS]) from None
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if status == 200:
            if not isinstance(answer, dict):
                raise KubernetesUnavailable(f"{method} {url}: HTTP 200 without a JSON object")
            return answer
        message = _status_message(answer, raw)
        if status == 401:
            self._token = None  # rotated under us: read it again for the next call
        if status == 409:
            raise Conflict(status, message)
        if status == 429 or status >= 500:
            raise KubernetesUnavailable(f"{method} {url}: HTTP {status}: {message}")
        raise KubernetesRefused(status, message)

    async def _bearer(self) -> str:
        now = self._clock()
        if self._token is None or now - self._token_read_at >= TOKEN_REREAD_S:
            try:
                text = await asyncio.to_thread(self._token_path.read_text, encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise KubernetesUnavailable(f"cannot read the token: {e}") from None
            self._token, self._token_read_at = text.strip(), now
        return self._token

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=4),
                timeout=aiohttp.ClientTimeout(total=None),
            )
        return self._session


async def _read_bounded(response: aiohttp.ClientResponse) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise KubernetesUnavailable(f"an answer of more than {MAX_ANSWER_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _status_message(answer: object, raw: bytes) -> str:
    """A `Status` object's message (the API server's error body), or the body's start."""
    message = answer.get("message") if isinstance(answer, dict) else None
    if isinstance(message, str):
        return message[:_SHOWN_CHARS]
    return repr(raw[:_SHOWN_CHARS])


def _pod_metadata(answer: dict[str, Any]) -> PodMetadata:
    metadata = answer.get("metadata")
    if answer.get("kind") != "Pod" or not isinstance(metadata, dict):
        raise KubernetesUnavailable(f"the answer is not a pod: {str(answer)[:_SHOWN_CHARS]}")
    version = metadata.get("resourceVersion")
    if not isinstance(version, str) or not version:
        raise KubernetesUnavailable("the pod's answer has no resourceVersion")
    return PodMetadata(
        version, _strings(metadata.get("labels")), _strings(metadata.get("annotations"))
    )


def _strings(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise KubernetesUnavailable("the pod's labels or annotations are not strings")
    return dict(value)
