"""Shaping the engine request from a validated client request (sans-IO).

Token-ID engines are always asked for a stream with per-event token ids and a usage
event, whatever the client asked (DESIGN.md section 4); the relay later removes what the
client did not ask for. Engines of the generic `openai` dialect get none of vLLM's own
fields, since some such servers answer 422 to unknown fields (PROTOCOL.md section 6.3).
"""

from __future__ import annotations

from typing import Any

from narwhal.protocol.dialects import Dialect
from narwhal.protocol.requests import CompletionRequest

# vLLM-only request fields a generic OpenAI-compatible server may reject.
VLLM_ONLY_FIELDS = ("return_token_ids", "stream_interval", "kv_transfer_params")


def supplies_token_ids(dialect: Dialect, route: str) -> bool:
    """Whether the engine gives validated per-event token ids on this route.

    SGLang streams per-event ids only on /v1/completions; for streamed chat it sends them
    all at the end, which gives no per-token timing (PROTOCOL.md section 6.1).
    """
    if dialect == "vllm":
        return True
    return dialect == "sglang" and route == "completion"


def writes_null_usage(dialect: Dialect) -> bool:
    """Whether the engine sends `"usage": null` on its chunks whatever was asked: SGLang
    dumps them with their null fields (PROTOCOL.md §6.1); vLLM leaves the key out and
    OpenAI sends the null only when usage was asked (§2.5)."""
    return dialect == "sglang"


def writes_null_ids(dialect: Dialect) -> bool:
    """Whether the engine writes its ID lists as null when they were not asked for:
    vLLM does (PROTOCOL.md §1.2); SGLang leaves them out (§6.1)."""
    return dialect == "vllm"


def upstream_body(request: CompletionRequest, dialect: Dialect) -> dict[str, Any]:
    body = dict(request.body)
    body["stream"] = True
    stream_options: dict[str, Any] = {"include_usage": True}
    if request.continuous_usage:
        stream_options["continuous_usage_stats"] = True
    body["stream_options"] = stream_options
    if dialect == "vllm":
        body["return_token_ids"] = True
        body["stream_interval"] = 1
    elif dialect == "sglang":
        body.pop("stream_interval", None)
        if request.route == "completion":
            body["return_token_ids"] = True
        else:
            # SGLang rejects return_token_ids on streamed chat (400); it gives a streamed
            # chat's IDs in one `sglext` chunk at the end (PROTOCOL.md §6.1), which is
            # how a client that asked for IDs gets them.
            body.pop("return_token_ids", None)
            if request.return_token_ids:
                body["return_input_ids_in_sglext"] = True
                body["return_output_ids_in_sglext"] = True
    else:
        for field in VLLM_ONLY_FIELDS:
            body.pop(field, None)
    return body
