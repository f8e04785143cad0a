"""An event that fails an attempt raises an error that nothing else keeps: once the
handler lets go of it, it is gone, without a garbage collection.

An error that its own traceback's frames hold (`error = ...; raise error`) is a reference
cycle, and every frame below it stays alive with it: the sink's decoder, the assembler
and the chunk being read, for a large body hundreds of megabytes (tests/api/
test_failed_attempt_memory.py measures that end to end).
"""

from __future__ import annotations

import weakref

import pytest

from narwhal.errors import UpstreamError
from narwhal.protocol.assembly import Assembler
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.forward import StreamCollector, StreamForwarder
from narwhal.protocol.tracker import OutputTracker

EXPOSURE = Exposure(token_ids=False, usage=False, continuous_usage=False)
FAILING = {
    "engine error": b'data: {"error":{"message":"boom","type":"InternalServerError"}}\n\n',
    "flat engine error": b'data: {"object":"error","message":"boom","code":500}\n\n',
    "not JSON": b"data: {oops\n\n",
    "bad token id": b'data: {"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[-1]}]}\n\n',
    "missing token ids": b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n',
}


@pytest.mark.usefixtures("no_gc")
@pytest.mark.parametrize("streaming", [True, False], ids=["forwarder", "collector"])
@pytest.mark.parametrize("name", list(FAILING))
def test_the_error_is_freed_when_the_handler_drops_it(name: str, streaming: bool) -> None:
    tracker = OutputTracker("chat", token_ids=True)
    sink: StreamForwarder | StreamCollector
    if streaming:
        sink = StreamForwarder(tracker, EXPOSURE)
    else:
        sink = StreamCollector(tracker, Assembler("chat", EXPOSURE))
    ref: weakref.ref[UpstreamError] | None = None
    try:
        sink.feed(FAILING[name], 0.0)
    except UpstreamError as error:
        ref = weakref.ref(error)
    assert ref is not None, "the event did not fail"
    assert ref() is None, "the error outlived its handler"
