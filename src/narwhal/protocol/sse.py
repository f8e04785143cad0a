"""Incremental Server-Sent Events decoder: bytes in, events out, no I/O.

Follows the WHATWG HTML "event stream" parsing rules (§9.2.6 "Interpreting an
event stream"):

- a line ends at CRLF, LF or CR; a CR at the end of one chunk and an LF at the start
  of the next are ONE line end (`_skip_lf`);
- a leading UTF-8 BOM is dropped, even when it arrives split;
- a line starting with ":" is a comment (vLLM's `: keep-alive`, PROTOCOL.md §2.1);
- `data:` lines of one event join with "\\n"; `event:` names the event (SGLang's
  `event: sglext_ids`, PROTOCOL.md §6.1); `id:` sets the last event ID, which persists;
  `retry:` and unknown fields are ignored (Narwhal never reconnects a stream);
- a blank line dispatches the event, unless no `data:` line came (then nothing is
  dispatched and the event name resets);
- at end of stream an unterminated event is discarded: `close()` returns nothing
  for it, and `pending` tells the caller that the stream was cut mid-event.

Each event keeps `raw`, the exact bytes of its block as received (its field lines
up to and including the blank line), so that a relay can forward an event it did not
change byte for byte. Bytes that belong to no event are not in any `raw`: blocks
that dispatch nothing (comments, keep-alives, stray blank lines), a leading BOM,
and the LF of a CRLF whose CR already ended an event in the previous chunk. Every
`raw` decodes on its own to the same event.

Fast path: vLLM writes whole `data: {...}\\n\\n` events, often several per read
(PROTOCOL.md §2.1). At a block start, a `data: ` line followed directly by a blank
LF line is sliced out with one `find`; everything else (CR line ends, several
lines, other fields) goes through the general line parser.

Bounded and linear: an event's block may be at most `max_event_bytes` long (its `raw`,
blank line included), and so may the bytes an unfinished block holds: past it `feed`
raises `EventTooLarge`, however the bytes were split, so a peer cannot make the decoder
hold more than about the limit (a line that never ends included). An unfinished block
is kept as its complete lines (`_head`, parsed once, joined once when the block ends)
and its unfinished line (`_tail`, a `bytearray`): bytes that end no line are only
appended, and a chunk that ends one is parsed from the start of that line, so a block
that arrives a byte at a time costs time linear in its size.

Every byte counts: the bytes that belong to no event (comments, blank lines, blocks with
no data) count toward the next event's limit, so at most `max_event_bytes` of them, with
that event, may come between two events; past it `feed` raises `NoEventInLimit`. They are
skipped a stretch at a time, not a line at a time (`_skip`): from a line that is not
`data`, a few C-level searches find the next `data` line, the last blank line before it
(where the block that may still dispatch starts) and the last `event:` and `id:` lines,
which are all that the stretch's lines can leave behind. An engine that floods comments
or blank lines is parsed as fast as one that sends data.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from narwhal.protocol.events import EngineOutputError

_BOM: Final = b"\xef\xbb\xbf"
_LF: Final = 0x0A
_CR: Final = 0x0D
_COLON: Final = 0x3A
_DONE: Final = b"[DONE]"
_NOTHING: Final = b""  # the empty buffer (a bytearray only while bytes are pending)
# Far above any real event: vLLM's largest is its first chunk with the prompt's token IDs,
# about 7 bytes a prompt token. `fleet.max_event_bytes` takes its default from here.
DEFAULT_MAX_EVENT_BYTES: Final = 8 << 20


class EventTooLarge(EngineOutputError):
    """An event's block, or the unfinished one's bytes, passed the decoder's limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"engine sent an SSE event longer than fleet.max_event_bytes ({limit} bytes)"
        )
        self.limit = limit


class NoEventInLimit(EventTooLarge):
    """More bytes that are no event (comments, blank lines, blocks without data) came
    between two events, with the next one, than the decoder's limit."""

    def __init__(self, limit: int) -> None:
        EngineOutputError.__init__(
            self,
            f"engine sent more than fleet.max_event_bytes ({limit} bytes) of SSE lines "
            "without an event",
        )
        self.limit = limit


class SSEEvent(NamedTuple):
    """One dispatched event."""

    data: bytes
    """The `data:` lines joined with b"\\n"."""
    event: str | None
    """The `event:` field, or None for a plain ("message") event."""
    raw: bytes
    """The event's exact bytes as received, including the terminating blank line."""
    id: str | None = None
    """The last event ID seen so far in the stream (it persists across events)."""


