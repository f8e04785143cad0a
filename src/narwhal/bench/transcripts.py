"""Conversation datasets for `--workload multi-turn --dataset FILE`: one conversation a line.

Two forms are read, one per line (they may be mixed):

    {"messages": [{"role": "system"|"developer"|"user"|"assistant", "content": ...}, ...]}
    {"conversations": [{"from": "system"|"human"|"gpt", "value": "..."}, ...]}   (ShareGPT)

OpenAI `content` is a string or a list of parts; ShareGPT's `user` and `assistant`
are taken for `human` and `gpt`. Other keys on a line (ShareGPT's `id`, ...) are
ignored. Each line becomes a `Transcript`: the messages before its first user
message (system prompts) and, per user message, what the file has after it up to
the next one (its assistant reply, usually). Tool messages are refused: their
calls could not be replayed against another engine's replies.

Errors name the file and the line (`FILE:LINE: ...`), and the message's position.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal.bench.workload import DatasetError, read_jsonl

_ROLES = ("system", "developer", "user", "assistant")
_SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
}


@dataclass(frozen=True, slots=True)
class Exchange:
    user: dict[str, Any]  # the user message, as the file has it
    after: tuple[dict[str, Any], ...] = ()  # the file's messages up to the next user message


@dataclass(frozen=True, slots=True)
class Transcript:
    opening: tuple[dict[str, Any], ...]  # messages before the first user message
    exchanges: tuple[Exchange, ...]  # one per user message, at least one


def _openai_messages(where: str, messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise DatasetError(f"{where}: 'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        at = f"{where}: messages[{i}]"
        if not isinstance(message, dict):
            raise DatasetError(f"{at} must be an object")
        role = message.get("role")
        if role not in _ROLES:
            raise DatasetError(f"{at}.role must be one of {', '.join(_ROLES)}, got {role!r}")
        content = message.get("content")
        if not isinstance(content, str | list):
            raise DatasetError(f"{at}.content must be a string or a list of parts")
    return messages


def _sharegpt_messages(where: str, turns: Any) -> list[dict[str, Any]]:
    if not isinstance(turns, list) or not turns:
        raise DatasetError(f"{where}: 'conversations' must be a non-empty list")
    messages: list[dict[str, Any]] = []
    for i, turn in enumerate(turns):
        at = f"{where}: conversations[{i}]"
        if not isinstance(turn, dict):
            raise DatasetError(f"{at} must be an object")
        speaker = turn.get("from")
        role = _SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            raise DatasetError(f"{at}.from must be human, gpt or system, got {speaker!r}")
        value = turn.get("value")
        if not isinstance(value, str):
            raise DatasetError(f"{at}.value must be a string")
        messages.append({"role": role, "content": value})
    return messages


def transcript(where: str, messages: list[dict[str, Any]]) -> Transcript:
    """Cut checked messages at their user messages."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise DatasetError(f"{where}: the conversation has no user message to send")
    ends = [*users[1:], len(messages)]
    exchanges = tuple(
        Exchange(messages[start], tuple(messages[start + 1 : end]))
        for start, end in zip(users, ends, strict=True)
    )
    return Transcript(tuple(messages[: users[0]]), exchanges)


def load_transcripts(path: Path) -> list[Transcript]:
    """Parse a JSONL file of conversations (see the module docstring)."""
    found: list[Transcript] = []
    for where, obj in read_jsonl(path):
        has_openai, has_sharegpt = "messages" in obj, "conversations" in obj
        if has_openai == has_sharegpt:
            raise DatasetError(
                f"{where}: expected exactly one of 'messages' (OpenAI) and "
                "'conversations' (ShareGPT)"
            )
        if has_openai:
            messages = _openai_messages(where, obj["messages"])
        else:
            messages = _sharegpt_messages(where, obj["conversations"])
        found.append(transcript(where, messages))
    if not found:
        raise DatasetError(f"{path}: no conversations in the file")
    return found
