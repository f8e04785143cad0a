"""A request's prompt as one canonical text, for the prefix index (sans-IO).

The router rarely has the prompt's token IDs (only with a configured tokenizer or a
token-ID prompt), so prefix-cache affinity works on text, which needs no tokenizer: two
prompts whose texts share a prefix share, on the engine, about as many tokens' worth of
KV cache. What the text must get right is order and boundaries, not the engine's exact
template.

Order is what a chat template puts first: the tool definitions (they go into the system
turn of the templates that take them), then every message in order. A conversation's
next turn (its history and one more message) therefore starts with the whole text of
the previous turn, and shares every whole block of it.

Boundaries: every field opens with NUL and a one-letter tag, and a NUL inside a client's
string is doubled, so a NUL followed by anything but NUL always opens a field. Two
requests whose messages are split or attributed differently (one message "ab" against
"a" then "b"; a user's text against a system's) can then never produce the same text.

    tools           NUL "T" compact JSON with sorted keys (rendered as text by templates)
    each message    NUL "r" role, then for each of these that is present:
      content       NUL "c" the string; a list of parts: each text part's text the same
                    way, so a single text part reads as the plain string
      other part    NUL "o" a digest of its compact JSON (see `_digest`)
      name          NUL "n" name
      tool_call_id  NUL "i" tool_call_id
      tool_calls    NUL "t" compact JSON with sorted keys

A completion prompt is its string, NUL-escaped, so no prompt can read as a chat; a list
of token IDs is NUL "I" and each ID in decimal followed by a comma, so a shorter list is
a prefix of a longer one it begins. A list holding one prompt is that prompt. A list of
several prompts is not indexed (`None`): vLLM runs each as a request of its own, each
with its own cache hit, which one chain of blocks cannot describe; such batches are rare
on a serving path, and leaving them out only forgoes their affinity.

Cost: plain strings are not copied or re-encoded, only searched once for NUL (in C); the
pieces are joined once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from narwhal.protocol.requests import CompletionRequest

_NUL: Final = "\x00"
_ESCAPED_NUL: Final = "\x00\x00"
_TOOLS: Final = "\x00T"
_ROLE: Final = "\x00r"
_CONTENT: Final = "\x00c"
_OTHER: Final = "\x00o"
_NAME: Final = "\x00n"
_TOOL_CALL_ID: Final = "\x00i"
_TOOL_CALLS: Final = "\x00t"
_TOKEN_IDS: Final = "\x00I"

_json = msgspec.json.Encoder(order="sorted")


def prompt_text(request: CompletionRequest) -> str | None:
    """The canonical text of a validated request's prompt, or None when it has none the
    index can use (a batch of several completion prompts)."""
    body = request.body
    if request.route == "chat":
        return chat_text(body["messages"], body.get("tools"))
    return completion_text(body["prompt"])


def chat_text(messages: Sequence[Mapping[str, Any]], tools: object = None) -> str:
    pieces: list[str] = []
    add = pieces.append
    if tools:
        add(_TOOLS)
        add(_compact(tools))
    for message in messages:
        add(_ROLE)
        add(_escaped(message["role"]))
        content = message.get("content")
        if isinstance(content, str):
            add(_CONTENT)
            add(_escaped(content))
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if part.get("type") == "text" else None
                if isinstance(text, str):
                    add(_CONTENT)
                    add(_escaped(text))
                else:
                    add(_OTHER)
                    add(_digest(part))
        name = message.get("name")
        if isinstance(name, str):
            add(_NAME)
            add(_escaped(name))
        call_id = message.get("tool_call_id")
        if isinstance(call_id, str):
            add(_TOOL_CALL_ID)
            add(_escaped(call_id))
        calls = message.get("tool_calls")
        if calls is not None:
            add(_TOOL_CALLS)
            add(_compact(calls))
    return "".join(pieces)


def completion_text(prompt: str | list[Any]) -> str | None:
    if isinstance(prompt, str):
        return _escaped(prompt)
    first = prompt[0]
    if isinstance(first, int):
        return _token_ids(prompt)
    if len(prompt) > 1:
        return None  # several prompts: see the module docstring
    return _escaped(first) if isinstance(first, str) else _token_ids(first)


def _token_ids(ids: list[int]) -> str:
    return _TOKEN_IDS + ",".join(map(str, ids)) + ","


def _escaped(text: str) -> str:
    # The search runs in C and almost never finds one; only then is the text copied.
    return text.replace(_NUL, _ESCAPED_NUL) if _NUL in text else text


def _compact(value: object) -> str:
    # JSON escapes every control character, NUL included: no escaping needed.
    return _json.encode(value).decode()


def _digest(part: object) -> str:
    """An image, audio or other non-text part as 16 hex digits of its JSON's hash.

    Not the JSON itself: a base64 image is megabytes of text, which would fill the index
    with thousands of blocks for one part and weigh as thousands of text tokens where
    matched characters are converted into tokens. Different parts still differ (a
    collision of 64-bit hashes only costs a wrong prediction). Python's hash is seeded
    per process, which is fine: the index lives in this process only.
    """
    return format(hash(_json.encode(part)) & 0xFFFF_FFFF_FFFF_FFFF, "016x")
