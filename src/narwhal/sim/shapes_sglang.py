"""SGLang 0.5.23's variations on the OpenAI shapes (PROTOCOL.md §6.1, §3.3).

- Chunks are dumped with a plain `model_dump_json()`: every field is present, nulls
  included (`usage: null`, every delta key).
- Reasoning is `reasoning_content`; stop information is `matched_stop` (the stop
  string, the EOS id, or null), never `stop_reason`.
- Chat's finish_reason comes on its own chunk with an all-null delta.
- Ids: completions carry per-chunk `token_ids` (and `prompt_token_ids` on the first)
  only with `return_token_ids`; streamed chat carries none per event (a request asking
  for them is a 400) and sends them in one `sglext` chunk at the end when asked.
- Errors: flat `{"object":"error",...}` bodies; a streamed error is `{"error": flat}`.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from narwhal.sim.events import Delta, Event, SimError, ToolFragment
from narwhal.sim.script import TokenLogprob
from narwhal.sim.shapes_vllm import (
    DONE,
    VllmShape,
    broken_ids,
    chat_logprobs,
    completion_logprobs,
    prompt_details,
    usage_dict,
)

_encode: Final = msgspec.json.encode
_NULL_DELTA: Final = b'{"role":null,"content":null,"reasoning_content":null,"tool_calls":null}'


class SglangShape(VllmShape):
    reasoning_key = "reasoning_content"
    fingerprint = None
    content_prefix = b'{"role":null,"content":'
    content_suffix = b',"reasoning_content":null,"tool_calls":null}'
    _content_cache: dict[str, bytes] = {}

    def _tool_fragment(self, fragment: ToolFragment) -> dict[str, Any]:
        function = {"name": fragment.name, "arguments": fragment.arguments or ""}
        return {"id": fragment.call_id, "index": fragment.index, "type": "function",
                "function": function}  # fmt: skip

    def delta_json(self, delta: Delta) -> bytes:
        if delta.content is not None and delta.only_content():
            return self._content_delta(delta.content)
        out: dict[str, Any] = {
            "role": None,
            "content": delta.content,
            "reasoning_content": delta.reasoning,
            "tool_calls": [self._tool_fragment(f) for f in delta.tool_calls] or None,
        }
        self._extras(delta, out)
        return _encode(out)

    def _usage_value(self, completion_tokens: int) -> bytes:
        if not self.ctx.continuous_usage:
            return b"null"
        return _encode(usage_dict(len(self.ctx.prompt_ids), completion_tokens))

    def opening(self) -> bytes:
        if not self.ctx.chat:
            return b""
        return b"".join(
            (
                self.choice_head,
                b'"delta":{"role":"assistant","content":"","reasoning_content":null,'
                b'"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}]',
                b',"usage":',
                self._usage_value(0),
                b"}\n\n",
            )
        )

    def _completion_ids(self, event: Event) -> bytes:
        if not self.ctx.return_token_ids:
            return b""
        prompt = b""
        if event.first:
            prompt = b',"prompt_token_ids":' + _encode(self.ctx.prompt_ids)
        if event.id_fault is None:
            return prompt + b',"token_ids":' + _encode(event.ids)
        if event.id_fault == "no_token_ids":
            return prompt
        return prompt + b',"token_ids":' + _encode(broken_ids(event.ids, event.id_fault))

    def chunk(self, event: Event) -> bytes:
        final = event.finish_reason is not None
        usage = self._usage_value(event.completion_tokens)
        matched = _encode(self.ctx.matched_stop) if final else b"null"
        finish = _encode(event.finish_reason)
        if not self.ctx.chat:
            return b"".join(
                (
                    self.choice_head,
                    b'"text":',
                    _encode(event.text),
                    b',"logprobs":',
                    self._logprobs_piece(event),
                    b',"finish_reason":',
                    finish,
                    b',"matched_stop":',
                    matched,
                    self._completion_ids(event),
                    b'}],"usage":',
                    usage,
                    b"}\n\n",
                )
            )
        out = b""
        if not event.delta.is_blank():
            out = b"".join(
                (
                    self.choice_head,
                    b'"delta":',
                    self.delta_json(event.delta),
                    b',"logprobs":',
                    self._logprobs_piece(event),
                    b',"finish_reason":null,"matched_stop":null}],"usage":',
                    usage,
                    b"}\n\n",
                )
            )
        if final:
            out += b"".join(
                (
                    self.choice_head,
                    b'"delta":',
                    _NULL_DELTA,
                    b',"logprobs":null,"finish_reason":',
                    finish,
                    b',"matched_stop":',
                    matched,
                    b'}],"usage":',
                    usage,
                    b"}\n\n",
                )
            )
        return out

    def sglext(self, output_ids: list[int]) -> dict[str, Any] | None:
        ctx = self.ctx
        if not (ctx.sglext_input or ctx.sglext_output):
            return None
        return {
            "input_ids": ctx.prompt_ids if ctx.sglext_input else None,
            "output_ids": [output_ids] if ctx.sglext_output else None,
        }

    def trailer(self, output_ids: list[int]) -> bytes:
        out = b""
        ext = self.sglext(output_ids) if self.ctx.chat else None
        if ext is not None:
            payload = (
                self.head[len(b"data: ") :] + b'],"usage":null,"sglext":' + _encode(ext) + b"}"
            )
            frame = b"event: sglext_ids\ndata: " if self.ctx.sglext_framed else b"data: "
            out += frame + payload + b"\n\n"
        if self.ctx.include_usage:
            usage: dict[str, Any] = usage_dict(len(self.ctx.prompt_ids), len(output_ids))
            usage["prompt_tokens_details"] = prompt_details(self.ctx)
            out += self.head + b'],"usage":' + _encode(usage) + b"}\n\n"
        return out + DONE

    @staticmethod
    def error_object(error: SimError) -> dict[str, Any]:
        return {
            "object": "error",
            "message": error.message,
            "type": error.type,
            "param": error.param,
            "code": error.status,
        }

    @classmethod
    def error_body(cls, error: SimError) -> bytes:
        return _encode(cls.error_object(error))

    def body(self, delta: Delta, ids: list[int], id_fault: str | None,
             logprobs: list[TokenLogprob] | None, finish_reason: str) -> bytes:  # fmt: skip
        ctx = self.ctx
        token_ids: Any = ids
        if id_fault is not None and id_fault != "no_token_ids":
            token_ids = broken_ids(ids, id_fault)
        usage: dict[str, Any] = usage_dict(len(ctx.prompt_ids), len(ids))
        usage["prompt_tokens_details"] = prompt_details(ctx)
        choice: dict[str, Any] = {"index": 0}
        if ctx.chat:
            message = self._message(delta)
            for key in ("refusal", "annotations", "audio", "function_call"):
                if message.get(key) is None:
                    message.pop(key, None)
            message.setdefault("tool_calls", None)
            choice["message"] = message
            choice["logprobs"] = chat_logprobs(logprobs) if logprobs is not None else None
        else:
            choice["text"] = (delta.reasoning or "") + (delta.content or "")
            choice["logprobs"] = completion_logprobs(logprobs, 0) if logprobs is not None else None
        choice["finish_reason"] = finish_reason
        choice["matched_stop"] = ctx.matched_stop
        if ctx.return_token_ids and id_fault != "no_token_ids":
            choice["prompt_token_ids"] = ctx.prompt_ids
            choice["response_token_ids" if ctx.chat else "token_ids"] = token_ids
        body: dict[str, Any] = {
            "id": ctx.response_id,
            "object": "chat.completion" if ctx.chat else "text_completion",
            "created": ctx.created,
            "model": ctx.model,
            "choices": [choice],
            "usage": usage,
        }
        ext = self.sglext(ids)
        if ext is not None:
            body["sglext"] = ext
        return _encode(body)
