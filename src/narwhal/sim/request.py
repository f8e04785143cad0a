"""Request bodies: decoded once into typed structs, checked the way vLLM checks them.

Only the fields the sim interprets are declared; everything else in the body is
accepted and ignored (temperature, top_p ...), as an engine would. The `openai`
dialect additionally refuses vLLM's extension fields with 422, like a server that
validates against OpenAI's schema (`transformers serve`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from narwhal.protocol.tokenizer import SimTokenizer, message_text
from narwhal.sim.events import SimError

# Fields a server that follows OpenAI's schema rejects (vLLM / SGLang extensions).
VLLM_ONLY_FIELDS: Final = frozenset(
    {
        "return_token_ids",
        "stream_interval",
        "kv_transfer_params",
        "return_tokens_as_token_ids",
        "prompt_logprobs",
        "return_prompt_text",
        "return_prompt_token_ids",
        "return_input_ids_in_sglext",
        "return_output_ids_in_sglext",
    }
)
_MAX_LOGPROBS: Final = 20
_PATH_RE: Final = re.compile(r"at `\$\.([^`\[]+)")


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class _Body(msgspec.Struct, kw_only=True):
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool | None = False
    seed: int | None = None
    n: int | None = 1
    best_of: int | None = None
    return_token_ids: bool | None = None
    stream_interval: int | None = None
    kv_transfer_params: dict[str, Any] | None = None
    request_id: str | None = None
    tools: list[Any] | None = None
    prompt_logprobs: int | None = None
    return_prompt_token_ids: bool | None = None
    return_input_ids_in_sglext: bool | None = None
    return_output_ids_in_sglext: bool | None = None
    priority: int | None = None  # vLLM: with --scheduling-policy priority, lower first


class ChatBody(_Body, kw_only=True):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    echo: bool | None = False


class CompletionBody(_Body, kw_only=True):
    prompt: str | list[Any]
    logprobs: int | None = None
    echo: bool | None = False


@dataclass(slots=True)
class ParsedRequest:
    """A body reduced to what the sim acts on."""

    chat: bool
    body: ChatBody | CompletionBody
    prompt_ids: list[int]
    directive_text: str  # where `#sim:` directives are read from
    max_tokens: int | None
    top_logprobs: int | None  # None: logprobs off
    stop: tuple[str, ...]
    tool_names: tuple[str, ...]


def bad_request(message: str, param: str | None = None) -> SimError:
    return SimError(400, message, "BadRequestError", param)


def decode_body(raw: bytes, chat: bool, *, openai_schema: bool) -> ChatBody | CompletionBody:
    kind: type[ChatBody] | type[CompletionBody] = ChatBody if chat else CompletionBody
    try:
        if openai_schema:
            mapping = msgspec.json.decode(raw)
            if not isinstance(mapping, dict):
                raise SimError(422, "request body must be a JSON object", "Unprocessable Entity")
            unknown = sorted(VLLM_ONLY_FIELDS.intersection(mapping))
            if unknown:
                message = f"Unexpected fields for this OpenAI-compatible server: {unknown}"
                raise SimError(422, message, "Unprocessable Entity", unknown[0])
            return msgspec.convert(mapping, kind)
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        match = _PATH_RE.search(str(exc))
        raise bad_request(str(exc), match.group(1) if match else None) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None


def _prompt_ids(body: CompletionBody, tokenizer: SimTokenizer) -> tuple[list[int], str]:
    prompt = body.prompt
    if isinstance(prompt, str):
        return tokenizer.completion_prompt_ids(prompt), prompt
    if prompt and all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
        ids = [int(x) for x in prompt]
        if min(ids) < 0 or max(ids) >= tokenizer.vocab_size:
            raise bad_request("prompt token ids must be in [0, vocab_size)", "prompt")
        return ids, tokenizer.decode(ids)
    if len(prompt) == 1:
        (only,) = prompt
        if isinstance(only, str):
            return tokenizer.completion_prompt_ids(only), only
        if isinstance(only, list):
            body.prompt = only
            return _prompt_ids(body, tokenizer)
    if not prompt:
        raise bad_request("prompt must not be empty", "prompt")
    raise bad_request("narwhal sim serves one prompt per request", "prompt")


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return message_text(message.get("content"))
    return ""


def _tool_names(tools: list[Any] | None) -> tuple[str, ...]:
    names: list[str] = []
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str):
            names.append(name)
    return tuple(names)


def interpret(body: ChatBody | CompletionBody, tokenizer: SimTokenizer) -> ParsedRequest:
    """Checks in vLLM's order; raises `SimError` (400) on the first failure."""
    if body.n is not None and body.n != 1:
        raise bad_request("narwhal sim supports n=1 only", "n")
    if body.best_of is not None and body.best_of > 1:
        raise bad_request("narwhal sim supports best_of=1 only", "best_of")
    if body.stream_options is not None and not body.stream:
        raise bad_request(
            "Stream options can only be defined when `stream=True`.", "stream_options"
        )
    prompt_logprobs = body.prompt_logprobs
    if prompt_logprobs is not None:
        # vLLM's protocol validation, in its words (0 streams: no prompt logprobs asked).
        if body.stream and (prompt_logprobs > 0 or prompt_logprobs == -1):
            raise bad_request(
                "`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs"
            )
        if prompt_logprobs < 0 and prompt_logprobs != -1:
            raise bad_request(
                "`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs"
            )
    if body.stream_interval is not None and body.stream_interval < 1:
        raise bad_request("stream_interval must be at least 1", "stream_interval")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    stop = tuple(s for s in stop if s)
    if isinstance(body, ChatBody):
        if not body.messages:
            raise bad_request("messages must not be empty", "messages")
        max_tokens = body.max_completion_tokens
        param = "max_completion_tokens"
        if max_tokens is None:
            max_tokens, param = body.max_tokens, "max_tokens"
        top: int | None = None
        if body.logprobs:
            top = body.top_logprobs or 0
        elif body.top_logprobs:
            raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
        if top is not None and not 0 <= top <= _MAX_LOGPROBS:
            raise bad_request(f"top_logprobs must be in [0, {_MAX_LOGPROBS}]", "top_logprobs")
        prompt_ids = tokenizer.chat_prompt_ids(body.messages)
        directive_text = _last_user_text(body.messages)
    else:
        max_tokens, param = body.max_tokens, "max_tokens"
        top = body.logprobs
        if top is not None and not 0 <= top <= _MAX_LOGPROBS:
            raise bad_request(f"logprobs must be in [0, {_MAX_LOGPROBS}]", "logprobs")
        prompt_ids, directive_text = _prompt_ids(body, tokenizer)
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(f"{param} must be at least 1, got {max_tokens}.", param)
    return ParsedRequest(
        chat=isinstance(body, ChatBody),
        body=body,
        prompt_ids=prompt_ids,
        directive_text=directive_text,
        max_tokens=max_tokens,
        top_logprobs=top,
        stop=stop,
        tool_names=_tool_names(body.tools),
    )


def check_context(prompt_len: int, max_tokens: int | None, context_len: int) -> int:
    """The effective max_tokens, or the 400 vLLM gives when the request cannot fit."""
    if max_tokens is None:
        if prompt_len >= context_len:
            raise bad_request(
                f"This model's maximum context length is {context_len} tokens. However, your "
                f"request has {prompt_len} input tokens. Please reduce the length of the input."
            )
        return context_len - prompt_len
    if prompt_len + max_tokens > context_len:
        raise bad_request(
            f"This model's maximum context length is {context_len} tokens. However, you "
            f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion."
        )
    return max_tokens