def is_done(event: SSEEvent) -> bool:
    """The OpenAI-style end of stream, `data: [DONE]` (PROTOCOL.md §2.1). Some engines
    never send it (transformers serve, §6.3); the caller decides what a missing one means."""
    return event.data == _DONE


def format_event(data: bytes, event: str | None = None) -> bytes:
    """Frame `data` as one SSE event (the inverse of the decoder, for rewritten events).
    For a re-encoded JSON event `events.encode_sse_event` does both steps faster."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    # (`find` beats `in` on bytes by 2x in CPython 3.11; this runs per rewritten event.)
    if data.find(b"\n") != -1 or data.find(b"\r") != -1:
        lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        return head + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"
    return head + b"data: " + data + b"\n\n"


class SSEDecoder:
    """Feed bytes split anywhere; get the events they complete, in order."""

    __slots__ = (
        "_bom",
        "_data",
        "_event",
        "_head",
        "_head_size",
        "_last_id",
        "_limit",
        "_skip_lf",
        "_skipped",
        "_tail",
        "ignored",
    )

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._limit = max_event_bytes
        # The unfinished block: its complete lines, already parsed (kept for `raw`) ...
        self._head: list[bytes] = []
        self._head_size = 0
        # ... and its unfinished line, not yet parsed.
        self._tail: bytes | bytearray = _NOTHING
        # The last line ended with a CR at the end of the input: an LF next is its tail.
        self._skip_lf = False
        # Bytes of a possible BOM seen at the stream start; None once past the start.
        self._bom: bytes | None = b""
        # The current block's data lines (None: no data line yet) and event name.
        self._data: list[bytes] | None = None
        self._event: str | None = None
        self._last_id: str | None = None
        # Bytes since the last dispatched event that belong to no event: they count toward
        # the next event's limit (a flood of comments is bounded like one long event).
        self._skipped = 0
        self.ignored = 0
        """Bytes of the stream so far that belong to no event (for a bound on the total)."""

    @property
    def pending(self) -> bool:
        """Bytes arrived that no complete event or blank line has consumed yet. After
        the last `feed`, True means the stream ended inside an event (truncated)."""
        return bool(self._head) or bool(self._tail) or bool(self._bom)

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Take the next bytes of the stream; return the events they complete.

        Raises EventTooLarge when an event, or the unfinished one, passes the limit
        (NoEventInLimit, one of them, when the bytes of no event before it pass it)."""
        try:
            return self._feed(chunk)
        except EventTooLarge as error:
            kind = type(error)
        # Raised again from here, after the first error is gone: its traceback held the
        # frames below and their locals, the oversized buffer among them, and whoever
        # keeps the error (a future, a relay) would keep that buffer with it.
        self._drop()
        raise kind(self._limit)

    def _drop(self) -> None:
        self._tail = _NOTHING
        self._head = []
        self._head_size = 0
        self._data = None
        self._event = None
        self._skipped = 0

    def _feed(self, chunk: bytes) -> list[SSEEvent]:
        if self._bom is not None:
            chunk = self._strip_bom(chunk)
        if not chunk:
            return []
        tail = self._tail
        if chunk.find(b"\n") == -1 and chunk.find(b"\r") == -1:
            # No line can end in this chunk: keep it and stay linear when the stream
            # arrives a byte at a time.
            if tail:
                tail += chunk  # (a bytearray: in place)
            else:
                self._tail = tail = bytearray(chunk)
            self._skip_lf = False
            if self._head_size + len(tail) + self._skipped > self._limit:
                self._refuse(self._head_size + len(tail))
            return []
        if tail:
            self._tail = _NOTHING
            return self._parse(b"".join((tail, chunk)))
        return self._parse(chunk)

    def single(self, chunk: bytes) -> bytes | None:
        """The data of `chunk` when it is exactly one whole one-line `data: …` event
        ended by a blank LF line and nothing is pending (a live stream's usual read);
        else None, and nothing is consumed."""
        if self._head or self._tail or self._bom is not None or self._skip_lf or self._skipped:
            return None
        if (
            len(chunk) <= self._limit
            and chunk.startswith(b"data: ")
            and chunk.find(b"\n") == len(chunk) - 2
            and chunk.endswith(b"\n\n")
            and chunk.find(b"\r") == -1
        ):
            return chunk[6:-2]
        return None

    def feed_run(self, chunk: bytes) -> tuple[list[SSEEvent], bytes, list[bytes]]:
        """`feed`, with a fast path for vLLM's shape: returns `(events, run, datas)`.

        `events` are dispatched as by `feed` (here: the event a previous chunk left
        unfinished). `run` is the stretch of the chunk after them that holds nothing but
        whole one-line `data: …` events, each ended by a blank LF line, back to back;
        `datas` are their data, in order, after `events`. The bytes after the run start an
        event still arriving and stay buffered. Anything else (CR line ends, comments,
        other fields, several data lines) gives `feed(chunk)` and an empty run.

        Splitting a stretch at once costs a third of `_parse`'s per-event loop; the
        newline count proves every block is exactly one line.
        """
        if self._bom is not None:
            chunk = self._strip_bom(chunk)
            if not chunk:
                return [], b"", []
        if self._skip_lf or self._skipped or chunk.find(b"\r") != -1:
            return self.feed(chunk), b"", []
        events: list[SSEEvent] = []
        rest = chunk
        if self._head or self._tail:
            # Finish the pending event with the general parser (its blank line may
            # straddle the two chunks), then look at what follows.
            if not self._tail and self._head[-1].endswith(b"\n") and chunk.startswith(b"\n"):
                cut = 1
            else:
                cut = chunk.find(b"\n\n") + 2
                if cut == 1:
                    return self.feed(chunk), b"", []
            events = self.feed(chunk[:cut])
            rest = chunk[cut:]
            if self._head or self._tail or self._skipped:
                return events + self.feed(rest), b"", []
        last = rest.rfind(b"\n\n") + 2
        if last == 1:
            return events + self.feed(rest), b"", []
        run = rest[:last]
        if not run.startswith(b"data: "):
            return events + self.feed(rest), b"", []
        # Cut at every blank line followed by `data: `: when the run holds exactly the
        # newlines of that many one-line events, there is no other line anywhere, so every
        # piece is one event's data and every block started with `data: `.
        datas = run[6:-2].split(b"\n\ndata: ")
        if run.count(b"\n") != 2 * len(datas):
            return events + self.feed(rest), b"", []
        if last > self._limit and max(map(len, datas)) + 8 > self._limit:  # (8: the framing)
            raise EventTooLarge(self._limit)
        if last < len(rest):
            # No blank line in the tail (the run took the last one) and it cannot start
            # with LF (then the run would end in three), so this only buffers it.
            self.feed(rest[last:])
        return events, run, datas

    def close(self) -> list[SSEEvent]:
        """End of stream. An unterminated event is discarded, as the SSE rules say; check
        `pending` to tell a truncated stream from a clean end."""
        return []

    def _strip_bom(self, chunk: bytes) -> bytes:
        seen = self._bom + chunk if self._bom else chunk
        if len(seen) < len(_BOM) and _BOM.startswith(seen):
            self._bom = seen  # maybe a BOM still arriving
            return b""
        self._bom = None
        return seen[len(_BOM) :] if seen.startswith(_BOM) else seen

    def _parse(self, work: bytes) -> list[SSEEvent]:
        """Parse `work`: the unfinished line (if any) and the chunk after it."""
        events: list[SSEEvent] = []
        append = events.append
        find = work.find
        n = len(work)
        limit = self._limit
        head = self._head
        # The current block's first byte; -1 while it began in an earlier chunk (then its
        # complete lines are in `head`).
        start = -1 if head else 0
        pos = 0  # first byte not yet parsed
        if self._skip_lf:
            self._skip_lf = False
            if work[0] == _LF:
                pos = 1
                if start == 0:  # the CR ended a whole block: the LF is no one's
                    start = 1
                    self._skipped += 1
                    self.ignored += 1
        cr = find(b"\r", pos)
        stop = n if cr == -1 else cr  # no line before it ends at a CR
        while pos < n:
            if cr != -1 and cr < pos:
                cr = find(b"\r", pos)
                stop = n if cr == -1 else cr
            if pos == start:
                # The common case, as tight as it goes: whole `data: ...` lines each
                # followed by a blank LF line, all before any CR.
                last_id = self._last_id
                begin = pos
                while True:
                    lf = find(b"\n", pos, stop)
                    if (
                        lf == -1
                        or lf + 1 >= stop
                        or work[lf + 1] != _LF
                        or not work.startswith(b"data: ", pos)
                    ):
                        break
                    append(_new(SSEEvent, (work[pos + 6 : lf], None, work[pos : lf + 2], last_id)))
                    pos = lf + 2
                if self._skipped and pos != begin:
                    # The first event after bytes of no event: they count toward its limit.
                    self._count_gap(work.find(b"\n", begin) + 2 - begin)
                start = pos
                if pos >= n:
                    break
            if not work.startswith(b"data", pos) or work[pos + 4 : pos + 5] not in b":\r\n":
                # Lines that are not data (maybe a flood of them): a stretch at a time.
                skipped = self._skip(work, pos, start, cr)
                if skipped is not None:
                    pos, start = skipped
                    head = self._head
                    if pos >= n:
                        break
                    continue
            # The general case: parse one line, whatever ends it.
            lf = find(b"\n", pos, stop)
            if lf != -1:
                end = lf
                nxt = lf + 1
            elif cr != -1:
                end = cr
                if cr + 1 < n:
                    nxt = cr + 2 if work[cr + 1] == _LF else cr + 1
                else:
                    nxt = n
                    self._skip_lf = True
            else:
                break  # an incomplete line: wait for more bytes
            if end == pos:
                # A blank line ends the block; it dispatches only if data came.
                size = self._head_size + nxt if start < 0 else nxt - start
                if self._data is not None:
                    if size + self._skipped > limit:
                        self._refuse(size)
                    self._skipped = 0
                    if start < 0:
                        head.append(work[:nxt])
                        append(self._dispatch(b"".join(head)))
                    else:
                        append(self._dispatch(work[start:nxt]))
                else:
                    self._count_skipped(size)
                if start < 0:
                    self._head = head = []
                    self._head_size = 0
                self._event = None
                start = nxt
            else:
                self._field(work[pos:end])
            pos = nxt
        if n > limit:
            # Only a chunk past the limit can hold a whole event past it.
            for sse in events:
                if len(sse.raw) > limit:
                    raise EventTooLarge(limit)
        if start < n:
            # The unfinished block: its complete lines here, then its unfinished line.
            first = max(start, 0)
            if pos > first:
                head.append(work[first:pos])
                self._head_size += pos - first
            if pos < n:
                self._tail = bytearray(memoryview(work)[pos:])
            if self._head_size + len(self._tail) + self._skipped > limit:
                self._refuse(self._head_size + len(self._tail))
        return events

    def _refuse(self, size: int) -> None:
        """Raise for a block of `size` bytes that, with the bytes of no event before it,
        passes the limit: the block alone, or the bytes before it."""
        if size > self._limit:
            raise EventTooLarge(self._limit)
        raise NoEventInLimit(self._limit)

    def _count_gap(self, size: int) -> None:
        """An event of `size` bytes dispatched after bytes of no event: within the limit?"""
        if size + self._skipped > self._limit:
            self._refuse(size)
        self._skipped = 0

    def _count_skipped(self, size: int) -> None:
        """`size` more bytes that belong to no event."""
        self._skipped += size
        self.ignored += size
        if self._skipped > self._limit:
            raise NoEventInLimit(self._limit)

    def _skip(self, work: bytes, pos: int, start: int, cr: int) -> tuple[int, int] | None:
        """Skip the lines from `pos` (a line start, not a `data` line) up to the next
        `data` line, or the end of the last whole line, as `_field` and the blank-line rule
        would one by one: the last blank line starts the block that stays open, its last
        `event:` line names it, the stretch's last valid `id:` line sets the last ID, and
        every block before that blank line dispatched nothing. Inside a block that has data
        already, stop before its blank line (that dispatches it). Returns the new `(pos,
        start)`, or None to leave the line at `pos` to the line parser (a blank line that
        ends a block with data).
        """
        find = work.find
        n = len(work)
        has_cr = cr != -1
        # The stretch ends where the next `data` line starts (a line named exactly `data`).
        end = n
        if find(b"data", pos) != -1:  # (one fast scan spares the others in a flood)
            for pattern in _DATA_LINES if has_cr else _DATA_LINES_LF:
                found = find(pattern, pos, end)
                if found != -1:
                    end = found + 1
        if end == n:
            # No data line: up to the end of the last whole line (the rest is unfinished).
            last = work.rfind(b"\n", pos)
            if has_cr:
                last = max(last, work.rfind(b"\r", pos))
            end = last + 1
            if end <= pos:
                return None
        pending = self._data is not None
        if pending:
            # The block has data: its blank line dispatches it, so the stretch ends there.
            if work[pos] == _LF or work[pos] == _CR:
                return None
            for pattern in _BLANKS if has_cr else _BLANKS_LF:
                found = find(pattern, pos, end)
                if found != -1:
                    end = found + 1
            opened = pos  # the open block's lines in the stretch start here
        else:
            # The last blank line: the blocks before it (and it) dispatched nothing.
            blank = -1
            for pattern in _BLANKS if has_cr else _BLANKS_LF:
                blank = max(blank, work.rfind(pattern, pos, end))
            if blank != -1:
                blank += 1
            elif work[pos] == _LF or work[pos] == _CR:
                blank = pos
            if blank == -1:
                opened = pos
            else:
                opened = blank + 2 if work.startswith(b"\r\n", blank) else blank + 1
                if start < 0:
                    self._count_skipped(self._head_size + opened)
                    self._head = []
                    self._head_size = 0
                else:
                    self._count_skipped(opened - start)
                start = opened
                self._event = None
        if end == n and work[n - 1] == _CR:
            self._skip_lf = True  # an LF first in the next chunk ends no second line
        if find(b"event", opened, end) != -1:
            events = _EVENT_LINES if has_cr else _EVENT_LINES_LF
            value = _last_field(work, events, b"event", opened, end)
            if value is not None:
                self._event = value.decode("utf-8", "replace") or None
        if find(b"id", pos, end) != -1:
            self._skip_ids(work, pos, end, has_cr)
        if start >= 0 and end - start + self._skipped > self._limit:
            self._refuse(end - start)
        elif start < 0 and self._head_size + end + self._skipped > self._limit:
            self._refuse(self._head_size + end)
        return end, start

    def _skip_ids(self, work: bytes, pos: int, end: int, has_cr: bool) -> None:
        value = _last_field(work, _ID_LINES if has_cr else _ID_LINES_LF, b"id", pos, end)
        if value is None:
            return
        if value.find(b"\0") != -1:
            # Ignored (the SSE rules): the last one before it counts. Rare, so a regex.
            values = [v for v in _ID_FIELD.findall(work, pos, end) if v.find(b"\0") == -1]
            if not values:
                return
            value = values[-1]
        self._last_id = value.decode("utf-8", "replace")

    def _field(self, line: bytes) -> None:
        if line[0] == _COLON:
            return  # a comment
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            if self._data is None:
                self._data = [value]
            else:
                self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace") or None
        elif name == b"id" and b"\0" not in value:
            self._last_id = value.decode("utf-8", "replace")

    def _dispatch(self, raw: bytes) -> SSEEvent:
        assert self._data is not None
        data = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
        event = SSEEvent(data, self._event, raw, self._last_id)
        self._data = None
        self._event = None
        return event


