"""What a streamed completion carried, read straight from its bytes (sans-IO).

`StreamScanner` is fed each network read with the time it arrived and keeps a
handful of counters; it never decodes JSON. That keeps the load generator's own
CPU per request small: a 64-token vLLM stream costs about two passes of C-level
byte search over its ~15 kB, however the network split it.

How a read is handled:

- It is joined to the unfinished tail of the previous read, and only the
  complete events in it (up to its last blank line) are scanned; the rest
  waits for the next read. Everything below is computed per such region, and
  each count is additive over regions, so the results do not depend on where
  the stream was split (the tests split it at every offset). CR and CRLF line
  ends are turned into LF first.
- Events: the `data:` lines that start a line, minus `[DONE]`. Comments
  (`: keep-alive`) and other fields are not events. A multi-line `data:` event
  would count once per line; no OpenAI-compatible server sends one.
- Output tokens: each `"token_ids":[...]` array gives commas + 1 ids (an empty
  array 0, `null` nothing). The key's leading quote keeps `"prompt_token_ids"`
  out, and a quote inside generated text is escaped, so output cannot fake the
  key. A region whose arrays hold no ids (or that has none) counts one token
  per non-empty `content`, `text`, `refusal` or reasoning delta and per
  tool-call fragment, the larger of `reasoning`/`reasoning_content` when both
  come (vLLM 0.11.1-0.15.1).
- Times: every token counted in a region is attributed to that region's
  arrival time (an event with k ids gives k tokens at one instant). TTFT is the
  first such time; TPOT divides the span from first to last token by the
  tokens after the first, so no spreading within an event is needed.
- Inter-token gaps (ITL): one per output event after the first, the time from
  the output event before it. An output event is one whose `token_ids` array
  holds ids or, without ids, one output-carrying delta. Events that arrived in
  one read share its time, so all but the first of a region's output events have
  a gap of 0; those are counted (`zero_gaps`), the others kept in `gaps` (one
  double per read, only for the request's lifetime). The count is additive over
  regions, so it too does not depend on the split, and the gaps add up to the
  span from the first output to the last.
- `usage.completion_tokens` and an error event (`{"error": ...}`) come last,
  right before `[DONE]`, so `close()` looks for them only in the last
  `_TAIL` bytes of the last two regions that held data events; so do
  `usage.prompt_tokens` and `prompt_tokens_details.cached_tokens`. A whole
  (non-streamed) body is searched for the usage from its start: vLLM puts
  `prompt_token_ids` after `usage`, which for a long prompt is more than `_TAIL`.

A stream is complete when `[DONE]` arrived or, for servers that omit it, when
the last region holds a finish reason or a usage object.
"""

from __future__ import annotations

import re
from array import array

from narwhal.protocol.fields import DELTA_OUTPUT

_TAIL = 4096  # usage and error events are searched for in this many final bytes
_IDS_RE = re.compile(rb'"token_ids": ?\[([^\]]*)\]')
# Output: a completion's `text` and the chat delta's output fields, when the value is a
# non-empty string or a list of objects (tool-call fragments). The legacy function_call
# is an object, which the pattern does not take: it is not counted.
_OUTPUT_KEYS = b"|".join(key.encode() for key in ("text", *DELTA_OUTPUT))
_TEXT_RE = re.compile(rb'"(' + _OUTPUT_KEYS + rb')": ?(?:"(?!")|\[\{)')
# Usage counts: each key, and the pattern that reads the number after it.
_COMPLETION_TOKENS = b'"completion_tokens"'
_PROMPT_TOKENS = b'"prompt_tokens"'
_CACHED_TOKENS = b'"cached_tokens"'
_NUMBER_AFTER = {
    key: re.compile(re.escape(key) + rb"\s*:\s*(\d+)")
    for key in (_COMPLETION_TOKENS, _PROMPT_TOKENS, _CACHED_TOKENS)
}
_FINISH_RE = re.compile(rb'"finish_reason"\s*:\s*"')
_USAGE_OBJ_RE = re.compile(rb'"usage"\s*:\s*\{')


def count_token_ids(region: bytes) -> int:
    """Ids in all the `"token_ids"` arrays of a region; -1 when it has no such array."""
    return token_id_counts(region)[0]


def token_id_counts(region: bytes) -> tuple[int, int]:
    """Ids in all the `"token_ids"` arrays of a region, and the arrays that hold any;
    (-1, 0) when it has no such array."""
    found = _IDS_RE.findall(region)
    if not found:
        return -1, 0
    empty = found.count(b"")
    # n arrays joined by n - 1 commas: ids = commas in the join + 1 - empty arrays.
    return b",".join(found).count(b",") + 1 - empty, len(found) - empty


def count_text_events(region: bytes) -> int:
    """Output-carrying deltas in a region without token ids (one token per event)."""
    keys = _TEXT_RE.findall(region)
    if not keys:
        return 0
    return len(keys) - min(keys.count(b"reasoning"), keys.count(b"reasoning_content"))


def _has_done(region: bytes) -> bool:
    """Whether a region of complete LF-framed events holds `data: [DONE]`."""
    if region.endswith((b"data: [DONE]\n\n", b"data:[DONE]\n\n")):
        return True
    if region.find(b"[DONE]\n", max(0, len(region) - 512)) < 0:
        return False
    return any(line in (b"data: [DONE]", b"data:[DONE]") for line in region.split(b"\n"))


