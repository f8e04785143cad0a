"""Token-ID validation and output counting (seed: "Token identity and output accounting").

The seed: "Narwhal checks the ID list on each event carrying generated text,
reasoning, tool calls, or refusals, counting IDs that are nonnegative integers. An
event that omits the list, supplies a Boolean ID, or returns a malformed list fails
the decode attempt or profiling measurement."

PROTOCOL.md adds what engines really do:
- §1.2/§1.3: chat puts `prompt_token_ids` top-level on the role chunk and generated
  `token_ids` per choice; completions put both per choice. Unrequested lists arrive
  as explicit `null`, which counts as absent.
- §1.2: since vLLM 0.13 an event with an empty delta still carries the IDs the tool
  or reasoning parser held back; those are counted, so the sum over a stream is the
  exact output length. An empty event without IDs is fine.
- §6.1: SGLang's streamed chat has no per-event IDs; all of them come at the end in
  `sglext` (`sglext_output_token_count`).

An ID is a JSON integer ≥ 0: `type(x) is int` rejects `true`/`false` (bool is an int
subclass in Python) and `1.0` (msgspec decodes it as a float).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from narwhal.protocol.events import EngineOutputError, Route
from narwhal.protocol.fields import DELTA_OUTPUT

# An event carrying any of these non-empty must carry its token IDs.
_CHAT_OUTPUT: Final = frozenset(DELTA_OUTPUT)
# Lists longer than this are checked with C-level passes (prompt IDs can be 100k long).
_SHORT: Final = 16


class TokenIdError(EngineOutputError):
    """An event's token IDs are missing or malformed (502; fails the decode attempt)."""


def missing_token_ids() -> TokenIdError:
    """The error for an event that carries output without its `token_ids` (the seed: an
    event that omits the list fails the decode attempt), on either decode path."""
    return TokenIdError("engine event omits token_ids for generated output")


def check_token_ids(ids: Any, where: str) -> int:
    """Validate one ID list (`where` names it in the error); return its length."""
    if type(ids) is not list:
        raise TokenIdError(f"engine sent {where} that is not a list")
    if len(ids) <= _SHORT:
        for token in ids:
            if type(token) is not int or token < 0:
                _raise_bad_id(token, where)
        return len(ids)
    if set(map(type, ids)) != {int}:
        for token in ids:
            if type(token) is not int:
                _raise_bad_id(token, where)
    if min(ids) < 0:
        _raise_bad_id(min(ids), where)
    return len(ids)


def _raise_bad_id(token: Any, where: str) -> None:
    if type(token) is bool:
        raise TokenIdError(f"engine sent a Boolean token id in {where}")
    if type(token) is int:
        raise TokenIdError(f"engine sent a negative token id in {where}")
    raise TokenIdError(f"engine sent a token id that is not an integer in {where}")


def count_event_token_ids(
    event: Mapping[str, Any], route: Route, *, prompt_ids: bool = True
) -> int:
    """Validate the event's token IDs and return how many generated IDs it carries.

    Raises TokenIdError when a choice carrying output omits `token_ids`, or when any
    ID list (generated, or prompt unless `prompt_ids` is False) is malformed. Prompt IDs
    matter only to a client that will see them: vLLM sends the whole prompt's IDs on the
    first event, and checking 100,000 of them is wasted work when they are dropped.
    """
    prompt = event.get("prompt_token_ids")
    if prompt_ids and prompt is not None:
        check_token_ids(prompt, "prompt_token_ids")
    choices = event.get("choices")
    if type(choices) is not list:
        if choices is None:
            return 0
        raise EngineOutputError("engine sent choices that is not a list")
    total = 0
    for choice in choices:
        if type(choice) is not dict:
            raise EngineOutputError("engine sent a choice that is not an object")
        ids = choice.get("token_ids")
        if type(ids) is list and len(ids) <= _SHORT:
            # The common vLLM event: a few IDs (stream_interval 1), checked inline.
            for token in ids:
                if type(token) is not int or token < 0:
                    _raise_bad_id(token, "token_ids")
            total += len(ids)
        elif ids is not None:
            total += check_token_ids(ids, "token_ids")
        elif carries_output(choice, route):
            raise missing_token_ids()
        prompt = choice.get("prompt_token_ids")
        if prompt_ids and prompt is not None:
            check_token_ids(prompt, "prompt_token_ids")
    return total


def count_prompt_token_ids(event: Mapping[str, Any]) -> int | None:
    """The length of the event's validated prompt IDs (top-level for chat, the first
    choice's for completions), or None when it carries none."""
    prompt = event.get("prompt_token_ids")
    if prompt is None:
        choices = event.get("choices")
        if type(choices) is list and choices and type(choices[0]) is dict:
            prompt = choices[0].get("prompt_token_ids")
    if prompt is None:
        return None
    return check_token_ids(prompt, "prompt_token_ids")


def sglext_output_ids(event: Mapping[str, Any]) -> list[list[int]] | None:
    """The generated IDs of SGLang's end-of-stream `sglext` chunk, one validated list per
    choice (`{"sglext": {"input_ids": [...], "output_ids": [[...per choice...]]}}`,
    PROTOCOL.md §6.1), or None when the event has no sglext output IDs. Raises
    TokenIdError when `sglext` is not an object or its output IDs are malformed."""
    sglext = event.get("sglext")
    if sglext is None:
        return None
    if type(sglext) is not dict:
        raise TokenIdError("engine sent sglext that is not an object")
    outputs = sglext.get("output_ids")
    if outputs is None:
        return None
    if type(outputs) is not list:
        raise TokenIdError("engine sent sglext.output_ids that is not a list")
    for ids in outputs:
        check_token_ids(ids, "sglext.output_ids")
    return outputs


def sglext_output_token_count(event: Mapping[str, Any]) -> int | None:
    """How many generated IDs the event's `sglext` chunk gives (`sglext_output_ids`), or
    None when it gives none."""
    outputs = sglext_output_ids(event)
    return None if outputs is None else sum(map(len, outputs))


def carries_output(choice: Mapping[str, Any], route: Route) -> bool:
    """Whether a choice of an event carries generated output (text, reasoning, tool or
    function calls, refusals): the events whose token IDs must be present."""
    if route == "completion":
        return bool(choice.get("text"))
    delta = choice.get("delta")
    if delta is None:
        return False
    if type(delta) is not dict:
        raise EngineOutputError("engine sent a delta that is not an object")
    return any(value and key in _CHAT_OUTPUT for key, value in delta.items())
