"""Without `tracing.otlp_endpoint` the router never loads OpenTelemetry, and its spans
pass the client's trace context on untouched."""

from __future__ import annotations

import subprocess
import sys

from narwhal.config import TracingConfig
from narwhal.observability.tracing import NO_SPAN, PassthroughTracer, build_tracer
from narwhal.protocol.trace_context import TraceContext

CLIENT = TraceContext("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "a=1")


def test_the_router_does_not_import_opentelemetry_unless_asked() -> None:
    script = (
        "import sys\n"
        "from narwhal.config import Config, EngineConfig\n"
        "from narwhal.router import Router\n"
        "import narwhal.serve, narwhal.serving\n"
        "Router(Config(model='m', engines=(EngineConfig(name='e', url='http://127.0.0.1:9'),)))\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


def test_without_an_endpoint_spans_pass_the_clients_context_on() -> None:
    tracer = build_tracer(TracingConfig())
    assert isinstance(tracer, PassthroughTracer)
    span = tracer.request("POST /v1/chat/completions", CLIENT)
    with span.child("placement") as placement:
        assert placement.child("decode").propagated() == CLIENT
        assert not placement.recording
    assert tracer.request("POST /v1/completions", None) is NO_SPAN
    assert NO_SPAN.propagated() is None
