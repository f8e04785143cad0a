"""vLLM's disaggregated prefill/decode handshake, made real between two sim processes.

Prefill side (`KvStore`): a request with `kv_transfer_params.do_remote_decode` runs its
prefill, samples one token, and keeps its prompt's KV blocks (counted in the engine's
KV usage; their ids are the `remote_block_ids`) for `--kv-hold-s` wall-clock seconds.
The lease is not scaled by `--time-scale`: like vLLM's, it is about how long a decoder
may take to show up, and tests need it to expire deterministically even at time-scale 0.

Decode side (`pull_blocks`): a request with `do_remote_prefill` and the remote_* fields
POSTs `{remote_engine_id, remote_request_id}` to `http://remote_host:remote_port
/sim/kv/pull` on the prefill engine. 200 releases the blocks there and answers
`{num_tokens, prompt_digest}`; 404 means unknown or expired. The decoder then admits
the request with its prefill done, after the modelled transfer time.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import msgspec

from narwhal.sim.engine import Engine
from narwhal.sim.events import SimError
from narwhal.sim.model import Sequence

PULL_PATH: Final = "/sim/kv/pull"
_PULL_TIMEOUT: Final = aiohttp.ClientTimeout(total=10, connect=3)
_REQUIRED: Final = ("remote_block_ids", "remote_engine_id", "remote_request_id",
                    "remote_host", "remote_port")  # fmt: skip


def prompt_digest(prompt_ids: list[int]) -> str:
    return hashlib.blake2b(msgspec.json.encode(prompt_ids), digest_size=8).hexdigest()


@dataclass(slots=True)
class _Held:
    seq: Sequence  # the finished prefill, still holding its prompt's blocks
    digest: str
    timer: asyncio.TimerHandle | None = None


class KvStore:
    """Prefilled KV blocks held for remote decoders, keyed by remote_request_id."""

    def __init__(self, engine: Engine, hold_s: float, engine_id: str) -> None:
        self.engine = engine
        self.hold_s = hold_s
        self.engine_id = engine_id
        self._held: dict[str, _Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    def hold(
        self, request_id: str, seq: Sequence, prompt_ids: list[int], host: str, port: int
    ) -> dict[str, Any]:
        """Keep the blocks; returns the kv_transfer_params the decoder needs."""
        blocks = [block.block_id for block in seq.blocks]
        held = _Held(seq, prompt_digest(prompt_ids))
        loop = asyncio.get_running_loop()
        held.timer = loop.call_later(self.hold_s, self._expire, request_id)
        self._held[request_id] = held
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [blocks],
            "remote_engine_id": self.engine_id,
            "remote_request_id": request_id,
            "remote_host": host,
            "remote_port": port,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": len(prompt_ids),
            "remote_blocks_expiry_time": None,
            "remote_registration_generation": 0,
            "transfer_mode": "pull",
        }

    def _expire(self, request_id: str) -> None:
        held = self._held.pop(request_id, None)
        if held is not None:
            self.engine.release_held(held.seq)

    def pull(self, engine_id: str, request_id: str) -> tuple[int, str] | None:
        """Hand the blocks over (and free them here); None if unknown or expired."""
        if engine_id != self.engine_id:
            return None
        held = self._held.pop(request_id, None)
        if held is None:
            return None
        if held.timer is not None:
            held.timer.cancel()
        self.engine.release_held(held.seq)
        return held.seq.prompt_len, held.digest

    def close(self) -> None:
        for request_id in list(self._held):
            held = self._held.pop(request_id)
            if held.timer is not None:
                held.timer.cancel()


def _unavailable(message: str) -> SimError:
    return SimError(503, message, "ServiceUnavailableError")


async def pull_blocks(
    session: aiohttp.ClientSession, params: dict[str, Any], prompt_ids: list[int]
) -> int:
    """Pull a prefill engine's blocks for this prompt; the number of tokens transferred."""
    missing = [key for key in _REQUIRED if params.get(key) in (None, "")]
    if missing:
        message = f"kv_transfer_params with do_remote_prefill needs {', '.join(missing)}"
        raise SimError(400, message, "BadRequestError", "kv_transfer_params")
    request_id = str(params["remote_request_id"])
    url = f"http://{params['remote_host']}:{params['remote_port']}{PULL_PATH}"
    payload = {"remote_engine_id": params["remote_engine_id"], "remote_request_id": request_id}
    try:
        async with session.post(url, json=payload, timeout=_PULL_TIMEOUT) as response:
            body = await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise _unavailable(
            f"could not pull KV blocks from the prefill engine at {url}: {exc}"
        ) from None
    if status == 404:
        raise _unavailable(
            f"KV blocks for remote_request_id {request_id!r} are unknown or expired on the "
            f"prefill engine {params['remote_engine_id']!r}"
        )
    if status != 200:
        raise _unavailable(f"prefill engine at {url} answered {status} to the KV pull")
    answer = msgspec.json.decode(body)
    if answer.get("prompt_digest") != prompt_digest(prompt_ids):
        raise SimError(
            400,
            f"the prompt differs from the one prefilled for remote_request_id {request_id!r}",
            "BadRequestError",
            "kv_transfer_params",
        )
    return int(answer["num_tokens"])
