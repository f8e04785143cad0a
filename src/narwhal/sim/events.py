"""Dialect-neutral events: what one streamed chunk (or a whole response) says.

The emitter groups a script's tokens into events and merges their parts into a
`Delta`; a dialect's shape turns a `Delta` into that dialect's JSON.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from narwhal.sim.script import (
    Annotated,
    Audio,
    FunctionArgs,
    FunctionName,
    Part,
    Text,
    TokenLogprob,
    ToolArgs,
    ToolStart,
    ToolWhole,
)


@dataclass(slots=True)
class ToolFragment:
    index: int
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None  # None: the fragment has no arguments key


@dataclass(slots=True)
class Delta:
    content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolFragment] = field(default_factory=list)
    function_name: str | None = None
    function_args: str | None = None
    audio_transcript: str | None = None
    annotated: bool = False

    def is_empty(self) -> bool:
        return (
            self.content is None
            and self.reasoning is None
            and self.refusal is None
            and not self.tool_calls
            and self.function_name is None
            and self.function_args is None
            and self.audio_transcript is None
        )

    def is_blank(self) -> bool:
        """Nothing to say, or only an empty content string (the EOS token's event)."""
        return self.is_empty() or (self.content == "" and self.only_content())

    def only_content(self) -> bool:
        return (
            self.reasoning is None
            and self.refusal is None
            and not self.tool_calls
            and self.function_name is None
            and self.function_args is None
            and self.audio_transcript is None
            and not self.annotated
        )


def _join(old: str | None, new: str) -> str:
    return new if old is None else old + new


def merge_parts(parts: Iterable[Part | None]) -> Delta:
    """One event's delta from its tokens' parts (None parts are held back: nothing)."""
    delta = Delta()
    for part in parts:
        if part is None:
            continue
        if isinstance(part, Text):
            if part.channel == "content":
                delta.content = _join(delta.content, part.text)
            elif part.channel == "reasoning":
                delta.reasoning = _join(delta.reasoning, part.text)
            else:
                delta.refusal = _join(delta.refusal, part.text)
        elif isinstance(part, ToolStart):
            delta.tool_calls.append(ToolFragment(part.index, part.call_id, part.name))
        elif isinstance(part, ToolArgs):
            last = delta.tool_calls[-1] if delta.tool_calls else None
            if last is not None and last.index == part.index:
                last.arguments = _join(last.arguments, part.text)
            else:
                delta.tool_calls.append(ToolFragment(part.index, arguments=part.text))
        elif isinstance(part, ToolWhole):
            delta.tool_calls.append(
                ToolFragment(part.index, part.call_id, part.name, part.arguments)
            )
        elif isinstance(part, FunctionName):
            delta.function_name = part.name
        elif isinstance(part, FunctionArgs):
            delta.function_args = _join(delta.function_args, part.text)
        elif isinstance(part, Audio):
            delta.audio_transcript = _join(delta.audio_transcript, part.transcript)
        elif isinstance(part, Annotated):
            delta.content = _join(delta.content, part.text)
            delta.annotated = True
    return delta


def merge_calls(fragments: Iterable[ToolFragment]) -> list[ToolFragment]:
    """Whole calls from fragments, joined per index in index order (non-streaming bodies)."""
    calls: dict[int, ToolFragment] = {}
    for fragment in fragments:
        call = calls.setdefault(fragment.index, ToolFragment(fragment.index, arguments=""))
        call.call_id = call.call_id or fragment.call_id
        call.name = call.name or fragment.name
        call.arguments = (call.arguments or "") + (fragment.arguments or "")
    return [calls[index] for index in sorted(calls)]


@dataclass(slots=True)
class Event:
    delta: Delta
    ids: list[int]
    first: bool = False
    finish_reason: str | None = None
    id_fault: str | None = None
    logprobs: list[TokenLogprob] | None = None
    text_offset: int = 0  # completions logprobs: where this event's first token starts
    completion_tokens: int = 0  # cumulative, for continuous usage stats

    @property
    def text(self) -> str:
        """Completions: everything this event adds to the text."""
        d = self.delta
        return (d.reasoning or "") + (d.content or "") + (d.refusal or "")


class SimError(Exception):
    """An error a dialect renders in its own envelope (before headers: as the status)."""

    def __init__(
        self, status: int, message: str, type: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
