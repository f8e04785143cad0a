"""`narwhal serve --otlp-endpoint`: the router's spans reach an OTLP/HTTP collector (here a
loopback server that decodes what it is sent), including those still queued at
shutdown. Skipped where the otel extra is not installed (it is part of the dev extra)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.e2e.conftest import Start, chat, fleet_config, send, sim_process
from tests.in_process import serve_app
from tests.processes import router_process

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def value(any_value: AnyValue) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return tuple(value(v) for v in any_value.array_value.values)
    return getattr(any_value, kind)


async def test_spans_go_to_the_collector(start: Start) -> None:
    bodies: list[tuple[str, bytes]] = []

    async def traces(request: web.Request) -> web.Response:
        bodies.append((request.content_type, await request.read()))
        return web.Response(body=b"", content_type="application/x-protobuf")

    collector = web.Application()
    collector.router.add_post("/v1/traces", traces)
    runner, base = await serve_app(collector)
    try:
        sim = start(sim_process("--time-scale", "0"))
        # The collector's base URL: the router posts to its /v1/traces.
        config = fleet_config([("e0", sim, "vllm")], tracing={"service_name": "router-a"})
        router = start(router_process(config, "--otlp-endpoint", base))
        reply = await send(router.url, chat("Hello", max_tokens=3), {"traceparent": TRACEPARENT})
        assert reply.status == 200
        # Batched spans are exported at the latest when the router shuts down (the
        # collector answers on this loop, so the wait is in a thread).
        assert await asyncio.to_thread(router.terminate) == 0
    finally:
        await runner.cleanup()

    assert bodies and {content_type for content_type, _ in bodies} == {"application/x-protobuf"}
    spans: dict[str, Any] = {}
    for _, body in bodies:
        export = ExportTraceServiceRequest.FromString(body)
        for resource_spans in export.resource_spans:
            resource = {a.key: value(a.value) for a in resource_spans.resource.attributes}
            assert resource["service.name"] == "router-a"
            for scope_spans in resource_spans.scope_spans:
                assert scope_spans.scope.name == "narwhal"
                spans.update((span.name, span) for span in scope_spans.spans)
    assert set(spans) == {"POST /v1/chat/completions", "admission wait", "placement", "decode"}
    assert {span.trace_id.hex() for span in spans.values()} == {TRACE_ID}
    request = spans["POST /v1/chat/completions"]
    assert request.parent_span_id.hex() == "00f067aa0ba902b7"
    attributes = {a.key: value(a.value) for a in request.attributes}
    assert attributes["narwhal.outcome"] == "completed"
    assert attributes["narwhal.engines"] == ("e0",)
    assert attributes["narwhal.completion_tokens"] == 3
