"""A generic OpenAI-compatible server, as HF `transformers serve` 5.x (PROTOCOL.md §6.3).

- Chunks are dumped with `exclude_none`: no null keys, no ids, no logprobs.
- Chat opens with `delta {"role":"assistant"}`; reasoning is `reasoning_content`; each
  tool call comes whole in one delta.
- The finishing chunk carries finish_reason and, when include_usage was asked, usage
  (its `choices` is not empty); there is no usage-only chunk and no `data: [DONE]`.
- Errors are FastAPI's `{"detail": ...}`; a streamed error is `{"error": "<string>"}`.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from narwhal.sim.events import Delta, Event, SimError
from narwhal.sim.script import TokenLogprob
from narwhal.sim.shapes_vllm import VllmShape, usage_dict

_encode: Final = msgspec.json.encode


class OpenAIShape(VllmShape):
    reasoning_key = "reasoning_content"
    fingerprint = None
    sends_done = False

    def opening(self) -> bytes:
        if not self.ctx.chat:
            return b""
        return self.choice_head + b'"delta":{"role":"assistant"}}]}\n\n'

    def chunk(self, event: Event) -> bytes:
        final = event.finish_reason is not None
        if self.ctx.chat:
            blank = event.delta.is_blank() and final
            body = b'"delta":' + (b"{}" if blank else self.delta_json(event.delta))
        else:
            body = b'"text":' + _encode(event.text)
        if not final:
            return self.choice_head + body + b"}]}\n\n"
        usage = b""
        if self.ctx.include_usage:
            usage = b',"usage":' + _encode(self._usage(event.completion_tokens))
        finish = b',"finish_reason":' + _encode(event.finish_reason)
        return self.choice_head + body + finish + b"}]" + usage + b"}\n\n"

    def _usage(self, completion_tokens: int) -> dict[str, int]:
        usage = usage_dict(len(self.ctx.prompt_ids), completion_tokens)
        return {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}

    def trailer(self, output_ids: list[int]) -> bytes:
        return b""

    def error_event(self, error: SimError) -> bytes:
        return b"data: " + _encode({"error": error.message}) + b"\n\n"

    @classmethod
    def error_body(cls, error: SimError) -> bytes:
        return _encode({"detail": error.message})

    def body(self, delta: Delta, ids: list[int], id_fault: str | None,
             logprobs: list[TokenLogprob] | None, finish_reason: str) -> bytes:  # fmt: skip
        ctx = self.ctx
        choice: dict[str, Any] = {"index": 0}
        if ctx.chat:
            message = {k: v for k, v in self._message(delta).items() if v is not None}
            choice["message"] = message
        else:
            choice["text"] = (delta.reasoning or "") + (delta.content or "")
        choice["finish_reason"] = finish_reason
        return _encode(
            {
                "id": ctx.response_id,
                "object": "chat.completion" if ctx.chat else "text_completion",
                "created": ctx.created,
                "model": ctx.model,
                "choices": [choice],
                "usage": self._usage(len(ids)),
            }
        )
