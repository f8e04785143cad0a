"""The few etcd v3 calls high availability needs, through etcd's JSON gateway.

etcd serves its v3 API as JSON over HTTP at `/v3/...` on the client port (the gateway is
part of etcd itself, documented in "gRPC gateway"), so these calls go over the aiohttp
the router already uses, with no gRPC stack beside it. Keys and values travel base64
encoded; 64-bit integers travel as strings; fields at their zero value are left out
(`succeeded: false` arrives as no `succeeded` at all).

With several endpoints (the members of one cluster) a call that cannot reach one tries
the next, within the call's one deadline; the endpoint that answered is tried first next
time. An etcd that answers with an error (`{"error", "code"}`) is not retried elsewhere:
the cluster has spoken.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp.client import _RequestContextManager

# gRPC status NOT_FOUND: etcd's answer for a lease it does not know.
_NOT_FOUND = 5
# The largest answer read from an endpoint: far above any answer these calls get (the
# operator state is a few keys), so an endpoint that is not etcd cannot fill memory.
MAX_ANSWER_BYTES = 4 * 1024 * 1024


class EtcdTransport(Protocol):
    """The HTTP client etcd's gateway is reached through: the router's shared session
    (`narwhal.engines.session.SharedSession`) or an `aiohttp.ClientSession`."""

    def post(self, url: str, **kwargs: Any) -> _RequestContextManager: ...


class EtcdUnavailable(Exception):
    """No endpoint answered in time."""


class EtcdError(Exception):
    """etcd answered with an error."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


