"""vLLM 0.33's response shapes (PROTOCOL.md §1-§3), byte for byte where it matters.

Streamed chunks are spliced from a per-request prefix (id, object, created, model) and
small encoded pieces, so the common event (one content token) costs a few byte joins
and no dict building. Which keys appear as `null` follows vLLM's serialisers:
chunks are dumped with `exclude_unset`, so keys vLLM sets to None on purpose
(`logprobs`, `finish_reason`, `token_ids`, `kv_transfer_params` ...) are present; the
usage-only chunk is dumped with `exclude_none`; non-streaming bodies with a plain
`model_dump()`, so every field is there.

The SGLang and generic-OpenAI shapes subclass this one and override what differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import msgspec

from narwhal.sim.events import Delta, Event, SimError, ToolFragment, merge_calls
from narwhal.sim.script import TokenLogprob

_encode: Final = msgspec.json.encode
DONE: Final = b"data: [DONE]\n\n"
_NULL: Final = b"null"
_CITATION_URL: Final = "https://example.com/narwhal-sim"
_CACHE_LIMIT: Final = 1 << 16


@dataclass(slots=True)
class ShapeContext:
    """Everything about one request that its chunks repeat or depend on."""

    response_id: str
    created: int
    model: str
    chat: bool
    prompt_ids: list[int]
    return_token_ids: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    logprobs: bool = False
    stop_reason: str | int | None = None
    matched_stop: str | int | None = None
    kv_transfer_params: dict[str, Any] | None = None
    cached_tokens: int | None = None  # set when the server reports prompt_tokens_details
    sglext_input: bool = False
    sglext_output: bool = False
    sglext_framed: bool = False
    # Completions' `echo`: the prompt's text, which goes in front of the first text unless
    # IDs were asked (vLLM then blanks it: completion/serving.py); the echo chunk carries
    # the prompt's IDs either way.
    echo_text: str | None = None
    # Chat's `echo`: the last message's text, when it is the assistant's (vLLM echoes the
    # message whose role the answer continues), sent after the role chunk without IDs.
    chat_echo: str | None = None
    # `prompt_logprobs` (non-streaming only): how many top logprobs per prompt token.
    prompt_logprobs: int | None = None


def prompt_logprobs(ctx: ShapeContext) -> list[dict[str, Any] | None] | None:
    """vLLM's `prompt_logprobs`: null for the first prompt token (nothing precedes it),
    then each token's own logprob keyed by its ID (the sim's are all -1.0, rank 1)."""
    if ctx.prompt_logprobs is None:
        return None
    tail = [
        {str(token): {"logprob": -1.0, "rank": 1, "decoded_token": f"<{token}>"}}
        for token in ctx.prompt_ids[1:]
    ]
    return [None, *tail]


def usage_dict(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def prompt_details(ctx: ShapeContext) -> dict[str, int] | None:
    """usage.prompt_tokens_details: `{"cached_tokens": N}`, or None when not reported."""
    return None if ctx.cached_tokens is None else {"cached_tokens": ctx.cached_tokens}


def broken_ids(ids: list[int], fault: str) -> Any:
    """The token_ids value of an event broken by a `#sim:` id fault (first id hit)."""
    if fault == "bool_token_id":
        return [True, *ids[1:]]
    if fault == "negative_token_id":
        return [-1, *ids[1:]]
    return ",".join(map(str, ids))  # malformed_token_ids: a string, not a list


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": e.token,
                "logprob": e.logprob,
                "bytes": list(e.token.encode()),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in e.top
                ],
            }
            for e in entries
        ]
    }


def completion_logprobs(entries: list[TokenLogprob], offset: int) -> dict[str, Any]:
    offsets: list[int] = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    return {
        "text_offset": offsets,
        "token_logprobs": [e.logprob for e in entries],
        "tokens": [e.token for e in entries],
        "top_logprobs": [dict(e.top) if e.top else {e.token: e.logprob} for e in entries],
    }


class VllmShape:
    reasoning_key = "reasoning"
    fingerprint: str | None = "vllm-0.33.0-narwhal-sim"
    sends_done = True
    # The common event's delta, `{"content": <piece>}`, encoded once per distinct piece.
    content_prefix = b'{"content":'
    content_suffix = b"}"
    _content_cache: dict[str, bytes] = {}

    def __init__(self, ctx: ShapeContext) -> None:
        self.ctx = ctx
        obj = b"chat.completion.chunk" if ctx.chat else b"text_completion"
        self.head = b"".join(
            (
                b'data: {"id":',
                _encode(ctx.response_id),
                b',"object":"',
                obj,
                b'","created":',
                str(ctx.created).encode(),
                b',"model":',
                _encode(ctx.model),
                b',"choices":[',
            )
        )
        self.choice_head = self.head + b'{"index":0,'

    # -- pieces ------------------------------------------------------------------------
    def _content_delta(self, text: str) -> bytes:
        cache = self._content_cache
        cached = cache.get(text)
        if cached is None:
            cached = self.content_prefix + _encode(text) + self.content_suffix
            if len(cache) < _CACHE_LIMIT:
                cache[text] = cached
        return cached

    def _tool_fragment(self, fragment: ToolFragment) -> dict[str, Any]:
        out: dict[str, Any] = {}
        function: dict[str, Any] = {}
        if fragment.call_id is not None:
            out["id"] = fragment.call_id
            out["type"] = "function"
        out["index"] = fragment.index
        if fragment.name is not None:
            function["name"] = fragment.name
        if fragment.arguments is not None:
            function["arguments"] = fragment.arguments
        out["function"] = function
        return out

    def _extras(self, delta: Delta, out: dict[str, Any]) -> None:
        """Fields vLLM never sends but other OpenAI-compatible engines do (scenarios)."""
        if delta.refusal is not None:
            out["refusal"] = delta.refusal
        if delta.function_name is not None or delta.function_args is not None:
            call: dict[str, str] = {}
            if delta.function_name is not None:
                call["name"] = delta.function_name
            if delta.function_args is not None:
                call["arguments"] = delta.function_args
            out["function_call"] = call
        if delta.audio_transcript is not None:
            out["audio"] = self._audio(delta.audio_transcript)
        if delta.annotated:
            out["annotations"] = self._annotations(delta.content or "")

    def _audio(self, transcript: str) -> dict[str, Any]:
        return {
            "id": "audio_narwhal_sim",
            "data": "UklGRiQAAABXQVZF",
            "expires_at": self.ctx.created + 3600,
            "transcript": transcript,
        }

    @staticmethod
    def _annotations(text: str) -> list[dict[str, Any]]:
        citation = {
            "start_index": 0,
            "end_index": len(text),
            "title": "Narwhal sim citation",
            "url": _CITATION_URL,
        }
        return [{"type": "url_citation", "url_citation": citation}]

    def delta_json(self, delta: Delta) -> bytes:
        if delta.content is not None and delta.only_content():
            return self._content_delta(delta.content)
        out: dict[str, Any] = {}
        if delta.content is not None:
            out["content"] = delta.content
        if delta.reasoning is not None:
            out[self.reasoning_key] = delta.reasoning
        if delta.tool_calls:
            out["tool_calls"] = [self._tool_fragment(f) for f in delta.tool_calls]
        self._extras(delta, out)
        return _encode(out)

    def _ids_piece(self, event: Event) -> bytes:
        if not self.ctx.return_token_ids:
            return b',"token_ids":null'
        if event.id_fault is None:
            return b',"token_ids":' + _encode(event.ids)
        if event.id_fault == "no_token_ids":
            return b""
        return b',"token_ids":' + _encode(broken_ids(event.ids, event.id_fault))

    def _usage_piece(self, completion_tokens: int) -> bytes:
        if not self.ctx.continuous_usage:
            return b""
        usage = usage_dict(len(self.ctx.prompt_ids), completion_tokens)
        return b',"usage":' + _encode(usage)

    def _logprobs_piece(self, event: Event) -> bytes:
        if event.logprobs is None:
            return _NULL
        if self.ctx.chat:
            return _encode(chat_logprobs(event.logprobs))
        return _encode(completion_logprobs(event.logprobs, event.text_offset))

    def _terminal_fingerprint(self) -> bytes:
        if self.fingerprint is None or self.ctx.include_usage:
            return b""
        return b',"system_fingerprint":"' + self.fingerprint.encode() + b'"'

    def _kv_piece(self, final: bool) -> bytes:
        kv = self.ctx.kv_transfer_params if final else None
        return b',"kv_transfer_params":' + (_NULL if kv is None else _encode(kv))

    # -- the stream --------------------------------------------------------------------
    def opening(self) -> bytes:
        """Chat's role chunk, sent with the first token's event; completions have none."""
        if not self.ctx.chat:
            return b""
        ids = _encode(self.ctx.prompt_ids) if self.ctx.return_token_ids else _NULL
        role = b"".join(
            (
                self.choice_head,
                b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]',
                self._usage_piece(0),
                b',"prompt_token_ids":',
                ids,
                b',"prompt_text":null}\n\n',
            )
        )
        if not self.ctx.chat_echo:
            return role
        echo = b"".join(
            (
                self.choice_head,
                b'"delta":',
                _encode({"content": self.ctx.chat_echo}),
                b',"logprobs":null,"finish_reason":null}]',
                self._usage_piece(0),
                b"}\n\n",
            )
        )
        return role + echo

    def chunk(self, event: Event) -> bytes:
        final = event.finish_reason is not None
        finish = b'"' + event.finish_reason.encode() + b'"' if event.finish_reason else _NULL
        if self.ctx.chat:
            body = (b'"delta":', self.delta_json(event.delta))
            stop = b',"stop_reason":' + _encode(self.ctx.stop_reason) if final else b""
            tail = b',"weight_versions":null}]' if final else b"}]"
            return b"".join(
                (
                    self.choice_head,
                    *body,
                    b',"logprobs":',
                    self._logprobs_piece(event),
                    b',"finish_reason":',
                    finish,
                    stop,
                    self._ids_piece(event),
                    tail,
                    self._usage_piece(event.completion_tokens),
                    self._terminal_fingerprint() if final else b"",
                    self._kv_piece(final),
                    b"}\n\n",
                )
            )
        prompt_ids = b"null"
        echo = self.ctx.echo_text
        text = event.text
        if event.first and (self.ctx.return_token_ids or echo is not None):
            prompt_ids = _encode(self.ctx.prompt_ids)
        if event.first and echo is not None and not self.ctx.return_token_ids:
            text = echo + text
        annotations = b""
        if event.delta.annotated:
            annotations = b',"annotations":' + _encode(self._annotations(event.text))
        return b"".join(
            (
                self.choice_head,
                b'"text":',
                _encode(text),
                b',"logprobs":',
                self._logprobs_piece(event),
                b',"finish_reason":',
                finish,
                b',"stop_reason":',
                _encode(self.ctx.stop_reason) if final else _NULL,
                b',"prompt_token_ids":',
                prompt_ids,
                self._ids_piece(event),
                b',"weight_versions":null',
                annotations,
                b"}]",
                self._usage_piece(event.completion_tokens),
                self._terminal_fingerprint() if final else b"",
                self._kv_piece(final),
                b"}\n\n",
            )
        )

    def trailer(self, output_ids: list[int]) -> bytes:
        """After the finishing chunk: the usage-only chunk when asked, then [DONE]."""
        if not self.ctx.include_usage:
            return DONE
        usage: dict[str, Any] = usage_dict(len(self.ctx.prompt_ids), len(output_ids))
        details = prompt_details(self.ctx)
        if details is not None:  # the chunk is dumped without null keys
            usage["prompt_tokens_details"] = details
        fingerprint = b""
        if self.fingerprint is not None:
            fingerprint = b',"system_fingerprint":"' + self.fingerprint.encode() + b'"'
        return self.head + b'],"usage":' + _encode(usage) + fingerprint + b"}\n\n" + DONE

    def error_event(self, error: SimError) -> bytes:
        return b"data: " + _encode({"error": self.error_object(error)}) + b"\n\n" + DONE

    # -- errors --------------------------------------------------------------------------
    @staticmethod
    def error_object(error: SimError) -> dict[str, Any]:
        return {
            "message": error.message,
            "type": error.type,
            "param": error.param,
            "code": error.status,
        }

    @classmethod
    def error_body(cls, error: SimError) -> bytes:
        return _encode({"error": cls.error_object(error)})

    # -- non-streaming -------------------------------------------------------------------
    def body(self, delta: Delta, ids: list[int], id_fault: str | None,
             logprobs: list[TokenLogprob] | None, finish_reason: str) -> bytes:  # fmt: skip
        ctx = self.ctx
        token_ids: Any = ids if ctx.return_token_ids else None
        if ctx.return_token_ids and id_fault is not None:
            token_ids = None if id_fault == "no_token_ids" else broken_ids(ids, id_fault)
        usage: dict[str, Any] = usage_dict(len(ctx.prompt_ids), len(ids))
        usage |= {"prompt_tokens_details": prompt_details(ctx), "completion_tokens_details": None}
        prompt_ids = ctx.prompt_ids if ctx.return_token_ids else None
        if ctx.chat:
            choice = {
                "index": 0,
                "message": self._message(delta),
                "logprobs": chat_logprobs(logprobs) if logprobs is not None else None,
                "finish_reason": finish_reason,
                "stop_reason": ctx.stop_reason,
                "token_ids": token_ids,
                "routed_experts": None,
                "weight_versions": None,
            }
            return _encode(
                {"id": ctx.response_id, "object": "chat.completion", "created": ctx.created,
                 "model": ctx.model, "choices": [choice],
                 "service_tier": None, "system_fingerprint": self.fingerprint, "usage": usage,
                 "prompt_logprobs": prompt_logprobs(ctx), "prompt_token_ids": prompt_ids,
                 "prompt_text": None,
                 "kv_transfer_params": ctx.kv_transfer_params, "ec_transfer_params": None,
                 "metrics": None}
            )  # fmt: skip
        text = (delta.reasoning or "") + (delta.content or "")
        if ctx.echo_text is not None and not ctx.return_token_ids:
            text = ctx.echo_text + text
        completion_choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": completion_logprobs(logprobs, 0) if logprobs is not None else None,
            "finish_reason": finish_reason,
            "stop_reason": ctx.stop_reason,
            "prompt_logprobs": prompt_logprobs(ctx),
            "prompt_token_ids": prompt_ids,
            "token_ids": token_ids,
        }
        if delta.annotated:
            completion_choice["annotations"] = self._annotations(text)
        return _encode(
            {"id": ctx.response_id, "object": "text_completion", "created": ctx.created,
             "model": ctx.model, "choices": [completion_choice],
             "service_tier": None, "system_fingerprint": self.fingerprint, "usage": usage,
             "kv_transfer_params": ctx.kv_transfer_params}
        )  # fmt: skip

    def _message(self, delta: Delta) -> dict[str, Any]:
        message = self._generated_message(delta)
        if self.ctx.chat_echo:
            message["content"] = self.ctx.chat_echo + (message["content"] or "")
        return message

    def _generated_message(self, delta: Delta) -> dict[str, Any]:
        calls = merge_calls(delta.tool_calls)
        function_call = None
        if delta.function_name is not None:
            function_call = {"name": delta.function_name, "arguments": delta.function_args or ""}
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if calls or function_call else (delta.content or ""),
            "refusal": delta.refusal,
            "annotations": self._annotations(delta.content or "") if delta.annotated else None,
            "audio": self._audio(delta.audio_transcript) if delta.audio_transcript else None,
            "function_call": function_call,
        }
        if calls:  # left out when empty since vLLM 0.25
            message["tool_calls"] = [self._full_call(call) for call in calls]
        message[self.reasoning_key] = delta.reasoning
        return message

    @staticmethod
    def _full_call(call: ToolFragment) -> dict[str, Any]:
        function = {"name": call.name, "arguments": call.arguments or ""}
        return {"id": call.call_id, "type": "function", "function": function}
