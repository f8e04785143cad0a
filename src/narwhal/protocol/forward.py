"""One engine stream's bytes in: the streaming client's bytes, or the assembler's events, out.

Both sinks decode the engine's SSE, pass every event through the attempt's
`OutputTracker` exactly once (validation, accounting, timing), then through
`shape.check_event` (what is malformed: the collector's assembler runs it, so a stream
refuses what assembly refuses; plain events are typed to the same rules), and count what
they saw, so the dispatcher can tell "no event yet" from "events in hand" and a clean end
(`done`: the engine's `data: [DONE]`) from a truncated one.

- `StreamForwarder` (streaming clients) returns the bytes to write for each read. Plain
  events (`plain.py`) go out as the engine's own bytes, with the `token_ids` keys cut
  out when the client did not ask for IDs; every other event takes the general path:
  decoded to a dict, `apply_exposure`, and its raw bytes or a re-encoding.
- `StreamCollector` (non-streaming clients) hands every decoded event to the assembler,
  up to `[DONE]` (what follows is ignored) and up to `max_response_bytes` of events'
  data: past it the attempt fails, since the whole answer is held until its end.

`[DONE]` is never forwarded: the relay writes its own after a clean end, so a stream cut
short can never look complete.

Metadata the engine moved: vLLM puts `system_fingerprint` on its last chunk, or on the
usage-only chunk when there is one (PROTOCOL.md §2.2). Narwhal always asks for that chunk;
for a client that did not, the forwarder holds the client's bytes back from the moment
every choice has finished until that chunk (or the end) comes, and puts the fingerprint
back on the last chunk, where the engine would have written it. Nothing waits on more
than the engine's next event: the usage chunk follows the last chunk at once.
"""

from __future__ import annotations

from typing import Any, Final, cast

import msgspec

from narwhal.protocol.assembly import DEFAULT_MAX_RESPONSE_BYTES, Assembler, ResponseTooLarge
from narwhal.protocol.echo import restore_echo
from narwhal.protocol.events import decode_event, encode_sse_event
from narwhal.protocol.exposure import Exposed, Exposure, apply_exposure, needs_rewrite
from narwhal.protocol.plain import (
    PlainEvent,
    decode_plain,
    decode_plains,
    id_list_keys,
    is_quiet,
    null_id_names,
    null_token_ids,
    quiet_events,
    strip_token_ids,
)
from narwhal.protocol.shape import check_event
from narwhal.protocol.sse import DEFAULT_MAX_EVENT_BYTES, SSEDecoder, SSEEvent
from narwhal.protocol.tracker import OutputTracker

_DONE: Final = b"[DONE]"
# Top-level keys vLLM writes on the usage-only chunk instead of its last chunk.
_MOVED_TO_USAGE_CHUNK: Final = ("system_fingerprint",)
_encode: Final = msgspec.json.encode