class StreamScanner:
    """Counters for one streamed response; feed reads with `feed`, then call `close`.

    Times are whatever clock the caller passes (the client passes seconds since it
    sent the request), so tests are exact.
    """

    __slots__ = (
        "_carry_cr",
        "_cr",
        "_last",
        "_pending",
        "_prev",
        "cached_tokens",
        "done",
        "error_event",
        "error_text",
        "events",
        "first_output",
        "gaps",
        "ids",
        "last_output",
        "marks",
        "prompt_tokens",
        "text_events",
        "usage_tokens",
        "zero_gaps",
    )

    def __init__(self, keep_marks: bool = False) -> None:
        self._pending = b""
        self._cr = False
        self._carry_cr = False
        self._last = b""  # the last two regions that held data events
        self._prev = b""
        self.events = 0  # data events, [DONE] excluded
        self.ids = -1  # token ids counted; -1 until an event carries a token_ids array
        self.text_events = 0  # output-carrying events in regions without ids
        self.usage_tokens = -1  # usage.completion_tokens (known after close), -1 if none
        self.prompt_tokens = -1  # usage.prompt_tokens, likewise
        self.cached_tokens = -1  # usage.prompt_tokens_details.cached_tokens, likewise
        self.first_output = -1.0
        self.last_output = -1.0
        self.done = False
        self.error_event = False
        self.error_text = b""  # the start of the first error event
        # (time, tokens) per region with output, only when asked for.
        self.marks: array[float] | None = array("d") if keep_marks else None
        self.gaps: array[float] = array("d")  # inter-token gaps above 0 (streams only)
        self.zero_gaps = 0  # output events that shared a read with the one before

    def feed(self, data: bytes, now: float) -> None:
        """Scan the complete events that `data` finishes; keep the rest for later."""
        if self._cr or b"\r" in data:
            data = self._normalize_cr(data)
        if self._pending:
            data = self._pending + data
        if data.endswith(b"\n\n"):
            self._pending = b""
        else:
            cut = data.rfind(b"\n\n")
            if cut < 0:
                self._pending = data
                return
            cut += 2
            self._pending = data[cut:]
            data = data[:cut]
        events = data.count(b"\ndata:")
        if data.startswith(b"data:"):
            events += 1
        if not events:
            return  # comments only
        if _has_done(data):
            self.done = True
            events -= 1
        self.events += events
        self._prev = self._last
        self._last = data
        self._output(data, now)

    def close(self, now: float) -> None:
        """The stream ended: scan a last event that lacked its blank line, then its end."""
        rest = self._pending + (b"\n" if self._carry_cr else b"")
        self._pending = b""
        self._carry_cr = False
        if rest.strip():
            self.feed(rest.rstrip(b"\n") + b"\n\n", now)
        self._ending(self._prev)
        self._ending(self._last)

    @property
    def gap_count(self) -> int:
        """Inter-token gaps: output events after the first."""
        return len(self.gaps) + self.zero_gaps

    def scan_body(self, body: bytes, now: float) -> None:
        """A non-streaming response: the whole body is one event."""
        self.events = 1
        self.done = True
        self._last = body
        self._output(body, now, streamed=False)
        self._ending(body, usage_from=0)

    @property
    def complete(self) -> bool:
        """Whether the stream reached its end (see the module docstring)."""
        if self.done:
            return True
        last = self._last
        return bool(_FINISH_RE.search(last) or _USAGE_OBJ_RE.search(last))

    @property
    def tokens(self) -> int:
        """Output tokens: from ids, else from usage, else one per content event."""
        if self.ids > 0:
            return self.ids
        if self.usage_tokens >= 0:
            return self.usage_tokens
        return self.text_events

    def _normalize_cr(self, data: bytes) -> bytes:
        # A CR at the end may be the first half of a CRLF split across reads.
        self._cr = True
        if self._carry_cr:
            data = b"\r" + data
        self._carry_cr = data.endswith(b"\r")
        if self._carry_cr:
            data = data[:-1]
        return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    def _output(self, region: bytes, now: float, streamed: bool = True) -> None:
        k, output_events = token_id_counts(region)
        if k > 0:
            self.ids = k if self.ids < 0 else self.ids + k
        else:
            if k == 0 and self.ids < 0:
                self.ids = 0
            k = output_events = count_text_events(region)
            self.text_events += k
        if k > 0:
            if self.first_output < 0.0:
                self.first_output = now
            elif streamed:
                gap = now - self.last_output
                if gap > 0.0:
                    self.gaps.append(gap)
                else:
                    self.zero_gaps += 1
            if streamed:
                self.zero_gaps += output_events - 1
            self.last_output = now
            if self.marks is not None:
                self.marks.append(now)
                self.marks.append(k)

    def _ending(self, region: bytes, usage_from: int | None = None) -> None:
        """Usage and error events, which come last: call for the final regions in order.

        The usage is looked for from `usage_from` (default: the region's last `_TAIL`
        bytes), the error event in the tail only."""
        tail = max(0, len(region) - _TAIL)
        start = tail if usage_from is None else usage_from
        self.usage_tokens = _last_number(region, _COMPLETION_TOKENS, start, self.usage_tokens)
        self.prompt_tokens = _last_number(region, _PROMPT_TOKENS, start, self.prompt_tokens)
        self.cached_tokens = _last_number(region, _CACHED_TOKENS, start, self.cached_tokens)
        pos = region.find(b'{"error"', tail)
        if pos >= 0 and not self.error_event:
            self.error_event = True
            self.error_text = region[pos : pos + 300]


def _last_number(region: bytes, key: bytes, start: int, default: int) -> int:
    """N of the last `key: N` in `region[start:]`, else `default`.

    The key is found with `rfind` and only then matched, which is C-speed over a long
    region. A key inside generated text cannot match: its quotes arrive escaped."""
    pos = region.rfind(key, start)
    if pos < 0:
        return default
    found = _NUMBER_AFTER[key].match(region, pos)
    return int(found.group(1)) if found is not None else default
