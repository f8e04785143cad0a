"""The request body every workload sends: one shape, filled with messages or a prompt.

Chat bodies carry `messages`; completions bodies carry `prompt`, the messages' texts
joined by `completion_prompt`. `--extra` is merged last, so it overrides anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

CHARS_PER_TOKEN = 4


def message_texts(messages: Sequence[Any]) -> list[str]:
    """The text of each message: a string content, or the text parts of a list content."""
    texts: list[str] = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
    return texts


def completion_prompt(messages: Sequence[Any]) -> str:
    """A conversation as one completions prompt: texts joined by newlines, except that an
    assistant message follows what precedes it directly.

    The reply to a completions prompt is generated right after its last character, so
    with this joining turn k+1's prompt starts with turn k's prompt plus its reply,
    exactly as an engine's prefix cache holds them.
    """
    parts: list[str] = []
    for message in messages:
        text = "".join(message_texts([message]))
        if parts and not (isinstance(message, dict) and message.get("role") == "assistant"):
            parts.append("\n")
        parts.append(text)
    return "".join(parts)


def estimated_tokens(messages: Sequence[Any]) -> int:
    """The prompt's size as the bench estimates it (CHARS_PER_TOKEN characters a token)."""
    return sum(len(t) for t in message_texts(messages)) // CHARS_PER_TOKEN


@dataclass(frozen=True, slots=True)
class RequestShape:
    """The flags that shape every body: endpoint, model, streaming, token ids, extra."""

    endpoint: str  # "chat" | "completions"
    model: str
    stream: bool
    token_ids: bool
    ignore_eos: bool
    extra: dict[str, Any]

    @property
    def chat(self) -> bool:
        return self.endpoint == "chat"

    def base(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "stream": self.stream}
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if self.token_ids:
            body["return_token_ids"] = True
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body

    def encode(self, messages: Sequence[Any], max_tokens: int) -> bytes:
        """A body asking for `max_tokens` after `messages` (a prompt on /v1/completions)."""
        body = self.base()
        if self.chat:
            body["messages"] = messages
        else:
            body["prompt"] = completion_prompt(messages)
        body["max_tokens"] = max_tokens
        body.update(self.extra)
        return msgspec.json.encode(body)
