"""Shaping the engine request from a validated client request (sans-IO).

Token-ID engines are always asked for a stream with per-event token ids and a usage
event, whatever the client asked (DESIGN.md section 4); the relay later removes what the
client did not ask for (and puts back the echoed prompt text IDs make vLLM blank,
`echo.py`; an echo of token IDs is the one request sent without them). What each
dialect is asked comes from its capabilities (`dialects.py`): engines of the generic
`openai` dialect get none of vLLM's own fields, since some such servers answer 422 to
unknown fields (PROTOCOL.md section 6.3).
"""

from __future__ import annotations

from typing import Any, Final

from narwhal.protocol.dialects import VLLM_ONLY_FIELDS, DialectCapabilities
from narwhal.protocol.echo import engine_token_ids
from narwhal.protocol.requests import CompletionRequest

CHOICES: Final = 1
"""The choices an engine is asked for: a request's `n` is absent or 1 (`parse_request`
refuses more), and it reaches the engine as the client wrote it. A choice index past it
is malformed engine output (`OutputTracker`, `Assembler`)."""


def upstream_body(
    request: CompletionRequest,
    engine: DialectCapabilities,
    *,
    streamed: bool = True,
    priority: int = 0,
) -> dict[str, Any]:
    """The body for an engine of these capabilities; `streamed=False`: a request the
    engine answers only without streaming (`unstreamed.py`), asked as the client asked
    it, less the stream. `priority`: the request's class rank, the engine's `priority`
    where it schedules by it."""
    body = dict(request.body)
    body["stream"] = streamed
    if engine.schedules_by_priority:
        body["priority"] = priority
    if streamed:
        stream_options: dict[str, Any] = {"include_usage": True}
        if request.continuous_usage:
            stream_options["continuous_usage_stats"] = True
        body["stream_options"] = stream_options
    for field in VLLM_ONLY_FIELDS:
        if field not in engine.vllm_fields:
            body.pop(field, None)
    if request.route in engine.token_ids_on:
        if engine_token_ids(request):
            body["return_token_ids"] = True
        # (else an echo of token IDs, which the engine writes only without them: echo.py)
    else:
        # Where the engine gives no per-event IDs the field is unknown to it, or refused:
        # SGLang answers 400 to it on streamed chat.
        body.pop("return_token_ids", None)
        if request.route in engine.sglext_ids_on and request.return_token_ids:
            # SGLang gives a streamed chat's IDs in one `sglext` chunk at the end
            # (PROTOCOL.md §6.1), which is how a client that asked for IDs gets them.
            body["return_input_ids_in_sglext"] = True
            body["return_output_ids_in_sglext"] = True
    if streamed and "stream_interval" in engine.vllm_fields:
        body["stream_interval"] = 1
    return body
