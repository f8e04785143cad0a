"""The router's own spans, recorded with the OpenTelemetry SDK (`pip install '.[otel]'`).

Imported only when `tracing.otlp_endpoint` is set (`tracing.build_tracer`), so the router
never loads OpenTelemetry otherwise. The tracer provider is the router's own, not the
process-wide global one: nothing else in the process reports under Narwhal's name.

Spans are exported in batches from the SDK's own thread (OTLP over HTTP, protobuf); on
the event loop a span costs its start and its end, which only queues it. Sampling is the
SDK's default, parent-based: a client that marks its trace not sampled gets no spans
recorded here, and the engines still get a traceparent under the router's span id.
"""

from __future__ import annotations

from types import TracebackType

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace import Span as SdkSpan
from opentelemetry.trace.span import TraceFlags, TraceState

import narwhal
from narwhal.observability.tracing import ENGINE_REQUESTS, Attributes, Span, failure_of
from narwhal.protocol.trace_context import TraceContext, traceparent_of

# Export calls give up after this: a collector that is down must not hold shutdown long.
_EXPORT_TIMEOUT_S = 5.0


class OtelTracer:
    def __init__(
        self, exporter: SpanExporter, *, service_name: str = "narwhal", batch: bool = True
    ) -> None:
        """`batch=False` exports each span as it ends, in the caller's thread (for tests
        with an in-memory exporter; never on the event loop with a network exporter)."""
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": service_name}), shutdown_on_exit=False
        )
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("narwhal", narwhal.__version__)

    @classmethod
    def exporting_to(cls, url: str, *, service_name: str) -> OtelTracer:
        """Spans exported by OTLP/HTTP to the collector's traces `url` (its
        OTEL_EXPORTER_OTLP_* variables, such as headers, apply as usual)."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=url, timeout=_EXPORT_TIMEOUT_S)
        return cls(exporter, service_name=service_name)

    def request(
        self, name: str, parent: TraceContext | None, attributes: Attributes | None = None
    ) -> Span:
        context = None if parent is None else trace.set_span_in_context(_remote(parent))
        span = self._tracer.start_span(
            name, context=context, kind=SpanKind.SERVER, attributes=attributes
        )
        return OtelSpan(self._tracer, span)

    def close(self) -> None:
        self._provider.shutdown()


class OtelSpan:
    __slots__ = ("_span", "_tracer")

    def __init__(self, tracer: trace.Tracer, span: SdkSpan) -> None:
        self._tracer = tracer
        self._span = span

    @property
    def recording(self) -> bool:
        return self._span.is_recording()

    def child(self, name: str, attributes: Attributes | None = None) -> Span:
        # Engine requests are made under prefill and decode: client spans, as OpenTelemetry
        # calls an outgoing request; the router's own phases are internal.
        kind = SpanKind.CLIENT if name in ENGINE_REQUESTS else SpanKind.INTERNAL
        context = trace.set_span_in_context(self._span)
        span = self._tracer.start_span(name, context=context, kind=kind, attributes=attributes)
        return OtelSpan(self._tracer, span)

    def set(self, attributes: Attributes) -> None:
        self._span.set_attributes(attributes)

    def fail(self, description: str) -> None:
        self._span.set_status(Status(StatusCode.ERROR, description))

    def end(self) -> None:
        self._span.end()

    def __enter__(self) -> Span:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if error is not None:
            self.fail(failure_of(error))
        self._span.end()

    def propagated(self) -> TraceContext | None:
        """This span as the engine's parent, with the client's tracestate carried on."""
        own = self._span.get_span_context()
        state = own.trace_state.to_header() or None
        return TraceContext(traceparent_of(own.trace_id, own.span_id, own.trace_flags), state)


def _remote(parent: TraceContext) -> NonRecordingSpan:
    state = TraceState.from_header([parent.tracestate]) if parent.tracestate else None
    return NonRecordingSpan(
        SpanContext(
            trace_id=int(parent.trace_id, 16),
            span_id=int(parent.parent_id, 16),
            is_remote=True,
            trace_flags=TraceFlags(parent.flags),
            trace_state=state,
        )
    )
