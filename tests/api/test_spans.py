"""The router's own spans (OpenTelemetry SDK, in-memory exporter) in front of a P/D pair:
their tree under the client's traceparent, their attributes (never a prompt or an
output), and the span context each engine request carries to its engine.

Skipped where the otel extra is not installed (it is part of the dev extra)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from narwhal.config import AdmissionConfig, Config, EngineConfig, FleetConfig
from narwhal.observability.otel import OtelTracer
from narwhal.router import Router
from narwhal.sim import SimOptions, start_sim
from tests.in_process import serve_app

MODEL = "narwhal-sim"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
TRACESTATE = "congo=t61rcWkgMzE"
MARKER = "okapi-marker-5c21e0"


@dataclass
class Fleet:
    url: str
    exporter: InMemorySpanExporter
    trace_logs: dict[str, Path]

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def received(self, role: str) -> list[dict[str, Any]]:
        path = self.trace_logs[role]
        return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    logs = {role: tmp_path / f"{role}.log" for role in ("prefill", "decode")}
    sims = {
        role: await start_sim(
            SimOptions(model=MODEL, time_scale=0.0, role=role, trace_log=str(log))
        )
        for role, log in logs.items()
    }
    config = Config(
        model=MODEL,
        engines=tuple(
            EngineConfig(name=f"{role[0]}0", url=sim.url, role=role) for role, sim in sims.items()
        ),
        admission=AdmissionConfig(mode="open"),
        fleet=FleetConfig(max_attempts=1),
    )
    exporter = InMemorySpanExporter()
    router = Router(config, tracer=OtelTracer(exporter, batch=False))
    runner, base = await serve_app(router.app)
    try:
        yield Fleet(base, exporter, logs)
    finally:
        await runner.cleanup()
        for sim in sims.values():
            await sim.close()


async def post(fleet: Fleet, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session:
        url = fleet.url + "/v1/chat/completions"
        async with session.post(url, json=body, headers=headers) as response:
            return response.status, await response.read()


def chat(content: str, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


def named(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    (span,) = [s for s in spans if s.name == name]
    return span


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def traceparent(span: ReadableSpan) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


@pytest.mark.parametrize("stream", [True, False])
async def test_a_request_is_a_tree_of_spans_under_the_clients(fleet: Fleet, stream: bool) -> None:
    headers = {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}
    status, raw = await post(fleet, chat(f"{MARKER} hello", max_tokens=5, stream=stream), headers)
    assert status == 200
    spans = fleet.spans()
    assert sorted(s.name for s in spans) == sorted(
        ["POST /v1/chat/completions", "admission wait", "placement", "prefill", "decode"]
    )
    assert {f"{s.context.trace_id:032x}" for s in spans} == {TRACE_ID}
    request = named(spans, "POST /v1/chat/completions")
    assert request.kind is SpanKind.SERVER
    assert request.parent is not None and request.parent.is_remote
    assert f"{request.parent.span_id:016x}" == CLIENT_SPAN
    assert request.context.trace_state.to_header() == TRACESTATE
    placement, prefill, decode = (named(spans, n) for n in ("placement", "prefill", "decode"))
    assert parent_of(named(spans, "admission wait")) == request.context.span_id
    assert parent_of(placement) == request.context.span_id
    assert parent_of(prefill) == parent_of(decode) == placement.context.span_id
    assert (prefill.kind, decode.kind) == (SpanKind.CLIENT, SpanKind.CLIENT)

    assert dict(request.attributes or {}) == {
        "narwhal.request_id": request.attributes["narwhal.request_id"],  # type: ignore[index]
        "narwhal.route": "chat",
        "narwhal.stream": stream,
        "narwhal.outcome": "completed",
        "narwhal.engines": ("p0", "d0"),
        "http.response.status_code": 200,
        "narwhal.prompt_tokens": request.attributes["narwhal.prompt_tokens"],  # type: ignore[index]
        "narwhal.completion_tokens": 5,
        "narwhal.tenant": "default",
        "narwhal.class": "standard",
    }
    assert placement.attributes == {"narwhal.attempt": 1, "narwhal.engines": ("p0", "d0")}
    assert prefill.attributes == {"narwhal.engine": "p0"}
    assert decode.attributes == {"narwhal.engine": "d0", "narwhal.completion_tokens": 5}
    assert all(s.status.status_code is StatusCode.UNSET for s in spans)
    # The decode span outlasts the stream it reads; the request's outlasts them all.
    assert decode.end_time is not None and request.end_time is not None
    assert decode.end_time <= request.end_time

    # Each half went out under its own span, the client's tracestate carried on.
    (to_prefill,) = fleet.received("prefill")
    (to_decode,) = fleet.received("decode")
    assert to_prefill["traceparent"] == [traceparent(prefill)]
    assert to_decode["traceparent"] == [traceparent(decode)]
    assert to_prefill["tracestate"] == to_decode["tracestate"] == [TRACESTATE]

    # Names and numbers only: neither the prompt nor the output is in any span.
    recorded = json.dumps([s.to_json() for s in spans])
    assert MARKER not in recorded
    output = _output_text(raw, stream)
    assert len(output) > 10 and output not in recorded


def _output_text(raw: bytes, stream: bool) -> str:
    if not stream:
        return str(json.loads(raw)["choices"][0]["message"]["content"])
    return "".join(
        choice["delta"].get("content") or ""
        for line in raw.decode().splitlines()
        if line.startswith("data: {")
        for choice in json.loads(line[6:])["choices"]
    )


async def test_without_a_client_traceparent_the_request_span_is_a_root(fleet: Fleet) -> None:
    status, _ = await post(fleet, chat("hello", max_tokens=3), {})
    assert status == 200
    request = named(fleet.spans(), "POST /v1/chat/completions")
    assert request.parent is None
    (to_decode,) = fleet.received("decode")
    assert to_decode["traceparent"] == [traceparent(named(fleet.spans(), "decode"))]
    assert to_decode["tracestate"] == []


async def test_a_failed_attempt_is_an_error_on_its_spans(fleet: Fleet) -> None:
    status, _ = await post(fleet, chat("#sim:http_500 hello", max_tokens=3), {})
    assert status == 502
    spans = fleet.spans()
    request = named(spans, "POST /v1/chat/completions")
    assert request.status.status_code is StatusCode.ERROR
    assert request.attributes is not None
    assert request.attributes["narwhal.outcome"] == "upstream_error"
    assert request.attributes["http.response.status_code"] == 502
    placement, prefill = named(spans, "placement"), named(spans, "prefill")
    assert placement.status.status_code is StatusCode.ERROR
    assert prefill.status.status_code is StatusCode.ERROR
    assert "answered 500" in (prefill.status.description or "")
    assert [s.name for s in spans if s.name == "decode"] == []  # never reached
