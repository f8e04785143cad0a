"""What a streaming client may see of the engine's events.

Narwhal asks token-ID engines for more than the client did (DESIGN.md §4: always
`return_token_ids`, `stream_interval: 1` and `stream_options.include_usage`), so the
relay removes what the client did not ask for (seed, "Streaming responses": Narwhal
"forwards streaming delta fields in the engine's response shape, applying its
token-ID exposure rules"; "Clients requesting return_token_ids receive the IDs").

The rules remove keys or whole events and nothing else: no field is added, renamed
or reordered, so an event that loses nothing can go out as the engine's own bytes
(`Exposed.UNCHANGED`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Exposure:
    """What the client asked to see."""

    token_ids: bool
    """The client asked `return_token_ids`."""
    usage: bool
    """The client asked `stream_options.include_usage` (streaming only: non-streaming
    responses always carry usage)."""
    continuous_usage: bool
    """The client asked `stream_options.continuous_usage_stats`."""
    null_usage: bool = False
    """The engine writes `"usage": null` on every chunk whatever the client asked
    (SGLang dumps its chunks with their null fields, PROTOCOL.md §6.1), so a client
    that did not ask for usage gets that null from the engine itself and keeps it."""
    null_ids: bool = False
    """The engine writes its ID lists as `null` when they were not asked for (vLLM:
    `token_ids` on every chunk, `prompt_token_ids` on the role chunk or per completion
    choice, PROTOCOL.md §1.2), so a client without IDs gets nulls, as from the engine
    itself, instead of losing the keys."""
    echo: bool = False
    """The client asked completions' `echo`: vLLM streams the prompt's IDs on each
    choice's echo chunk whatever `return_token_ids` says, so a streaming client keeps
    a choice's `prompt_token_ids` list (`echo.py`)."""
    echo_text: str | None = None
    """The echoed prompt text the engine blanked because Narwhal asked for IDs, which
    goes back in front of each choice's first text (`echo.py`)."""


class Exposed(enum.Enum):
    """What `apply_exposure` did to an event."""

    UNCHANGED = "unchanged"  # forward the engine's raw bytes
    CHANGED = "changed"  # re-encode the event
    DROPPED = "dropped"  # send nothing


def needs_rewrite(exposure: Exposure) -> bool:
    """False when no rule can ever remove anything, so every event can be forwarded as
    the engine's raw bytes without looking at it.

    Even when this is True most events may come back `UNCHANGED` (a client that asked
    for IDs and usage but not continuous usage loses only usage on mid-stream chunks,
    which engines do not send unless forced), so the relay should use
    `apply_exposure`'s verdict rather than re-encode every event.
    """
    return not (exposure.token_ids and exposure.usage and exposure.continuous_usage)


def expose_event(event: dict[str, Any], exposure: Exposure) -> dict[str, Any] | None:
    """Apply the exposure rules in place; the event, or None when it must be dropped."""
    return None if apply_exposure(event, exposure) is Exposed.DROPPED else event


def apply_exposure(event: dict[str, Any], exposure: Exposure) -> Exposed:
    """Apply the exposure rules to `event` in place and say what happened.

    - Without token_ids: drop top-level `prompt_token_ids`, the per-choice ID lists
      (vLLM's `token_ids`/`prompt_token_ids`, PROTOCOL.md §1.2, §1.3; SGLang's
      non-streaming `response_token_ids`, §6.1) and SGLang's `sglext` ID chunk (§6.1);
      with `null_ids` (vLLM) the `token_ids`/`prompt_token_ids` keys stay, as null;
      with `echo` a choice's `prompt_token_ids` stays as it is (vLLM's echo chunk).
    - Without usage: drop the `usage` key everywhere (the finishing chunk of
      openai-dialect engines, continuous stats, OpenAI's `"usage": null`), except a
      null one from an engine that always writes it (`null_usage`: SGLang).
    - With usage but not continuous usage: drop non-null usage except on the final
      usage carrier: a `choices: []` chunk (vLLM, PROTOCOL.md §2.2) or a chunk whose
      every choice has finished (transformers serve, §6.3).
    - An event left with no choices and no usage after a removal is dropped whole
      (the usage-only chunk, the sglext chunk).
    - Without token_ids, an event left with nothing but nulls and empty deltas once its
      ID lists are gone is dropped too: vLLM (0.13 on) sends such an event only to carry
      the IDs of text its reasoning or tool parser holds back, and only when IDs (or
      logprobs) were asked for (PROTOCOL.md §1.2), so the client would not have got it.
    """
    changed = False
    had_ids = False  # the event had choice ID lists (null or not) the client is not given
    choices = event.get("choices")
    if not exposure.token_ids:
        hide = _null_out if exposure.null_ids else _take_out
        changed = hide(event, "prompt_token_ids")
        if "sglext" in event:
            del event["sglext"]
            changed = True
        if type(choices) is list:
            for choice in choices:
                if type(choice) is dict:
                    if "token_ids" in choice:
                        had_ids = True
                        changed = hide(choice, "token_ids") or changed
                    if not exposure.echo:
                        changed = hide(choice, "prompt_token_ids") or changed
                    if "response_token_ids" in choice:
                        del choice["response_token_ids"]
                        changed = True
    if "usage" in event and _hide_usage(event["usage"], choices, exposure):
        del event["usage"]
        changed = True
    # (Also when its IDs were null already: `carries_nothing` needs choices, so this
    # never meets the choice-less cases below.)
    if had_ids and carries_nothing(event):
        return Exposed.DROPPED
    if not changed:
        return Exposed.UNCHANGED
    # (SGLang's ID chunk has no choices and `"usage": null`, and is kept for IDs.)
    if not choices and event.get("usage") is None and "error" not in event:
        return Exposed.CHANGED if "sglext" in event else Exposed.DROPPED
    return Exposed.CHANGED


def _take_out(holder: dict[str, Any], key: str) -> bool:
    """Remove `key`; whether it was there."""
    if key in holder:
        del holder[key]
        return True
    return False


def _null_out(holder: dict[str, Any], key: str) -> bool:
    """Write `key` as null where it holds a value; whether it changed."""
    if holder.get(key) is not None:
        holder[key] = None
        return True
    return False


_ENVELOPE = frozenset(("id", "object", "created", "model", "choices"))


def carries_nothing(event: dict[str, Any]) -> bool:
    """Every choice of the event holds nothing but its index, nulls and an empty delta
    (chat: `{}` or only null members) or empty text (completions), and the event nothing
    but its envelope and nulls."""
    choices = event.get("choices")
    if type(choices) is not list or not choices:
        return False
    for choice in choices:  # (first: where a usual event shows its output at once)
        if type(choice) is not dict:
            return False
        for key, value in choice.items():
            if value is None or key == "index":
                continue
            if key == "delta":
                if type(value) is not dict or any(v is not None for v in value.values()):
                    return False
            elif key != "text" or value != "":
                return False
    return all(value is None or key in _ENVELOPE for key, value in event.items())


def _hide_usage(usage: Any, choices: Any, exposure: Exposure) -> bool:
    if not exposure.usage:
        return usage is not None or not exposure.null_usage
    if exposure.continuous_usage or usage is None:
        # OpenAI's `"usage": null` on every chunk is what include_usage looks like there.
        return False
    if not choices or type(choices) is not list:
        return False  # the usage-only chunk
    for choice in choices:
        if type(choice) is not dict or choice.get("finish_reason") is None:
            return True  # a running choice: continuous stats
    return False  # the finishing chunk carries the final usage
