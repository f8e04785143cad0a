"""The router's spans as the rest of the router sees them: a seam, pass-through by default.

One completion request's spans, when `tracing.otlp_endpoint` turns them on (`otel.py`
records them with the OpenTelemetry SDK):

    POST /v1/chat/completions   the request, a child of the client's traceparent if any:
    │                           route, stream, status, outcome, engines, token counts
    ├── admission wait          until it is placed (again for each retry)
    └── placement               one per attempt, from placed to the attempt's end: engines
        ├── prefill             the P/D prefill half, an engine request
        └── decode              the decode request, opened to the stream's end

Each engine request carries the W3C trace context of the span it is made under
(`propagated`), so the engine's own spans (vLLM's) are its children. Without OpenTelemetry
every span is a `Passthrough`: it records nothing, and an engine gets the client's own
traceparent and tracestate unchanged. Attributes are names and numbers only: a prompt,
an output or a token ID never goes into a span.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Protocol

from narwhal.config import ConfigError, TracingConfig
from narwhal.protocol.trace_context import TraceContext

Attribute = str | bool | int | float | Sequence[str]
Attributes = Mapping[str, Attribute]
INSTALL_HINT = "pip install '.[otel]'"
# The spans under a request's (see above): the last two are requests to an engine.
ADMISSION_WAIT = "admission wait"
PLACEMENT = "placement"
PREFILL = "prefill"
DECODE = "decode"
ENGINE_REQUESTS = (PREFILL, DECODE)


class Span(Protocol):
    # False for a span that records nothing: attributes need not even be gathered.
    @property
    def recording(self) -> bool: ...

    def child(self, name: str, attributes: Attributes | None = None) -> Span:
        """A span under this one, started now."""
        ...

    def set(self, attributes: Attributes) -> None: ...

    def fail(self, description: str) -> None:
        """Mark the span's work as failed (an error status), with what failed."""
        ...

    def end(self) -> None: ...

    def propagated(self) -> TraceContext | None:
        """The trace context an engine request made under this span carries."""
        ...

    def __enter__(self) -> Span: ...

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """End the span; an exception leaving the block marks it failed first."""
        ...


class Tracer(Protocol):
    def request(
        self, name: str, parent: TraceContext | None, attributes: Attributes | None = None
    ) -> Span:
        """The span of one client request: a child of `parent` (the client's), or a root."""
        ...

    def close(self) -> None:
        """Export what is left (this may block: call it off the event loop)."""
        ...


class Passthrough:
    """No span at all: children are itself, and engines get the client's trace context."""

    __slots__ = ("_parent",)
    recording = False

    def __init__(self, parent: TraceContext | None) -> None:
        self._parent = parent

    def child(self, name: str, attributes: Attributes | None = None) -> Span:
        return self

    def set(self, attributes: Attributes) -> None:
        pass

    def fail(self, description: str) -> None:
        pass

    def end(self) -> None:
        pass

    def propagated(self) -> TraceContext | None:
        return self._parent

    def __enter__(self) -> Span:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pass


def failure_of(error: BaseException) -> str:
    """What a span says of the exception that ended its work: a NarwhalError's message
    (the operator's, engine names and all), else the exception's type."""
    message = getattr(error, "message", None)
    return message if isinstance(message, str) else type(error).__name__


NO_SPAN = Passthrough(None)


class PassthroughTracer:
    """The tracer without OpenTelemetry: nothing recorded, the client's context passed on."""

    def request(
        self, name: str, parent: TraceContext | None, attributes: Attributes | None = None
    ) -> Span:
        return NO_SPAN if parent is None else Passthrough(parent)

    def close(self) -> None:
        pass


def build_tracer(config: TracingConfig) -> Tracer:
    """The OpenTelemetry tracer when `otlp_endpoint` is set, else the pass-through one.
    ConfigError when the endpoint is set but the SDK (the otel extra) is not installed."""
    url = config.traces_url
    if url is None:
        return PassthroughTracer()
    check_tracing(config)
    from narwhal.observability.otel import OtelTracer

    return OtelTracer.exporting_to(url, service_name=config.service_name)


def check_tracing(config: TracingConfig) -> None:
    """ConfigError when spans are asked for and the OpenTelemetry SDK cannot be loaded."""
    if config.traces_url is None:
        return
    try:
        import narwhal.observability.otel  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            "tracing.otlp_endpoint (--otlp-endpoint) needs the OpenTelemetry SDK, which is not "
            f"installed ({e.name or e}): {INSTALL_HINT}"
        ) from None
