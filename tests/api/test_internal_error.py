"""A router bug on a completion route is answered 500 and counted `internal_error`
(DESIGN.md §3), never as an engine's `upstream_error`. The router runs in this process,
its service replaced by one that fails the way a bug does."""

from __future__ import annotations

import json
import logging
from typing import Any, NoReturn

import aiohttp
import pytest
from aiohttp import web

from narwhal.api import completions
from narwhal.config import Config
from narwhal.protocol.forward import StreamCollector, StreamForwarder
from narwhal.router import Router
from tests.e2e.test_admission import GAUGES
from tests.hostile_engine import HostileEngine, Script
from tests.in_process import serve_app
from tests.metrics_text import samples

MODEL = "m"
INTERNAL = 'narwhal_outcomes_total{outcome="internal_error"}'
UPSTREAM = 'narwhal_outcomes_total{outcome="upstream_error"}'


async def test_a_router_bug_is_a_500_counted_internal_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = Router(Config(model=MODEL, engines=()))

    async def serve(*args: Any) -> NoReturn:
        raise RuntimeError("a bug")

    router.dispatcher.serve = serve  # type: ignore[method-assign]
    runner, base = await serve_app(router.app)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/metrics") as resp:
                before = samples(await resp.text())
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            with caplog.at_level(logging.ERROR, logger="narwhal.api.completions"):
                async with session.post(base + "/v1/chat/completions", json=body) as resp:
                    status, answer = resp.status, await resp.json()
            async with session.get(base + "/metrics") as resp:
                after = samples(await resp.text())
    finally:
        await runner.cleanup()
    assert before[INTERNAL] == 0
    assert status == 500
    assert answer["error"]["type"] == "server_error" and answer["error"]["code"] is None
    assert (after[INTERNAL], after[UPSTREAM]) == (1, 0)
    assert after["narwhal_offered_total"] == 1
    assert any("failed unexpectedly" in r.getMessage() for r in caplog.records)


# --- Bugs in the request's own path (the engine is real, a router part raises) -------
#
# The router runs in this process against a hostile engine on loopback that answers
# properly; a scorer or a stream sink raises the way a bug does. Before the response
# starts that is a 500; after it, one error event (no `[DONE]`). Either way the request
# is counted `internal_error` (never `upstream_error`, never an engine failure) and the
# bug is logged once, with its traceback.

ENGINE_FAILURES = "narwhal_engine_failures_total"
CHUNK = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
FINISH = b'data: {"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
# A usage-only chunk first: a client that did not ask for usage gets no bytes for it, so
# the relay reads the rest itself (pull) instead of having it pushed.
USAGE = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":0}}\n\n'


class Bug(RuntimeError):
    pass


class BuggyScorer:
    def cost(self, *args: object) -> float:
        raise Bug("a bug in the scorer")


def _raising_on_call(original: Any, call: int, marker: bytes | None = None) -> Any:
    """`original` (a sink's `feed`), raising `Bug` on its `call`-th call (with `marker`:
    on the first call whose bytes hold it)."""
    calls = 0

    def feed(self: Any, chunk: bytes, now: float) -> bytes:
        nonlocal calls
        calls += 1
        if calls == call if marker is None else marker in chunk:
            raise Bug("a bug in the stream sink")
        result: bytes = original(self, chunk, now)
        return result

    return feed


async def _run(
    caplog: pytest.LogCaptureFixture,
    pieces: list[bytes],
    *,
    stream: bool,
    bug: Any,
    pause_after: int = 1,
) -> tuple[int | None, bytes, dict[str, float]]:
    """One request through a router whose `bug(router)` has been planted, with two
    engines (so that the scorer has a choice to make); the status (None: the connection
    was cut before the response was whole), the body and the metrics afterwards."""
    script = Script(pieces, pause_after=pause_after)
    async with HostileEngine(lambda body: script, ports=2) as engine:
        router = Router(engine.config(MODEL))
        bug(router)
        runner, base = await serve_app(router.app)
        try:
            async with aiohttp.ClientSession() as session:
                body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
                body["stream"] = stream
                status: int | None
                with caplog.at_level(logging.WARNING, logger="narwhal"):
                    try:
                        async with session.post(base + "/v1/chat/completions", json=body) as r:
                            status, raw = r.status, await r.read()
                    except aiohttp.ClientPayloadError as cut:  # the connection was cut
                        status, raw = None, repr(cut).encode()
                async with session.get(base + "/metrics") as resp:
                    values = samples(await resp.text())
        finally:
            await runner.cleanup()
    return status, raw, values


