"""Plain events: the common shape of a streamed chunk, decoded and filtered fast.

Almost every event of a vLLM stream is the same small chunk: one choice, a delta or a
text piece, a finish_reason, its `token_ids`; no usage, no prompt IDs, no error. The
relay runs for each of them, so this module gives them a path that costs about a third
of the general one (decode to a dict, `OutputTracker.observe`, `apply_exposure`,
re-encode):

- `decode_plain` decodes into typed structs that hold only what accounting needs.
  msgspec validates while it decodes: an ID that is `true`, `1.0` or negative, a delta
  text that is not a string or a choice index that is missing or negative fails the
  typed decode, as does every field `shape.check_event` checks (the structs type each
  one, or let only its null through). Any failure, and any event that is not plain (it
  has usage, prompt IDs, an error, SGLang's sglext), returns None and the caller takes
  the general path, which gives the proper verdict and error message. So the fast path
  never accepts what the general path would refuse.
- `strip_token_ids` removes the `token_ids` keys from the event's own bytes (for
  clients that did not ask for IDs) instead of re-encoding it, so everything else
  goes out exactly as the engine wrote it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Any, Final

import msgspec
from msgspec import UNSET, UnsetType
from msgspec.structs import astuple

_TOKEN_IDS_NAME: Final = b'"token_ids"'
_PROMPT_IDS_NAME: Final = b'"prompt_token_ids"'
_PROMPT_IDS_NULL: Final = b',"prompt_token_ids":null'
# The literal prefix lets `re` find candidates with a fast substring search.
_TOKEN_IDS_MEMBER: Final = re.compile(rb',"token_ids":(?:\[[0-9,]*\]|null)')
_TOKEN_IDS_NULL: Final = b',"token_ids":null'
_TOKEN_IDS_LIST_START: Final = b'"token_ids":['
# Less than any count of names: `null_token_ids` then refuses whatever it is given.
_UNSAFE: Final = -(1 << 62)

TokenId = Annotated[int, msgspec.Meta(ge=0)]
Index = Annotated[int, msgspec.Meta(ge=0)]  # a choice's or a tool call's stream index


class PlainFunction(msgspec.Struct, gc=False):
    name: str | None = None
    arguments: str | None = None


class PlainToolCall(msgspec.Struct, gc=False):
    """One tool-call fragment, typed as `shape.check_event` checks it (other keys are
    the assembler's allow-lists, not the stream's)."""

    index: Index
    id: str | None = None
    function: PlainFunction | None = None


class PlainDelta(msgspec.Struct, gc=False):
    """The chat delta fields that are generated output, `fields.DELTA_OUTPUT` in its
    order, then `role` (a test holds them so), each typed for the fast decode. A field
    missing here would let an event whose output it holds pass as one without output,
    or a malformed one pass unchecked."""

    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    refusal: str | None = None
    tool_calls: list[PlainToolCall] | None = None
    # The legacy call (OpenAI only, PROTOCOL.md §2.5) takes the general path, null aside.
    function_call: UnsetType | None = UNSET
    role: str | None = None

    def carries_output(self) -> bool:
        """Some output field is non-empty (tokens.carries_output on the decoded delta)."""
        return any(astuple(self)[:_OUTPUT_FIELDS])


class PlainLogprobs(msgspec.Struct, gc=False):
    """Each array typed as `logprobs.py` checks it, for either route (a key the route
    does not have only sends the event the general way)."""

    content: list[dict[str, Any]] | None = None
    refusal: list[dict[str, Any]] | None = None
    text_offset: list[int] | None = None
    token_logprobs: list[float | None] | None = None
    tokens: list[str] | None = None
    top_logprobs: list[dict[str, Any] | None] | None = None


class PlainChoice(msgspec.Struct, gc=False):
    index: Index  # required, as the assembler requires it
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: PlainLogprobs | None = None
    # UNSET (absent) and None (null) differ for exposure: a null key is still removed.
    token_ids: list[TokenId] | UnsetType | None = UNSET
    delta: PlainDelta | None = None  # chat
    text: str | None = None  # completions
    # vLLM's completion chunks after the first carry `"prompt_token_ids": null`; a list
    # (the first chunk) fails the typed decode and takes the general path.
    prompt_token_ids: UnsetType | None = UNSET
    # Only on events the general path handles (SGLang): no JSON value decodes as
    # UnsetType, so its presence fails the typed decode, in C.
    response_token_ids: UnsetType = UNSET


class PlainEvent(msgspec.Struct, gc=False):
    choices: list[PlainChoice] | None = None
    object: str | None = None
    # As above: usage (even null), an error, prompt IDs or sglext make it not plain.
    usage: UnsetType = UNSET
    error: UnsetType = UNSET
    prompt_token_ids: UnsetType = UNSET
    sglext: UnsetType = UNSET


_decoder: Final = msgspec.json.Decoder(PlainEvent)
_OUTPUT_FIELDS: Final = PlainDelta.__struct_fields__.index("role")


def decode_plain(data: bytes) -> PlainEvent | None:
    """The event as a `PlainEvent`, or None when it must take the general path."""
    if not data.isascii():
        # msgspec skips undeclared fields without checking their UTF-8; the general
        # path refuses invalid UTF-8 anywhere, so this must too.
        try:
            data.decode()
        except UnicodeDecodeError:
            return None
    try:
        event = _decoder.decode(data)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None
    return None if event.object == "error" else event


def decode_plains(datas: list[bytes], ascii: bool) -> tuple[list[PlainEvent | None], list[int]]:
    """`decode_plain` for the events of one read, and the indices where it gave None.
    `ascii`: all of `datas` is known to be ASCII (one check for the whole read)."""
    decode = _decoder.decode
    events: list[PlainEvent | None] = []
    others: list[int] = []
    for i, data in enumerate(datas):
        if not ascii and not data.isascii():
            event = decode_plain(data)
        else:
            try:
                event = decode(data)
            except (msgspec.DecodeError, RecursionError):
                event = None
            else:
                if event.object == "error":
                    event = None
        if event is None:
            others.append(i)
        events.append(event)
    return events, others


def is_quiet(event: PlainEvent) -> bool:
    """Every choice has an ID-list key, no finish_reason and no output: the event may
    hold nothing but IDs (vLLM's empty deltas while a parser holds text back).
    `exposure.carries_nothing` decides, on the decoded event; this only keeps the usual
    event from being decoded twice."""
    if not event.choices:
        return False
    for choice in event.choices:
        delta = choice.delta
        # Content first: it settles the usual event at once.
        if delta is not None:
            if delta.content:
                return False
        elif choice.text:
            return False
        if choice.finish_reason is not None or choice.token_ids is UNSET:
            return False
        if delta is not None and delta.carries_output():
            return False
    return True


def quiet_events(events: list[PlainEvent | None]) -> list[int]:
    """The indices of the plain events that `is_quiet`."""
    return [i for i, event in enumerate(events) if event is not None and is_quiet(event)]


def id_list_keys(event: PlainEvent) -> int:
    """How many ID-list keys the event's choices have: `token_ids` (null included) and
    null `prompt_token_ids` (what `strip_token_ids` cuts; `observe_plains` counts the
    same while it accounts)."""
    if not event.choices:
        return 0
    return sum(
        (choice.token_ids is not UNSET) + (choice.prompt_token_ids is None)
        for choice in event.choices
    )


def strip_token_ids(raw: bytes, expected: int, *, prompt_nulls: bool = False) -> bytes | None:
    """`raw` (one or many SSE events) without its `expected` choice-level ID-list
    members: `,"token_ids":[…]` or `,"token_ids":null`, and with `prompt_nulls` (the
    completion route) also `,"prompt_token_ids":null`; or None when the bytes are not in
    the compact shape this can cut safely (the caller then re-encodes the decoded events).

    Why a byte search is sound here: the events already decoded as valid JSON, and in
    valid JSON a `"` directly after `,` always opens a key (inside a string every quote
    is escaped, so it follows a backslash). Such a key named exactly `token_ids` whose
    value is a list of integers (no nested brackets) or null is cut whole by the pattern.
    The text `"token_ids"` cannot occur inside a string either (its closing quote would
    be escaped), and without `\\u` escapes a key's bytes spell its name. The choices
    hold `expected` such keys, each of which occurs in the bytes; so when the names
    occur exactly `expected` times and exactly `expected` members were cut, every cut was
    one of the choices' keys and none was left: a key nested elsewhere, spacing, or a key
    first in its object all make the counts differ.
    """
    found = raw.count(_TOKEN_IDS_NAME)
    if prompt_nulls:
        found += raw.count(_PROMPT_IDS_NAME)
    if found != expected:
        return None
    # (The one-byte search is memchr-fast; the two-byte one is not, so it goes second.)
    if raw.find(b"\\") != -1 and raw.find(b"\\u") != -1:
        return None
    stripped, cut = _TOKEN_IDS_MEMBER.subn(b"", raw)
    if cut != expected and prompt_nulls:
        shorter = stripped.replace(_PROMPT_IDS_NULL, b"")
        cut += (len(stripped) - len(shorter)) // len(_PROMPT_IDS_NULL)
        stripped = shorter
    return stripped if cut == expected else None


def null_token_ids(raw: bytes, expected: int, *, prompt_names: bool = False) -> bytes | None:
    """`raw` (one or many SSE events) with its choice-level `token_ids` lists written as
    `null`, as vLLM writes them for a client that did not ask for IDs; or None when the
    bytes are not in the compact shape this can rewrite safely.

    `expected` counts the ID-list keys `raw` holds at choice level (`token_ids`, null or
    not, and with `prompt_names` the completion choices' `prompt_token_ids`, which are
    null here: a list never takes this path). As in `strip_token_ids`, names that occur
    exactly `expected` times are all those keys; when the members rewritten (a null
    rewritten as itself) are as many as the `token_ids` names, each key was one of them.
    """
    names = raw.count(_TOKEN_IDS_NAME)
    found = names + raw.count(_PROMPT_IDS_NAME) if prompt_names else names
    if found != expected:
        return None
    if raw.find(b"\\") != -1 and raw.find(b"\\u") != -1:
        return None
    out, members = _TOKEN_IDS_MEMBER.subn(_TOKEN_IDS_NULL, raw)
    return out if members == names else None


def null_id_names(pieces: Iterable[bytes], *, prompt_names: bool = False) -> int:
    """The ID-list names in `pieces`, events already exposed with their IDs null, for
    `null_token_ids`'s count; a large negative number when one of them still holds a
    `token_ids` list (which that rewrite must then not touch: it refuses)."""
    names = 0
    for piece in pieces:
        if _TOKEN_IDS_LIST_START in piece:
            return _UNSAFE
        names += piece.count(_TOKEN_IDS_NAME)
        if prompt_names:
            names += piece.count(_PROMPT_IDS_NAME)
    return names
