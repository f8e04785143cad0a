"""Choice indices are bounded by the `n` the engine was asked for (always 1: requests with
n > 1 are refused): an index the request could not produce is malformed engine output,
on the plain and the general path alike, streaming or not, before any state is built
for it (one event with a million indices made the assembler build a million choices)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.protocol.assembly import Assembler
from narwhal.protocol.events import EngineOutputError, Route, decode_event
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.forward import StreamCollector, StreamForwarder
from narwhal.protocol.plain import decode_plain
from narwhal.protocol.tracker import OutputTracker
from narwhal.protocol.upstream import CHOICES

EVERYTHING = Exposure(token_ids=True, usage=True, continuous_usage=False)


def choice(route: Route, index: Any, text: str = "a", ids: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"index": index, "finish_reason": None}
    if route == "chat":
        out["delta"] = {"content": text}
    else:
        out["text"] = text
    if ids:
        out["token_ids"] = [7]
    return out


def data(*choices: dict[str, Any]) -> bytes:
    return json.dumps({"id": "c", "choices": list(choices)}, separators=(",", ":")).encode()


@pytest.mark.parametrize("route", ["chat", "completion"])
@pytest.mark.parametrize("index", [1, 2, 999_999])  # -1 is malformed: test_malformed_events
@pytest.mark.parametrize("token_ids", [True, False])
def test_the_tracker_refuses_an_index_past_n_on_both_paths(
    route: Route, index: int, token_ids: bool
) -> None:
    event = data(choice(route, 0), choice(route, index))
    plain = decode_plain(event)
    assert plain is not None
    for observe in (
        lambda t: t.observe_plains([plain], 1.0),
        lambda t: t.observe(decode_event(event), 1.0),
    ):
        tracker = OutputTracker(route, token_ids=token_ids, choices=CHOICES)
        with pytest.raises(EngineOutputError, match=f"choice index {index}: the request asked"):
            observe(tracker)
    # Without a bound (tests of wider streams), the same event passes.
    OutputTracker(route, token_ids=token_ids).observe(decode_event(event), 1.0)


def test_the_tracker_counts_what_came_before_in_the_read() -> None:
    good, bad = data(choice("chat", 0)), data(choice("chat", 1))
    plains = [decode_plain(good), decode_plain(good), decode_plain(bad)]
    tracker = OutputTracker("chat", token_ids=True, choices=1)
    with pytest.raises(EngineOutputError, match="choice index 1"):
        tracker.observe_plains(plains, 2.0)  # type: ignore[arg-type]
    assert (tracker.tokens, list(tracker.event_times)) == (2, [2.0])


@pytest.mark.parametrize("route", ["chat", "completion"])
@pytest.mark.parametrize("stream", [True, False])
def test_both_sinks_fail_a_wide_event(route: Route, stream: bool) -> None:
    """One event with indices 0 .. 9,999 fails at index 1, whole or split."""
    wide = b"data: " + data(*(choice(route, i) for i in range(10_000))) + b"\n\n"
    first = b"data: " + data(choice(route, 0)) + b"\n\n"
    for chunks in ([first + wide], [first, wide], [first, wide[:1000], wide[1000:]]):
        tracker = OutputTracker(route, token_ids=True, choices=CHOICES)
        if stream:
            sink: StreamForwarder | StreamCollector = StreamForwarder(tracker, EVERYTHING)
        else:
            sink = StreamCollector(tracker, Assembler(route, EVERYTHING, choices=CHOICES))
        with pytest.raises(EngineOutputError, match="choice index 1: the request asked"):
            for chunk in chunks:
                sink.feed(chunk, 1.0)


@pytest.mark.parametrize("route", ["chat", "completion"])
def test_the_assembler_refuses_an_index_past_n(route: Route) -> None:
    assembler = Assembler(route, EVERYTHING, choices=1)
    assembler.add(decode_event(data(choice(route, 0))))
    with pytest.raises(EngineOutputError, match="choice index 1: the request asked for one"):
        assembler.add(decode_event(data(*(choice(route, i) for i in range(1, 1000)))))
    wider = Assembler(route, EVERYTHING, choices=2)
    wider.add(decode_event(data(choice(route, 1))))
    with pytest.raises(EngineOutputError, match="the request asked for 2 choices"):
        wider.add(decode_event(data(choice(route, 2))))