# NamedTuple's generated __new__ is Python code; calling the tuple constructor is not.
_new: Final = tuple.__new__


def _lines(name: bytes, cr: bool) -> tuple[bytes, ...]:
    """What the start of a line whose field name is exactly `name` looks like after the
    line end before it: the name, then a colon or its own line end."""
    ends = (b"\n", b"\r") if cr else (b"\n",)
    return tuple(e + name + after for e in ends for after in (b":", b"\n", b"\r"))


_DATA_LINES: Final = _lines(b"data", True)
_DATA_LINES_LF: Final = _lines(b"data", False)[:2]  # (no CR in the work: no `data\r`)
_EVENT_LINES: Final = _lines(b"event", True)
_EVENT_LINES_LF: Final = _lines(b"event", False)[:2]
_ID_LINES: Final = _lines(b"id", True)
_ID_LINES_LF: Final = _lines(b"id", False)[:2]
# A line end, then another: a blank line starts at the second.
_BLANKS: Final = (b"\n\n", b"\n\r", b"\r\r")
_BLANKS_LF: Final = (b"\n\n",)
# Every `id` field's value (one leading space dropped), for the rare id that holds a NUL.
_ID_FIELD: Final = re.compile(rb"(?:^|(?<=[\r\n]))id(?::[ ]?([^\r\n]*))?(?=[\r\n])")


def _last_field(
    work: bytes, patterns: tuple[bytes, ...], name: bytes, start: int, end: int
) -> bytes | None:
    """The value of the last line in `work[start:end]` (whole lines, `start` a line start)
    whose field name is exactly `name`, or None if there is none."""
    found = -1
    for pattern in patterns:
        found = max(found, work.rfind(pattern, start, end))
    if found != -1:
        line = found + 1
    elif work.startswith(name, start) and work[start + len(name) : start + len(name) + 1] in (
        b":",
        b"\n",
        b"\r",
    ):
        line = start
    else:
        return None
    stop = work.find(b"\n", line, end)
    cr = work.find(b"\r", line, end if stop == -1 else stop)
    if cr != -1:
        stop = cr
    value = work[line + len(name) : stop]
    if value[:1] == b":":
        value = value[2:] if value[1:2] == b" " else value[1:]
    return value
