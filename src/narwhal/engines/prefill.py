"""The prefill half of a disaggregated pair (vLLM's P/D handshake, PROTOCOL.md section 4).

As vLLM's toy proxy does it: the prefill engine gets the client's body with
`kv_transfer_params` asking for a remote decode, `stream: false` and one output token;
its answer's top-level `kv_transfer_params` go to the decode engine unchanged (opaque).
Both halves carry the same X-Request-Id, and each its W3C trace context (the client's, or
the router's span of that half).
"""

from __future__ import annotations

from typing import Any

from narwhal.engines.client import EngineClient, EngineUnavailable
from narwhal.protocol.requests import CompletionRequest
from narwhal.protocol.trace_context import TraceContext

REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
# Output minimums belong to the decode half; the prefill half produces one token.
_DECODE_ONLY = ("min_tokens", "min_completion_tokens", "stream_options")


def prefill_body(request: CompletionRequest) -> dict[str, Any]:
    body = dict(request.body)
    for key in _DECODE_ONLY:
        body.pop(key, None)
    body["kv_transfer_params"] = dict(REMOTE_DECODE)
    body["stream"] = False
    body["max_tokens"] = 1
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    return body


async def run_prefill(
    client: EngineClient,
    request: CompletionRequest,
    *,
    request_id: str,
    client_authorization: str | None,
    trace: TraceContext | None = None,
) -> dict[str, Any]:
    """Run the prefill; the transfer parameters for the decode engine."""
    answer = await client.post_json(
        request.route,
        prefill_body(request),
        request_id=request_id,
        client_authorization=client_authorization,
        trace=trace,
    )
    params = answer.get("kv_transfer_params")
    if not isinstance(params, dict):
        raise EngineUnavailable(f"prefill engine {client.name} answered without kv_transfer_params")
    return params
