"""One HTTP client per engine: request shaping, status mapping, the upstream connection.

Every engine request is a POST that asks for a stream (DESIGN.md section 4), sent on the
router's lean keep-alive pool (`upstream.py`); the answer is either an open
`UpstreamResponse` with status 200 or an exception from the tree in `narwhal.errors`,
marked retryable when another placement could succeed. (`post_json` asks without a
stream: a P/D prefill half, and what vLLM answers only unstreamed, `unstreamed.py`.)
An engine's refusal of the body keeps the field it named (vLLM's `param`):

    InvalidRequest (400)      the engine refused the body itself (400, 413, 422): the
                              client's request is bad wherever it runs; not retried
    EngineUnavailable (502)   connection refused or reset, 5xx, 404 (model not served),
                              429, 401/403 (the engine's key is missing or wrong), and any
                              status whose error body is malformed: another engine may
                              serve it; retried before headers

An error body is engine input like any other (`_error_detail`): over 64 KiB, JSON nested
deeper than the client bodies' limit (`jsonbody.MAX_NESTING`, checked before decoding:
msgspec recurses once per level, and a few thousand levels were a RecursionError, so a
500 "Internal router error."), or JSON that does not decode, it says nothing the router can
relay, and the answer is an engine fault whatever its status: even a 400 is then no proof
that the client's request is bad. A body that is not JSON at all (a proxy's text or HTML
page) is relayed as text.

Every request carries the engine's own key (`engines[].api_key`) as `Authorization:
Bearer`. The client's Authorization header goes instead only where forwarding is on
(`fleet.forward_client_authorization`, per engine): a router key is no engine's business.
Each also carries the W3C trace context it is made under (`tracing.py`): the client's
checked traceparent and tracestate, or the router's own span.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from narwhal.config import Config, EngineConfig
from narwhal.engines.upstream import UpstreamPool, UpstreamResponse
from narwhal.errors import InvalidRequest, UpstreamError
from narwhal.protocol.events import EngineOutputError, engine_error
from narwhal.protocol.jsonbody import MAX_NESTING, nested_deeper_than, nested_past
from narwhal.protocol.requests import Route
from narwhal.protocol.trace_context import TRACEPARENT, TRACESTATE, TraceContext

PATHS: dict[Route, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
# An error body is a message, a type, a field name: vLLM's longest (a validation error
# that echoes the request's values) are a few KiB.
_MAX_ERROR_BODY = 64 * 1024
# A prefill answer is one token plus transfer parameters; anything near this is wrong.
_MAX_ANSWER_BODY = 16 * 1024 * 1024
_encoder = msgspec.json.Encoder()
_REFUSED_CREDENTIALS = (401, 403)
_MAX_PARAM_CHARS = 256  # a field path; anything longer is not one
log = logging.getLogger(__name__)


class EngineUnavailable(UpstreamError):
    """This engine could not serve the attempt; another placement may (retryable)."""


class _MalformedErrorBody(Exception):
    """An engine's error body that says nothing the router can relay (why, as a phrase
    that follows "an error body")."""


class EngineClient:
    def __init__(
        self,
        engine: EngineConfig,
        pool: UpstreamPool,
        *,
        forward_client_authorization: bool = False,
    ) -> None:
        self.engine = engine
        self.name = engine.name
        self._base = engine.url.rstrip("/")
        self._pool = pool
        self._forward = forward_client_authorization
        self._refusals = 0  # credential refusals in a row: the first is logged

    @classmethod
    def configured(cls, engine: EngineConfig, pool: UpstreamPool, config: Config) -> EngineClient:
        """The engine's client as `config` has it (whether the client's Authorization goes
        to it: its own key, else `fleet.forward_client_authorization`)."""
        forwards = config.forwards_client_authorization(engine)
        return cls(engine, pool, forward_client_authorization=forwards)

    def serves(self, engine: EngineConfig, config: Config) -> bool:
        """Whether this client is what `config` wants for `engine` (else: a new one)."""
        return self.engine == engine and self._forward == config.forwards_client_authorization(
            engine
        )

    async def post_json(
        self,
        route: Route,
        body: dict[str, Any],
        *,
        request_id: str,
        client_authorization: str | None = None,
        trace: TraceContext | None = None,
        max_bytes: int = _MAX_ANSWER_BODY,
    ) -> dict[str, Any]:
        """POST a non-streaming request; its JSON object answer, or a mapped error.
        `client_authorization`: the client's Authorization header (sent only when this
        engine forwards it); `trace`: the W3C trace context the request carries;
        `max_bytes`: the longest answer read (a longer one is an engine failure)."""
        authorization, hint = self._credentials(client_authorization)
        response = await self._post(route, body, request_id, authorization, trace)
        try:
            if response.status != 200:
                raise await self._status_error(response, hint)
            self._refusals = 0
            try:
                raw = await response.read(max_bytes + 1)
            except OSError as e:
                raise EngineUnavailable(f"engine {self.name} answer broke: {e}") from e
            if len(raw) > max_bytes:
                raise EngineUnavailable(f"engine {self.name} answered over {max_bytes} bytes")
            try:
                answer = msgspec.json.decode(raw)
            except msgspec.DecodeError as e:
                raise EngineUnavailable(f"engine {self.name} answered invalid JSON: {e}") from e
            except RecursionError:
                raise self._too_deep() from None
            if not isinstance(answer, dict):
                raise EngineUnavailable(f"engine {self.name} answered a non-object")
            # (Deeper than the limit needs more brackets than it: most answers are not walked.)
            if raw.count(b"[") + raw.count(b"{") > MAX_NESTING and nested_past(answer):
                raise self._too_deep()
            return answer
        finally:
            response.release()

    def _too_deep(self) -> EngineUnavailable:
        return EngineUnavailable(
            f"engine {self.name} answered JSON nested more than {MAX_NESTING} levels deep"
        )

    async def open_stream(
        self,
        route: Route,
        body: dict[str, Any],
        *,
        request_id: str,
        client_authorization: str | None = None,
        trace: TraceContext | None = None,
    ) -> UpstreamResponse:
        """POST the body; the response once its status is 200, else a mapped error."""
        authorization, hint = self._credentials(client_authorization)
        response = await self._post(route, body, request_id, authorization, trace)
        if response.status == 200:
            self._refusals = 0
            if response.headers.get("content-type", "").startswith("application/json"):
                # A server that ignores `stream: true` answers one JSON body: there are no
                # events to relay or validate, and the client should hear why.
                response.release()
                raise EngineOutputError(
                    f"engine {self.name} answered one JSON body, not an event stream "
                    "(it does not stream, and Narwhal always asks engines for a stream)"
                )
            return response
        try:
            raise await self._status_error(response, hint)
        finally:
            response.release()

    def _credentials(self, client_authorization: str | None) -> tuple[str | None, str]:
        """The Authorization header for a request, and what to tell the operator if the
        engine refuses it."""
        if self._forward and client_authorization:
            return client_authorization, (
                "it refused the client's own Authorization, forwarded as "
                "forward_client_authorization asks"
            )
        if self.engine.authorization is not None:
            return self.engine.authorization, (
                "engines[].api_key is not the key it was started with (vLLM/SGLang --api-key)"
            )
        return None, "it wants an API key (vLLM/SGLang --api-key) and engines[].api_key is not set"

    async def _post(
        self,
        route: Route,
        body: dict[str, Any],
        request_id: str,
        authorization: str | None,
        trace: TraceContext | None,
    ) -> UpstreamResponse:
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        if authorization:
            headers["Authorization"] = authorization
        if trace is not None:
            headers[TRACEPARENT] = trace.traceparent
            if trace.tracestate is not None:
                headers[TRACESTATE] = trace.tracestate
        try:
            return await self._pool.request(
                self._base, "POST", PATHS[route], headers, _encoder.encode(body)
            )
        except ValueError as e:  # a header value that cannot go on the wire
            raise InvalidRequest(f"The request cannot be forwarded: {e}") from e
        except OSError as e:  # UpstreamConnectionError: refused, reset, timed out, malformed
            raise EngineUnavailable(f"engine {self.name} unreachable: {_describe(e)}") from e

    async def _status_error(self, response: UpstreamResponse, hint: str) -> Exception:
        status = response.status
        try:
            raw = await response.read(_MAX_ERROR_BODY + 1)
        except OSError:
            raw = b""
        try:
            message, param = _error_detail(raw)
        except _MalformedErrorBody as e:
            fault = f"an error body {e}"
            if status in _REFUSED_CREDENTIALS:
                return self._refused_credentials(status, fault, hint)
            return EngineUnavailable(f"engine {self.name} answered {status} with {fault}")
        message = message or response.reason or "no detail"
        if status in (400, 413, 422):
            # The engine's `param` names the client's field (vLLM: `prompt_logprobs`,
            # `max_tokens`): the client hears it in Narwhal's envelope, as from the engine.
            return InvalidRequest(f"The engine refused the request: {message}", param=param)
        if status in _REFUSED_CREDENTIALS:
            return self._refused_credentials(status, message, hint)
        return EngineUnavailable(f"engine {self.name} answered {status}: {message}")

    def _refused_credentials(self, status: int, message: str, hint: str) -> EngineUnavailable:
        """The engine wants a key the router did not send: an engine fault for the client
        (a client's key is not the engine's), a configuration fault for the operator, said
        once until the engine takes a request again."""
        self._refusals += 1
        if self._refusals == 1:
            log.error(
                "engine %s refused the router's request with %d (%s): %s",
                self.name,
                status,
                message,
                hint,
            )
        return EngineUnavailable(
            f"engine {self.name} answered {status}: the router's key for it is missing or wrong"
        )


def _error_detail(raw: bytes) -> tuple[str | None, str | None]:
    """An engine error body's message and the field it names (`param`), where it gives
    them; `_MalformedErrorBody` for one over `_MAX_ERROR_BODY`, or JSON (an object or an
    array) too deep or invalid. Size and depth are checked before anything is decoded."""
    if len(raw) > _MAX_ERROR_BODY:
        raise _MalformedErrorBody(f"over {_MAX_ERROR_BODY // 1024} KiB")
    if raw.lstrip()[:1] not in (b"{", b"["):
        text = raw.decode("utf-8", "replace").strip()  # not JSON: a text or HTML page
        return text[:500] or None, None
    if nested_deeper_than(raw):
        raise _MalformedErrorBody(f"nested more than {MAX_NESTING} levels deep")
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise _MalformedErrorBody(f"that is not valid JSON ({e})") from None
    if isinstance(body, dict):
        error = engine_error(body)
        if error is not None:
            return error.message, _param_of(body)
        detail = body.get("detail")  # FastAPI servers (transformers serve)
        if detail is not None:
            return str(detail)[:500], None
    return None, None


def _param_of(body: dict[str, Any]) -> str | None:
    """`error.param` (vLLM, OpenAI) or the flat shape's `param`, when a short string."""
    nested = body.get("error")
    holder = nested if isinstance(nested, dict) else body
    param = holder.get("param")
    if isinstance(param, str) and 0 < len(param) <= _MAX_PARAM_CHARS:
        return param
    return None


def _describe(error: BaseException) -> str:
    return str(error) or type(error).__name__