class StreamForwarder:
    __slots__ = (
        "_completion",
        "_decoder",
        "_echo",
        "_exposure",
        "_held",
        "_hide_ids",
        "_holds_last",
        "_moved",
        "_null_ids",
        "_rewrite",
        "_usage_dropped",
        "done",
        "events",
        "tracker",
    )

    def __init__(
        self,
        tracker: OutputTracker,
        exposure: Exposure,
        *,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        self.tracker = tracker
        self._exposure = exposure
        self._rewrite = needs_rewrite(exposure)
        self._echo = exposure.echo_text  # the echoed prompt text to put back (echo.py)
        self._hide_ids = not exposure.token_ids
        # vLLM writes unasked ID lists as null: the client gets nulls, not missing keys.
        self._null_ids = exposure.null_ids
        # Completion chunks carry `"prompt_token_ids": null` per choice (chat: top level).
        self._completion = tracker.route == "completion"
        self._decoder = SSEDecoder(max_event_bytes)
        # The usage-only chunk is dropped for this client: hold the last chunk for it.
        self._holds_last = not exposure.usage
        self._held = b""  # client bytes held back (see the module docstring)
        self._moved: dict[str, Any] | None = None  # metadata taken off the usage chunk
        self._usage_dropped = False
        self.done = False  # the engine's `data: [DONE]` came
        self.events = 0  # events seen, [DONE] included

    @property
    def pending(self) -> bool:
        """Bytes of an unfinished event are held (the stream would end mid-event)."""
        return self._decoder.pending

    def feed(self, chunk: bytes, now: float) -> bytes:
        """Take the engine's next bytes; return what the client gets for them (maybe b"").

        Raises UpstreamError when an event fails the attempt.
        """
        out = self._forward(chunk, now)
        if self._holds_last and (self._held or self.tracker.finish_seen):
            return self._hold_last(out)
        return out

    def flush(self) -> bytes:
        """The bytes still held back, at the end of the stream (whatever ended it)."""
        held, self._held = self._held, b""
        return held

    def release(self) -> None:
        """The stream is over: drop what is buffered (an unfinished event can be as long
        as the engine made it), whoever still holds this forwarder."""
        self._decoder = SSEDecoder()
        self._held = b""
        self._moved = None

    def _hold_last(self, out: bytes) -> bytes:
        if self._held:
            out = self._held + out
            self._held = b""
        if self._moved is not None:
            out = _with_members(out, self._moved)
            self._moved = None
        if out and self.tracker.finished and not (self.done or self._usage_dropped):
            self._held = out
            return b""
        return out

    def _forward(self, chunk: bytes, now: float) -> bytes:
        data = self._decoder.single(chunk)
        if data is not None:
            self.events += 1
            return self._one(data, None, chunk, now)
        events, run, datas = self._decoder.feed_run(chunk)
        if not datas:
            return self._feed_events(events, now)
        if not events:
            return self._feed_run(run, datas, now)
        return self._feed_events(events, now) + self._feed_run(run, datas, now)

    def _feed_run(self, run: bytes, datas: list[bytes], now: float) -> bytes:
        """Whole one-line `data:` events back to back: when they all are plain, the run
        itself is what the client gets (less the token_ids keys, maybe)."""
        self.events += len(datas)
        tracker = self.tracker
        plains, others = decode_plains(datas, run.isascii())
        replaced: dict[int, bytes] = {}
        if not others:
            keys = tracker.observe_plains(cast("list[PlainEvent]", plains), now)
        else:
            # In stream order: the plain stretches between the others, and each other.
            keys = 0
            start = 0
            for i in others:
                keys += tracker.observe_plains(cast("list[PlainEvent]", plains[start:i]), now)
                replaced[i] = self._general(datas[i], None, _frame(datas[i]), now)
                start = i + 1
            keys += tracker.observe_plains(cast("list[PlainEvent]", plains[start:]), now)
        if not keys or not self._hide_ids:
            return _replace(run, datas, replaced) if replaced else run
        for i in quiet_events(plains):
            # Maybe only IDs: the exposure rules judge it whole (already accounted).
            replaced[i] = self._exposed(datas[i], _frame(datas[i]))
            keys -= id_list_keys(cast(PlainEvent, plains[i]))
        out = _replace(run, datas, replaced) if replaced else run
        if self._null_ids and replaced:
            # The exposed events spliced in keep their ID keys too, as nulls.
            keys += null_id_names(replaced.values(), prompt_names=self._completion)
        stripped = self._without_ids(out, keys)
        if stripped is not None:
            return stripped
        # Not the compact shape: strip (or re-encode) event by event; all accounted above.
        pieces: list[bytes] = []
        for i, (data, plain) in enumerate(zip(datas, plains, strict=True)):
            if plain is None or i in replaced:  # an other or a quiet one: already exposed
                pieces.append(replaced[i])
            else:
                pieces.append(self._stripped(data, _frame(data), id_list_keys(plain)))
        return b"".join(pieces)

    def _feed_events(self, events: list[SSEEvent], now: float) -> bytes:
        if not events:
            return b""
        self.events += len(events)
        return b"".join([self._one(sse.data, sse.event, sse.raw, now) for sse in events])

    def _one(self, data: bytes, name: str | None, raw: bytes, now: float) -> bytes:
        """One event (`raw` its bytes as received): plain if it is, else general."""
        if name is None:
            plain = decode_plain(data)
            if plain is not None:
                keys = self.tracker.observe_plains((plain,), now)
                if not keys or not self._hide_ids:
                    return raw
                if is_quiet(plain):
                    return self._exposed(data, raw)
                return self._stripped(data, raw, keys)
        return self._general(data, name, raw, now)

    def _general(self, data: bytes, name: str | None, raw: bytes, now: float) -> bytes:
        """Any event but a plain one: `[DONE]`, or decoded, accounted and exposed."""
        if data == _DONE:
            self.done = True
            return b""
        decoded = decode_event(data)
        self.tracker.observe(decoded, now)
        # What the assembler refuses as malformed never reaches a streaming client either.
        check_event(decoded, self.tracker.route)
        if not self._rewrite:
            return raw
        usage_only = self._holds_last and "usage" in decoded and not decoded.get("choices")
        # (The echo chunk carries the prompt's IDs, so it is never plain: it comes here.)
        echo = self._echo
        restored = echo is not None and restore_echo(decoded, echo)
        verdict = apply_exposure(decoded, self._exposure)
        if verdict is Exposed.UNCHANGED:
            return encode_sse_event(decoded, name) if restored else raw
        if verdict is Exposed.CHANGED:
            return encode_sse_event(decoded, name)
        if usage_only:  # dropped: what the engine moved onto it goes back
            self._usage_dropped = True
            moved = {key: decoded[key] for key in _MOVED_TO_USAGE_CHUNK if key in decoded}
            if moved:
                self._moved = moved
        return b""

    def _stripped(self, data: bytes, raw: bytes, keys: int) -> bytes:
        """A plain event (already accounted, `keys` its ID-list keys) without its IDs."""
        stripped = self._without_ids(raw, keys)
        if stripped is not None:
            return stripped
        return self._exposed(data, raw)

    def _without_ids(self, raw: bytes, keys: int) -> bytes | None:
        """`raw`'s ID lists cut out, or written as null (`null_ids`); None when the bytes
        cannot be rewritten safely (the caller then takes the decoded way)."""
        if self._null_ids:
            return null_token_ids(raw, keys, prompt_names=self._completion)
        return strip_token_ids(raw, keys, prompt_nulls=self._completion)

    def _exposed(self, data: bytes, raw: bytes) -> bytes:
        """A plain event (already accounted) through the exposure rules, decoded."""
        decoded = decode_event(data)
        verdict = apply_exposure(decoded, self._exposure)
        if verdict is Exposed.UNCHANGED:
            return raw
        return encode_sse_event(decoded) if verdict is Exposed.CHANGED else b""


def _replace(run: bytes, datas: list[bytes], replaced: dict[int, bytes]) -> bytes:
    """`run` with the events at the `replaced` indices swapped for their new bytes."""
    pieces: list[bytes] = []
    copied = 0  # the first byte of `run` not yet in `pieces`
    at = 0  # where event `index` starts
    index = 0
    for i in sorted(replaced):
        at += sum(map(len, datas[index:i])) + 8 * (i - index)  # 8: b"data: " + b"\n\n"
        pieces.append(run[copied:at])
        pieces.append(replaced[i])
        at += len(datas[i]) + 8
        copied = at
        index = i + 1
    pieces.append(run[copied:])
    return b"".join(pieces)


def _with_members(out: bytes, members: dict[str, Any]) -> bytes:
    """`out` with `members` added to its last event, when that is one `data:` line holding
    a JSON object without them; else `out` as it is. The event's own bytes stay as they
    are: the members go in before its closing brace."""
    body = out.rstrip(b"\r\n")  # less the blank line that ends the event
    if not body.endswith(b"}"):
        return out
    line = body[max(body.rfind(b"\n"), body.rfind(b"\r")) + 1 :]
    if not line.startswith(b"data:"):
        return out
    try:
        event = msgspec.json.decode(line[5:])
    except msgspec.DecodeError:
        return out
    if type(event) is not dict:
        return out
    added = b"".join(
        b"," + _encode(key) + b":" + _encode(value)
        for key, value in members.items()
        if key not in event
    )
    if not added:
        return out
    return body[:-1] + added + b"}" + out[len(body) :]


def _frame(data: bytes) -> bytes:
    """A one-line `data:` event's bytes, as `SSEDecoder.feed_run` found it."""
    return b"data: " + data + b"\n\n"


class StreamCollector:
    __slots__ = ("_assembler", "_decoder", "_left", "_limit", "done", "events", "tracker")

    def __init__(
        self,
        tracker: OutputTracker,
        assembler: Assembler,
        *,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        self.tracker = tracker
        self._assembler: Assembler | None = assembler
        self._decoder = SSEDecoder(max_event_bytes)
        self._limit = max_response_bytes
        self._left = max_response_bytes  # bytes of event data the answer may still take
        self.done = False
        self.events = 0

    @property
    def pending(self) -> bool:
        return self._decoder.pending

    def flush(self) -> bytes:
        return b""  # nothing is ever written for a non-streaming client

    def release(self) -> None:
        """The stream is over: drop the unfinished event and the assembled output (the
        caller took its result already), whoever still holds this collector."""
        self._decoder = SSEDecoder()
        self._assembler = None

    def feed(self, chunk: bytes, now: float) -> bytes:
        """Take the engine's next bytes and assemble their events; nothing to write."""
        decoder = self._decoder
        data = decoder.single(chunk)
        if data is not None:
            self._add(data, now)
            return b""
        events, _, datas = decoder.feed_run(chunk)
        for sse in events:
            self._add(sse.data, now)
        for data in datas:
            self._add(data, now)
        return b""

    def _add(self, data: bytes, now: float) -> None:
        if self.done:
            return  # after the engine's [DONE]: not part of the answer
        self.events += 1
        if data == _DONE:
            self.done = True
            return
        self._left -= len(data)
        if self._left < 0:
            raise ResponseTooLarge(self._limit)
        decoded = decode_event(data)
        self.tracker.observe(decoded, now)
        assembler = self._assembler
        if assembler is None:
            raise RuntimeError("a released stream collector was fed")
        assembler.add(decoded)
