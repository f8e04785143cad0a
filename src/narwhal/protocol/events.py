"""Decoded engine events: the route type, JSON in and out, and small shared decisions.

An *event* is one SSE `data:` payload of an engine's stream, decoded once into a
dict (`decode_event`). Everything in `narwhal.protocol` works on that dict: the
token-ID check (`tokens`), the exposure filter (`exposure`), the non-streaming
assembler (`assembly`) and the usage helpers (`usage`).

Errors raised here and by the sibling modules are all `UpstreamError` (502):

    UpstreamError                     (narwhal.errors)
    ├── EngineError                   the engine itself reported an error mid-stream
    └── EngineOutputError             the engine sent output Narwhal cannot accept
        └── TokenIdError              … because of its token IDs (tokens.py)

Engine errors are *mapped*, never forwarded raw (PROTOCOL.md "What follows for
Narwhal": Narwhal's envelope is OpenAI's, with a string `code`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec

from narwhal.errors import UpstreamError

Route = Literal["chat", "completion"]
"""`/v1/chat/completions` ("chat") or `/v1/completions` ("completion")."""

_decoder: Final = msgspec.json.Decoder(dict[str, Any])
_encoder: Final = msgspec.json.Encoder()

# An engine's message can be arbitrarily long (stack traces, echoed prompts); the
# client gets enough of it to act on, not a copy of the engine's log.
_MAX_MESSAGE: Final = 1000


class EngineOutputError(UpstreamError):
    """The engine sent output Narwhal cannot accept: not JSON, the wrong shape, an
    unsupported field that carries a value, or bad token IDs (seed: "returns HTTP 502
    for unsupported choice or chat-delta fields that carry a value … and for malformed
    supported fields")."""


class EngineError(UpstreamError):
    """The engine reported an error itself, as an event (PROTOCOL.md §3.1 "Mid-stream
    errors", §3.3). `engine_status` is the engine's HTTP-like status when it gave one,
    `engine_type` its error type; both are for logs and metrics, never for the client."""

    def __init__(self, message: str, *, engine_status: int | None, engine_type: str | None):
        super().__init__(message)
        self.engine_status = engine_status
        self.engine_type = engine_type


def decode_event(data: bytes) -> dict[str, Any]:
    """Decode one event's data (once; every later step shares the dict)."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise EngineOutputError(f"engine sent an event that is not a JSON object: {exc}") from None
    except RecursionError:
        raise EngineOutputError("engine sent an event nested too deeply to decode") from None


def encode_event(event: Mapping[str, Any]) -> bytes:
    """The JSON of a (possibly rewritten) event, for `sse.format_event`."""
    return _encoder.encode(event)


def encode_sse_event(event: Mapping[str, Any], name: str | None = None) -> bytes:
    """A (rewritten) event as one SSE frame, under its SSE event `name` if it had one
    (SGLang's `sglext_ids`). msgspec's JSON is compact and escapes control characters,
    so it never holds a raw CR or LF and needs no line splitting (`sse.format_event`
    is the general framer)."""
    if name:
        return b"event: " + name.encode() + b"\ndata: " + _encoder.encode(event) + b"\n\n"
    return b"data: " + _encoder.encode(event) + b"\n\n"


def is_usage_only(event: Mapping[str, Any]) -> bool:
    """True for the final usage chunk: no choices, a non-null usage (PROTOCOL.md §2.2
    "Usage-only final chunk"; §6.4 for engines that send it as `choices: []`)."""
    return not event.get("choices") and event.get("usage") is not None


def finish_reasons(event: Mapping[str, Any]) -> list[str | None]:
    """The finish_reason of every choice of the event, in order (None while unfinished)."""
    choices = event.get("choices")
    if not isinstance(choices, list):
        return []
    return [c.get("finish_reason") if isinstance(c, dict) else None for c in choices]


def all_finished(event: Mapping[str, Any]) -> bool:
    """True when the event has choices and every one carries a finish_reason: the
    finishing chunk, where openai-dialect engines put the final usage (PROTOCOL.md §6.3,
    §6.4)."""
    choices = event.get("choices")
    if not choices or not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("finish_reason") is None:
            return False
    return True


def raise_for_engine_error(event: Mapping[str, Any]) -> None:
    """Raise the `EngineError` an engine's error event maps to (`engine_error`); any
    other event passes. Every decoded event goes through this once per consumer, so the
    usual one is settled by two key lookups, without the mapping."""
    if "error" in event or event.get("object") == "error":
        error = engine_error(event)
        if error is not None:
            try:
                raise error
            finally:
                # This frame stays in the error's traceback: kept here too, the error
                # would hold it in a cycle, and with it every frame below (the attempt's
                # decoder and assembler), until a full garbage collection.
                del error


def engine_error(event: Mapping[str, Any]) -> EngineError | None:
    """Map an engine's error event to an `EngineError`, or None for a normal event.

    Shapes (PROTOCOL.md §3): `{"error": {"message", "type", "code": <int>}}` (vLLM ≥ 0.10.1,
    llama.cpp, SGLang streaming, which nests its flat object), `{"error": "<string>"}`
    (transformers serve) and the flat `{"object": "error", "message", "code"}` (SGLang
    non-streaming, vLLM < 0.10.1). The message names the engine's status and type so an
    operator can tell an engine 400 from a 500; the envelope itself is Narwhal's.
    """
    if "error" in event:
        body: Any = event["error"]
        if body is None:
            return None
    elif event.get("object") == "error":
        body = event
    else:
        return None
    status: int | None = None
    kind: str | None = None
    if isinstance(body, dict):
        message: Any = body.get("message")
        code = body.get("code")
        # vLLM, SGLang and llama.cpp put the HTTP status in `code`; OpenAI puts a string.
        if type(code) is int and 100 <= code <= 599:
            status = code
        if isinstance(body.get("type"), str):
            kind = body["type"]
    else:
        message = body
    if not isinstance(message, str):
        message = "no message" if message is None else _encoder.encode(message).decode()
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "…"
    detail = " ".join(part for part in (str(status) if status else None, kind) if part)
    prefix = f"engine error ({detail})" if detail else "engine error"
    return EngineError(f"{prefix}: {message}", engine_status=status, engine_type=kind)
