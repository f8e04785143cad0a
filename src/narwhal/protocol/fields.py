"""The fields the non-streaming assembler accepts, and the checks on their values.

Seed, "Non-streaming assembly": "The non-streaming assembler returns HTTP 502 for
unsupported choice or chat-delta fields that carry a value, including audio,
annotations, and custom tool output, and for malformed supported fields."

So the choice, delta, tool-call and logprobs objects are checked against allow-lists:
a key outside its list is an error only when it carries a value (null, "", [] and {}
are accepted, because engines serialise unset fields as explicit nulls, PROTOCOL.md
§1.2, §6.1). The lists are the seed's table plus what engines really send:

- choice: `index, delta|text, logprobs, finish_reason, stop_reason` (PROTOCOL.md §2.2,
  §2.3), the ID lists `token_ids, prompt_token_ids` (§1.2, §1.3), and per-choice
  metadata kept as sent: `weight_versions` (vLLM §2.2), `routed_experts` (vLLM §2.4),
  `matched_stop` (SGLang §6.1) and, for completions, `prompt_logprobs` (vLLM §2.5).
- chat delta: `role`, and the output fields `DELTA_OUTPUT`: the text fields `content,
  reasoning, reasoning_content, refusal` and the calls `tool_calls, function_call`
  (§2.2, §2.5, §6). `audio` and anything else with a value is refused: Narwhal cannot
  assemble what it does not understand.
- tool-call fragment: `index, id, type, function{name, arguments}` (§2.2 DeltaToolCall,
  §6.3); a `type` other than "function" (custom tools) is refused.
- legacy `function_call`: `name, arguments` (§2.5).
- logprobs: chat `content, refusal` (§2.2, §2.5); completions `text_offset,
  token_logprobs, tokens, top_logprobs` (§2.3) and llama.cpp's chat-style `content`
  (§6.2).

Top-level keys are response metadata, not validated: everything the engine sends is
kept except what `TOP_LEVEL_DROPPED` names (see assembly.py).
"""

from __future__ import annotations

from typing import Any, Final, NoReturn

from narwhal.protocol.events import EngineOutputError

CHOICE_METADATA: Final = frozenset(("weight_versions", "routed_experts", "matched_stop"))
COMPLETION_CHOICE_METADATA: Final = CHOICE_METADATA | {"prompt_logprobs"}
# The chat delta fields that are generated output, the one list of them: an event
# carrying any of them must carry its token IDs (tokens.py, plain.py), the assembler
# builds the message from them, and the load generator counts them (bench/scanner.py).
# Text fields concatenate their string fragments, each under its own name.
DELTA_TEXT: Final = ("content", "reasoning", "reasoning_content", "refusal")
DELTA_CALLS: Final = ("tool_calls", "function_call")
DELTA_OUTPUT: Final = DELTA_TEXT + DELTA_CALLS
TOOL_CALL_KEYS: Final = frozenset(("index", "id", "type", "function"))
FUNCTION_KEYS: Final = frozenset(("name", "arguments"))
CHAT_LOGPROBS: Final = ("content", "refusal")
COMPLETION_LOGPROBS: Final = ("text_offset", "token_logprobs", "tokens", "top_logprobs")

LLAMACPP_COMPLETION_LOGPROBS: Final = ("content",)

# Top-level keys that are not metadata of the assembled response: `object` is
# replaced, `choices` and `usage` are assembled, `obfuscation` is OpenAI's per-chunk
# random padding (PROTOCOL.md §2.5) and means nothing once the chunks are joined, and
# an `error` key that reached the assembler is null (a non-null one raised already).
TOP_LEVEL_DROPPED: Final = frozenset(("object", "choices", "usage", "obfuscation", "error"))

_EMPTY_TYPES: Final = (str, list, dict)


def is_empty(value: Any) -> bool:
    """null, "", [] or {}: an unsupported field with such a value carries nothing."""
    return value is None or (type(value) in _EMPTY_TYPES and not value)


def unsupported(where: str, key: str) -> NoReturn:
    raise EngineOutputError(f"engine sent an unsupported {where} field {key!r} with a value")


def malformed(where: str, expected: str) -> NoReturn:
    raise EngineOutputError(f"engine sent a malformed {where}: expected {expected}")


def unexpected_choice(index: int, choices: int) -> EngineOutputError:
    """The error for a choice the request could not produce: the engine was asked for
    `choices` (its `n`), indexed from 0."""
    asked = "one choice" if choices == 1 else f"{choices} choices"
    return EngineOutputError(
        f"engine sent a malformed choice index {index}: the request asked for {asked}"
    )


def expect_str(value: Any, where: str) -> str:
    if type(value) is not str:
        malformed(where, "a string")
    return value


def expect_object(value: Any, where: str) -> dict[str, Any]:
    if type(value) is not dict:
        malformed(where, "an object")
    return value


def expect_list(value: Any, where: str) -> list[Any]:
    if type(value) is not list:
        malformed(where, "an array")
    return value


def expect_index(value: Any, where: str) -> int:
    """A stream index: a JSON integer ≥ 0 (not a Boolean, not 1.0)."""
    if type(value) is not int or value < 0:
        malformed(where, "a nonnegative integer")
    return value
