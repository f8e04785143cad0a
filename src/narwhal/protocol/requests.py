"""Client request parsing and validation (sans-IO), the seed's request-level refusal rows.

The body is decoded once. The fields the router interprets are checked for type and
collected into a `CompletionRequest`; every other field stays in `body` untouched, so
vLLM's extra sampling parameters reach the engine as the client sent them.

Errors carry the offending field in `param` as a dotted path (`messages.0.content`).
Order of checks: JSON and body shape (`jsonbody`: syntax, nesting, numbers), then the type
of every interpreted field, then the model (404), then sampling width and unsupported
options. A client's value is echoed in a message only shortened (`_shown`): a refusal is
never the size of the body that caused it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from narwhal.errors import InvalidRequest, InvalidSamplingWidth, ModelNotFound, UnsupportedOption
from narwhal.protocol.jsonbody import decode_object

Route = Literal["chat", "completion"]

MAX_TOKENS_LIMIT = 2**31 - 1
"""The largest output cap accepted (max_tokens, max_completion_tokens). No model's context
comes near it, and under it the placement arithmetic on predicted outputs (floats summed
over every request in flight) stays exact; a 400-digit integer made it overflow (a 500)."""
_SHOWN_CHARS = 64

_TOOL_CHOICE_STRINGS = ("none", "auto", "required")


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A validated completion request: interpreted fields plus the whole body."""

    route: Route
    body: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool
    max_tokens: int | None
    echo: bool = False


def parse_request(raw: bytes, route: Route, *, model: str) -> CompletionRequest:
    """Decode and validate one client body; raise an InvalidRequest subclass if it is bad."""
    body = decode_object(raw)

    requested_model = body.get("model")
    if requested_model is None:
        raise InvalidRequest("You must provide a model parameter.", param="model")
    if not isinstance(requested_model, str):
        raise _type_error("model", "a string", requested_model)

    if route == "chat":
        _check_messages(body)
    else:
        _check_prompt(body)

    stream = _optional_bool(body, "stream") or False
    include_usage, continuous_usage = _check_stream_options(body, stream)
    n = _optional_int(body, "n", minimum=1)
    best_of = _optional_int(body, "best_of", minimum=1)
    max_tokens = _optional_int(body, "max_tokens", minimum=1, maximum=MAX_TOKENS_LIMIT)
    max_completion_tokens = _optional_int(
        body, "max_completion_tokens", minimum=1, maximum=MAX_TOKENS_LIMIT
    )
    return_token_ids = _optional_bool(body, "return_token_ids") or False
    _check_logprobs(body, route)
    echo = _optional_bool(body, "echo") or False
    tool_types = _check_tools(body)
    _check_tool_choice(body)
    modalities = _check_modalities(body)
    audio = body.get("audio")
    if audio is not None and not isinstance(audio, dict):
        raise _type_error("audio", "an object", audio)

    if requested_model != model:
        raise ModelNotFound(requested_model)
    if n is not None and n > 1:
        raise InvalidSamplingWidth("n")
    if best_of is not None and best_of > 1:
        raise InvalidSamplingWidth("best_of")
    for index, tool_type in enumerate(tool_types):
        if tool_type != "function":
            raise UnsupportedOption(
                f"Tool type {_shown(tool_type)} is not supported; only 'function' tools are.",
                param=f"tools.{index}.type",
            )
    if not stream:
        if audio is not None:
            raise UnsupportedOption(
                "Audio output is not supported for non-streaming requests.", param="audio"
            )
        for modality in modalities:
            if modality != "text":
                raise UnsupportedOption(
                    f"Output modality {_shown(modality)} is not supported for non-streaming "
                    "requests.",
                    param="modalities",
                )

    return CompletionRequest(
        route=route,
        body=body,
        model=requested_model,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
        return_token_ids=return_token_ids,
        max_tokens=max_completion_tokens if max_completion_tokens is not None else max_tokens,
        echo=echo,
    )


def check_one_prompt(request: CompletionRequest) -> None:
    """Refuse a batch of prompts (a list of strings or of ID lists, more than one; a flat
    list of IDs is one prompt): vLLM answers one choice per prompt, but the router admits,
    sizes, projects and places one prompt per request, so a batch is refused before any
    engine work (400 naming `prompt`) rather than sent as a request no projection was
    made for, whose answer the relay could not account choice by choice."""
    prompt = request.body.get("prompt") if request.route == "completion" else None
    if isinstance(prompt, list) and len(prompt) > 1 and not _is_int(prompt[0]):
        raise InvalidRequest(
            f"'prompt' holds {len(prompt)} prompts; this router serves one prompt per "
            "request: send each prompt as its own request.",
            param="prompt",
        )


# --- field checks -----------------------------------------------------------------------------


def _type_error(param: str, expected: str, got: object) -> InvalidRequest:
    return InvalidRequest(f"'{param}' must be {expected}, got {_json_type(got)}.", param=param)


def _shown(value: str | int) -> str:
    """A client's value for a message: repr for a string, digits for an integer, shortened."""
    text = repr(value) if isinstance(value, str) else str(value)
    if len(text) <= _SHOWN_CHARS:
        return text
    return f"{text[: _SHOWN_CHARS - 12]}… ({len(text)} characters)"


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _optional_bool(body: Mapping[str, Any], key: str, prefix: str = "") -> bool | None:
    value = body.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise _type_error(prefix + key, "a boolean", value)