def _assert_one_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with_traceback = [r for r in caplog.records if r.exc_info is not None]
    assert len(with_traceback) == 1, [r.getMessage() for r in with_traceback]
    (record,) = with_traceback
    assert record.exc_info is not None and record.exc_info[0] is Bug
    assert record.levelno == logging.ERROR


def _assert_counted_internal(values: dict[str, float]) -> None:
    assert (values[INTERNAL], values[UPSTREAM]) == (1, 0)
    assert values["narwhal_offered_total"] == 1
    assert not any(v for k, v in values.items() if k.startswith(ENGINE_FAILURES)), values


def _plant_scorer(router: Router) -> None:
    router.scheduler.scorer = BuggyScorer()


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
async def test_a_scorer_bug_is_a_500_counted_internal_error(
    caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    status, raw, values = await _run(caplog, [CHUNK, FINISH], stream=stream, bug=_plant_scorer)
    assert status == 500, raw
    assert json.loads(raw)["error"]["type"] == "server_error"
    _assert_counted_internal(values)
    _assert_one_traceback(caplog)


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
async def test_a_sink_bug_before_the_response_starts_is_a_500_counted_internal_error(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    sink = StreamForwarder if stream else StreamCollector

    def plant(router: Router) -> None:
        monkeypatch.setattr(sink, "feed", _raising_on_call(sink.feed, 1))

    status, raw, values = await _run(caplog, [CHUNK, FINISH], stream=stream, bug=plant)
    assert status == 500, raw
    assert json.loads(raw)["error"]["type"] == "server_error"
    _assert_counted_internal(values)
    _assert_one_traceback(caplog)


@pytest.mark.parametrize(
    ("pieces", "marker"),
    # (the response starts at the first output: after a usage-only chunk, the chunk
    # after it; the bug strikes in the read of the finish, after the pause before it)
    [([CHUNK, CHUNK, FINISH], None), ([USAGE, CHUNK, FINISH], b"finish_reason")],
    ids=["pushed", "after a usage chunk"],
)
async def test_a_sink_bug_while_streaming_is_an_error_event_counted_internal_error(
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    pieces: list[bytes],
    marker: bytes | None,
) -> None:
    def plant(router: Router) -> None:
        feed = _raising_on_call(StreamForwarder.feed, 2, marker)
        monkeypatch.setattr(StreamForwarder, "feed", feed)

    status, raw, values = await _run(
        caplog, pieces, stream=True, bug=plant, pause_after=len(pieces) - 1
    )
    assert status == 200
    events = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] != b"[DONE]" and b"[DONE]" not in events, raw
    last = json.loads(events[-1])
    assert last["error"]["type"] == "server_error" and last["error"]["code"] is None
    _assert_counted_internal(values)
    _assert_one_traceback(caplog)


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
async def test_a_bug_in_accounting_after_the_answer_still_releases_everything(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """The engine stream is accounted once the answer is written (streaming) or
    assembled: a bug there is the request's `internal_error`, its slots go back all the
    same, and no 500 is written over a response that has started."""

    def plant(router: Router) -> None:
        def end_attempt(*args: object) -> None:
            raise Bug("a bug in accounting")

        monkeypatch.setattr(router.dispatcher, "end_attempt", end_attempt)

    status, raw, values = await _run(caplog, [CHUNK, FINISH], stream=stream, bug=plant)
    if stream:
        assert status == 200
        assert raw.endswith(b"data: [DONE]\n\n"), raw  # the answer was whole already
    else:
        assert status == 500, raw
    _assert_counted_internal(values)
    _assert_one_traceback(caplog)
    for gauge in GAUGES:
        assert values[gauge] == 0, gauge


async def test_no_500_is_written_over_a_stream_response_a_bug_escaped_from(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last net: whatever escapes the relay once its response is prepared ends the
    connection, instead of a 500 the client would read as part of the stream."""

    async def relay_stream(http: web.Request, *args: object) -> NoReturn:
        await web.StreamResponse(headers={"Content-Type": "text/event-stream"}).prepare(http)
        raise Bug("a bug in the relay")

    def plant(router: Router) -> None:
        monkeypatch.setattr(completions, "relay_stream", relay_stream)

    status, raw, values = await _run(caplog, [CHUNK, FINISH], stream=True, bug=plant)
    assert status is None, raw
    _assert_counted_internal(values)
    _assert_one_traceback(caplog)