class LeaseNotFound(EtcdError):
    """The lease named in a request does not exist (expired or revoked)."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    lease: int | None


@dataclass(frozen=True, slots=True)
class CampaignResult:
    won: bool
    holder: KeyValue | None  # the key as it stands after the transaction (if it exists)
    revision: int  # the store's revision after the transaction


class EtcdClient:
    def __init__(self, endpoints: Sequence[str], session: EtcdTransport, timeout_s: float) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self._endpoints = [e.rstrip("/") for e in endpoints]
        self._session = session
        self._timeout = timeout_s
        self._preferred = 0

    async def grant(self, ttl_s: int) -> tuple[int, int]:
        """A new lease: (its id, the TTL etcd granted, which may exceed the one asked)."""
        answer = await self._call("/v3/lease/grant", {"TTL": ttl_s})
        return int(answer["ID"]), int(answer.get("TTL", 0))

    async def keepalive(self, lease: int) -> int:
        """Renew `lease` once: its TTL from now, 0 when etcd no longer has it."""
        answer = await self._call("/v3/lease/keepalive", {"ID": str(lease)})
        result = answer.get("result", answer)
        return int(result.get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        """Revoke `lease` and delete its keys; a lease already gone is not an error."""
        with contextlib.suppress(LeaseNotFound):
            await self._call("/v3/lease/revoke", {"ID": str(lease)})

    async def create_if_absent(self, key: str, value: bytes, lease: int) -> CampaignResult:
        """Put `key` under `lease` only if no such key exists, in one transaction."""
        encoded = _b64(key)
        answer = await self._call(
            "/v3/kv/txn",
            {
                "compare": [{"target": "CREATE", "key": encoded, "createRevision": "0"}],
                "success": [
                    {"requestPut": {"key": encoded, "value": _b64(value), "lease": str(lease)}}
                ],
                "failure": [{"requestRange": {"key": encoded}}],
            },
        )
        revision = int(answer["header"]["revision"])
        if answer.get("succeeded", False):
            return CampaignResult(True, KeyValue(key, value, revision, lease), revision)
        holder = None
        for response in answer.get("responses", []):
            kvs = response.get("response_range", {}).get("kvs", [])
            if kvs:
                holder = _key_value(kvs[0])
        return CampaignResult(False, holder, revision)

    async def get(self, key: str) -> KeyValue | None:
        answer = await self._call("/v3/kv/range", {"key": _b64(key)})
        kvs = answer.get("kvs", [])
        return _key_value(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        answer = await self._call(
            "/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix))}
        )
        return [_key_value(kv) for kv in answer.get("kvs", [])]

    async def put(self, key: str, value: bytes) -> None:
        await self._call("/v3/kv/put", {"key": _b64(key), "value": _b64(value)})

    async def delete(self, key: str) -> None:
        await self._call("/v3/kv/deleterange", {"key": _b64(key)})

    async def watch(self, key: str, after_revision: int, timeout_s: float) -> bool:
        """Wait for a change to `key` after `after_revision`: True when one came, False
        when `timeout_s` passed first. A broken watch raises EtcdUnavailable."""
        body = {"create_request": {"key": _b64(key), "start_revision": str(after_revision + 1)}}
        url = self._endpoints[self._preferred] + "/v3/watch"
        try:
            async with asyncio.timeout(timeout_s):
                async with self._session.post(url, data=json.dumps(body)) as response:
                    if response.status != 200:
                        raise EtcdUnavailable(f"watch answered HTTP {response.status}")
                    async for line in response.content:
                        result = json.loads(line).get("result", {})
                        if result.get("events") or result.get("compact_revision"):
                            return True
                        if result.get("canceled"):
                            return True  # e.g. compacted: look again
            raise EtcdUnavailable("the watch stream ended")
        except TimeoutError:
            return False
        except (aiohttp.ClientError, OSError, ValueError) as e:
            self._preferred = (self._preferred + 1) % len(self._endpoints)
            raise EtcdUnavailable(f"watch failed: {e!r}") from None

    async def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body)
        errors: list[str] = []
        try:
            async with asyncio.timeout(self._timeout):
                for i in range(len(self._endpoints)):
                    index = (self._preferred + i) % len(self._endpoints)
                    try:
                        answer = await self._post(self._endpoints[index] + path, data)
                    except (aiohttp.ClientError, OSError, ValueError) as e:
                        errors.append(f"{self._endpoints[index]}: {e!r}")
                        continue
                    self._preferred = index
                    return answer
        except TimeoutError:
            errors.append(f"no answer within {self._timeout:g} s")
        self._preferred = (self._preferred + 1) % len(self._endpoints)
        raise EtcdUnavailable("; ".join(errors) or "no endpoint answered")

    async def _post(self, url: str, data: str) -> dict[str, Any]:
        async with self._session.post(url, data=data) as response:
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.content.iter_any():
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise EtcdUnavailable(f"{url} answered more than {MAX_ANSWER_BYTES} bytes")
                chunks.append(chunk)
            raw = b"".join(chunks)
        try:
            answer = json.loads(raw)
        except ValueError:
            raise EtcdUnavailable(f"{url} answered HTTP {response.status}, not JSON") from None
        if not isinstance(answer, dict):
            raise EtcdUnavailable(f"{url} answered {raw[:100]!r}")
        if "error" in answer or ("code" in answer and "header" not in answer):
            message = str(answer.get("message") or answer.get("error"))
            code = answer.get("code")
            if code == _NOT_FOUND and "lease not found" in message:
                raise LeaseNotFound(message, code)
            raise EtcdError(message, code if isinstance(code, int) else None)
        if response.status != 200:
            raise EtcdUnavailable(f"{url} answered HTTP {response.status}")
        return answer


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def _prefix_end(prefix: str) -> bytes:
    """The range end that covers every key starting with `prefix` (etcd's convention)."""
    raw = bytearray(prefix.encode())
    for i in range(len(raw) - 1, -1, -1):
        if raw[i] < 0xFF:
            raw[i] += 1
            return bytes(raw[: i + 1])
    return b"\0"


def _key_value(kv: dict[str, Any]) -> KeyValue:
    lease = int(kv.get("lease", 0))
    return KeyValue(
        key=base64.b64decode(kv.get("key", "")).decode(errors="replace"),
        value=base64.b64decode(kv.get("value", "")),
        create_revision=int(kv.get("create_revision", 0)),
        lease=lease or None,
    )