def _is_int(value: object) -> bool:
    # JSON true/false decode to bool, a subclass of int; they are not integers here.
    return isinstance(value, int) and not isinstance(value, bool)


def _optional_int(
    body: Mapping[str, Any], key: str, *, minimum: int, maximum: int | None = None
) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_int(value):
        raise _type_error(key, "an integer", value)
    assert isinstance(value, int)
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"at least {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise InvalidRequest(f"'{key}' must be {bound}, got {_shown(value)}.", param=key)
    return value


def _check_messages(body: Mapping[str, Any]) -> None:
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequest("'messages' is a required property.", param="messages")
    if not isinstance(messages, list):
        raise _type_error("messages", "an array", messages)
    if not messages:
        raise InvalidRequest("'messages' must contain at least one message.", param="messages")
    for i, message in enumerate(messages):
        path = f"messages.{i}"
        if not isinstance(message, dict):
            raise _type_error(path, "an object", message)
        role = message.get("role")
        if not isinstance(role, str):
            raise _type_error(f"{path}.role", "a string", role)
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise _type_error(f"{path}.content", "a string or an array of parts", content)
        for j, part in enumerate(content):
            part_path = f"{path}.content.{j}"
            if not isinstance(part, dict):
                raise _type_error(part_path, "an object", part)
            part_type = part.get("type")
            if not isinstance(part_type, str):
                raise _type_error(f"{part_path}.type", "a string", part_type)
            if part_type == "text" and not isinstance(part.get("text"), str):
                raise _type_error(f"{part_path}.text", "a string", part.get("text"))


def _check_prompt(body: Mapping[str, Any]) -> None:
    prompt = body.get("prompt")
    if prompt is None:
        raise InvalidRequest("'prompt' is a required property.", param="prompt")
    if isinstance(prompt, str):
        return
    expected = "a string, an array of strings or an array of token ids"
    if not isinstance(prompt, list) or not prompt:
        raise _type_error("prompt", expected, prompt)
    if all(_is_int(t) for t in prompt):
        return
    for i, item in enumerate(prompt):
        if isinstance(item, str):
            continue
        if isinstance(item, list) and item and all(_is_int(t) for t in item):
            continue
        raise _type_error(f"prompt.{i}", "a string or an array of token ids", item)


def _check_stream_options(body: Mapping[str, Any], stream: bool) -> tuple[bool, bool]:
    options = body.get("stream_options")
    if options is None:
        return False, False
    if not isinstance(options, dict):
        raise _type_error("stream_options", "an object", options)
    include_usage = _optional_bool(options, "include_usage", "stream_options.") or False
    continuous = _optional_bool(options, "continuous_usage_stats", "stream_options.") or False
    if not stream:
        # As vLLM and OpenAI answer: the option only means something for a stream.
        raise InvalidRequest(
            "Stream options can only be defined when `stream=True`.", param="stream_options"
        )
    return include_usage, continuous


def _check_logprobs(body: Mapping[str, Any], route: Route) -> None:
    if route == "chat":
        _optional_bool(body, "logprobs")
        _optional_int(body, "top_logprobs", minimum=0, maximum=20)
    else:
        _optional_int(body, "logprobs", minimum=0, maximum=20)
        if body.get("top_logprobs") is not None:
            _optional_int(body, "top_logprobs", minimum=0, maximum=20)


def _check_tools(body: Mapping[str, Any]) -> list[str]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _type_error("tools", "an array", tools)
    types: list[str] = []
    for i, tool in enumerate(tools):
        path = f"tools.{i}"
        if not isinstance(tool, dict):
            raise _type_error(path, "an object", tool)
        tool_type = tool.get("type", "function")
        if not isinstance(tool_type, str):
            raise _type_error(f"{path}.type", "a string", tool_type)
        if tool_type == "function":
            function = tool.get("function")
            if not isinstance(function, dict):
                raise _type_error(f"{path}.function", "an object", function)
            if not isinstance(function.get("name"), str):
                raise _type_error(f"{path}.function.name", "a string", function.get("name"))
        types.append(tool_type)
    return types


def _check_tool_choice(body: Mapping[str, Any]) -> None:
    choice = body.get("tool_choice")
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in _TOOL_CHOICE_STRINGS:
            raise InvalidRequest(
                f"'tool_choice' must be one of {', '.join(_TOOL_CHOICE_STRINGS)} or an object, "
                f"got {_shown(choice)}.",
                param="tool_choice",
            )
        return
    if not isinstance(choice, dict):
        raise _type_error("tool_choice", "a string or an object", choice)
    choice_type = choice.get("type")
    if not isinstance(choice_type, str):
        raise _type_error("tool_choice.type", "a string", choice_type)
    if choice_type != "function":
        raise UnsupportedOption(
            f"Tool choice type {_shown(choice_type)} is not supported; only 'function' is.",
            param="tool_choice.type",
        )
    function = choice.get("function")
    if not isinstance(function, dict):
        raise _type_error("tool_choice.function", "an object", function)
    if not isinstance(function.get("name"), str):
        raise _type_error("tool_choice.function.name", "a string", function.get("name"))


def _check_modalities(body: Mapping[str, Any]) -> list[str]:
    modalities = body.get("modalities")
    if modalities is None:
        return []
    if not isinstance(modalities, list):
        raise _type_error("modalities", "an array of strings", modalities)
    for i, modality in enumerate(modalities):
        if not isinstance(modality, str):
            raise _type_error(f"modalities.{i}", "a string", modality)
    return modalities
