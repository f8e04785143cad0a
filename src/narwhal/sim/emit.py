"""Which tokens go into which streamed event: vLLM's stream_interval rule.

The first token goes out alone and at once; after it, tokens go out in groups of
`interval`; the last group goes out when the sequence finishes, however short. Group
boundaries depend only on the interval, never on timing, so a request's events are
the same on every run. A group whose parts are all held back (parser-held tokens)
still goes out as an empty delta when ids or logprobs were asked, as in vLLM 0.13+.
"""

from __future__ import annotations

from narwhal.sim.events import Delta, Event, merge_parts
from narwhal.sim.script import Script, Text


class Emitter:
    def __init__(self, script: Script, interval: int, *, keep_empty: bool) -> None:
        self.script = script
        self.total = len(script.ids)
        self.interval = interval
        self.keep_empty = keep_empty
        self.sent = 0  # tokens already grouped into events
        self._offset = 0  # completions logprobs: text_offset of the next token

    @property
    def done(self) -> bool:
        return self.sent >= self.total

    def next_group(self, produced: int) -> tuple[int, int] | None:
        """The next event's token range [start, end), if the engine has produced it."""
        start = self.sent
        if start >= produced:
            return None
        end = 1 if start == 0 else start + self.interval
        if end > produced:
            if produced < self.total:
                return None
            end = self.total
        return start, end

    def event(self, start: int, end: int) -> Event | None:
        """The event for a group (and mark it sent); None when vLLM would send nothing."""
        script = self.script
        self.sent = end
        parts = script.parts[start:end]
        if end - start == 1 and isinstance(part := parts[0], Text) and part.channel == "content":
            delta = Delta(content=part.text)
        else:
            delta = merge_parts(parts)
        final = end == self.total
        if delta.is_empty() and not final and not self.keep_empty:
            return None
        event = Event(delta, script.ids[start:end], first=start == 0, completion_tokens=end)
        if final:
            event.finish_reason = script.finish_reason
        fault = script.id_fault
        if fault is not None and start <= fault[1] < end:
            event.id_fault = fault[0]
        if script.logprobs is not None:
            event.logprobs = script.logprobs[start:end]
            event.text_offset = self._offset
            self._offset += sum(len(e.token) for e in event.logprobs)
        return event
