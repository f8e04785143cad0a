"""Watching one decode attempt's events: validation, output accounting, per-token timing.

Every event of an engine stream passes through `OutputTracker.observe` exactly once,
whether the client streams or not. It rejects what fails the attempt (an engine error
event, bad token IDs, a malformed field it reads: choice index, finish_reason, usage),
counts validated token IDs, records when they arrived (the seed: "Validated IDs give
Narwhal output length and per-token timing for TPOT scoring"), notes each choice's
finish_reason and keeps the engine's last usage. The rest of an event's shape is
`shape.check_event`'s, which both sinks run after it.

Times come from the caller (`now`), so this stays sans-IO and exact under test.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from typing import Any

from msgspec import UNSET

from narwhal.protocol.events import Route, raise_for_engine_error
from narwhal.protocol.fields import expect_index, malformed, unexpected_choice
from narwhal.protocol.plain import PlainEvent
from narwhal.protocol.shape import check_finish_reason
from narwhal.protocol.tokens import (
    carries_output,
    check_token_ids,
    count_event_token_ids,
    missing_token_ids,
    sglext_output_token_count,
)
from narwhal.protocol.usage import event_usage


class OutputTracker:
    __slots__ = (
        "_choices",
        "_echo",
        "_finish_reasons",
        "_first_count",
        "_prompt_ids",
        "_route",
        "_token_ids",
        "event_counts",
        "event_times",
        "finish_seen",
        "first_output_at",
        "tokens",
        "usage",
    )

    def __init__(
        self,
        route: Route,
        *,
        token_ids: bool,
        prompt_ids: bool = True,
        choices: int | None = None,
        echo: bool = False,
    ) -> None:
        """`token_ids`: the engine supplies them; `prompt_ids`: the client will see the
        prompt's IDs, so they are checked too; `choices`: how many the engine was asked
        for (its `n`), so an index outside 0 .. choices-1 fails the attempt (None: any
        index, for tests of wider streams); `echo`: a chat request with `echo: true`,
        whose last message's text vLLM sends back before any output, in events without
        IDs (they are not output): such events pass until the first output ID."""
        self._route = route
        self._choices = choices
        self._echo = echo
        self._token_ids = token_ids
        self._prompt_ids = prompt_ids
        self._finish_reasons: dict[int, str | None] = {}  # choice index -> finish_reason
        self.finish_seen = False  # some choice has its finish_reason (`finished` may hold)
        self.tokens = 0  # validated generated token IDs (or output events without IDs)
        self.first_output_at: float | None = None
        self.usage: dict[str, Any] | None = None
        # When output arrived and how many tokens each time (events read together share
        # one time, so they share one entry): TTFT, TPOT, learning.
        self.event_times = array("d")
        self.event_counts = array("I")
        self._first_count = 0  # the tokens of the first output event

    def observe(self, event: Mapping[str, Any], now: float) -> None:
        """Account one decoded event; raise UpstreamError if it fails the attempt."""
        raise_for_engine_error(event)
        if not self._token_ids:
            count = 0
        elif self._echo and self._echoing(event):
            count = 0  # (the role chunk too: its prompt IDs are checked all the same)
            prompt = event.get("prompt_token_ids")
            if self._prompt_ids and prompt is not None:
                check_token_ids(prompt, "prompt_token_ids")
        else:
            count = count_event_token_ids(event, self._route, prompt_ids=self._prompt_ids)
        choices = event.get("choices")
        if choices:
            if type(choices) is not list:
                malformed("choices", "an array")
            for choice in choices:
                if type(choice) is not dict:
                    malformed("choice", "an object")
                # Checked before they count (shape.py has the rest of the event): a
                # finish_reason of 5, or one at index -1, finishes nothing.
                reason = check_finish_reason(choice.get("finish_reason"))
                index = expect_index(choice.get("index"), "choice index")
                if self._choices is not None and index >= self._choices:
                    raise unexpected_choice(index, self._choices)
                if reason is not None or index not in self._finish_reasons:
                    self._finish_reasons[index] = reason
                    self.finish_seen = self.finish_seen or reason is not None
                if not self._token_ids and carries_output(choice, self._route):
                    count += 1
        if count:
            self._record(count, count, now)
        usage = event_usage(event)
        if usage is not None:
            self.usage = usage
        if not self._token_ids and "sglext" in event:
            sglext = sglext_output_token_count(event)
            if sglext is not None:
                # SGLang's streamed chat gives every ID at the end: exact count, no timing.
                self.tokens = sglext

    def observe_plains(self, events: Iterable[PlainEvent], now: float) -> int:
        """`observe` for events `decode_plain` accepted, read together at `now`: the same
        accounting, from fields msgspec already validated (IDs are nonnegative integers;
        no error, usage or prompt IDs are present, those events take `observe`).

        Returns how many ID-list keys their choices have (`token_ids`, null included, and
        a null `prompt_token_ids`), which the exposure filter removes for clients that
        did not ask for IDs."""
        token_ids = self._token_ids
        chat = self._route == "chat"
        reasons = self._finish_reasons
        bound = self._choices
        total = 0
        first = 0  # the first output event's tokens
        keys = 0
        for event in events:
            choices = event.choices
            if not choices:
                continue
            count = 0
            for choice in choices:
                index = choice.index
                if bound is not None and not 0 <= index < bound:
                    if total:
                        self._record(total, first, now)
                    raise unexpected_choice(index, bound)
                ids = choice.token_ids
                if ids is not UNSET:
                    keys += 1
                if choice.prompt_token_ids is None:  # (a list is never plain)
                    keys += 1
                if token_ids and ids is not UNSET and ids is not None:
                    count += len(ids)
                else:
                    if chat:
                        delta = choice.delta
                        output = delta is not None and delta.carries_output()
                    else:
                        output = bool(choice.text)
                    if output:
                        if token_ids:
                            if self._echo and not self.tokens and not total:
                                continue  # chat's echo, before any output: not output
                            # What came before in this read was validated: count it.
                            if total:
                                self._record(total, first, now)
                            raise missing_token_ids()
                        count += 1
                reason = choice.finish_reason
                if reason is not None or index not in reasons:
                    reasons[index] = reason
                    self.finish_seen = self.finish_seen or reason is not None
            if count:
                if not total:
                    first = count
                total += count
        if total:
            self._record(total, first, now)
        return keys

    def _echoing(self, event: Mapping[str, Any]) -> bool:
        """A chat echo event: before any output, choices that carry no ID list (vLLM's
        echo chunk has none, whatever was asked)."""
        if self.tokens:
            return False
        choices = event.get("choices")
        return (
            type(choices) is list
            and bool(choices)
            and all(type(c) is dict and c.get("token_ids") is None for c in choices)
        )

    def _record(self, count: int, first: int, now: float) -> None:
        """`count` tokens arrived at `now`, `first` of them in the first event."""
        if self.first_output_at is None:
            self.first_output_at = now
            self._first_count = first
        self.tokens += count
        times = self.event_times
        if times and times[-1] == now:
            self.event_counts[-1] += count
        else:
            times.append(now)
            self.event_counts.append(count)

    @property
    def route(self) -> Route:
        return self._route

    @property
    def finished(self) -> bool:
        """Every choice seen so far has its finish_reason (a clean end of output)."""
        reasons = self._finish_reasons
        return bool(reasons) and None not in reasons.values()

    def output_tokens(self) -> tuple[int, str]:
        """The output length and where it came from: token_ids, usage or events."""
        if self._token_ids:
            return self.tokens, "token_ids"
        if self.usage is not None:
            completion = self.usage.get("completion_tokens")
            if type(completion) is int and completion >= 0:
                return completion, "usage"
        return self.tokens, "events"

    def time_per_output_token(self) -> float | None:
        """Mean seconds per token after the first output event, from validated IDs; None
        when all output arrived at once (nothing to measure between tokens)."""
        if len(self.event_times) < 2:
            return None
        after_first = self.tokens - self._first_count
        if after_first <= 0:
            return None
        return (self.event_times[-1] - self.event_times[0]) / after_first
