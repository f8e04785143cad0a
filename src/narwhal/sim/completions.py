"""POST /v1/chat/completions and /v1/completions: from a body to a stream or a response.

Order of work, so that every failure the engine would report before generating is a
proper HTTP status: decode and check the body, resolve scenarios, check the context,
settle the disaggregated-serving role (pulling remote KV here, before any header),
build the script, then hand a sequence to the engine. A streaming response's headers
go out at once (as vLLM's do); a failure after them is an error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from narwhal.sim.emit import Emitter
from narwhal.sim.events import SimError, merge_parts
from narwhal.sim.kv import pull_blocks
from narwhal.sim.model import Sequence
from narwhal.sim.request import (
    ChatBody,
    CompletionBody,
    ParsedRequest,
    check_context,
    decode_body,
    interpret,
)
from narwhal.sim.runtime import SimRuntime
from narwhal.sim.scenarios import ScenarioError, Scenarios, parse_directives
from narwhal.sim.script import TOKENIZER, GenerationRequest, Script, build_script
from narwhal.sim.shapes_vllm import ShapeContext, VllmShape

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


@dataclass(slots=True)
class _Plan:
    """One admitted request: everything the response needs."""

    parsed: ParsedRequest
    scenarios: Scenarios
    script: Script
    shape: VllmShape
    seq: Sequence
    stream: bool
    prefill_only: bool
    remote_request_id: str


def error_response(runtime: SimRuntime, error: SimError) -> web.Response:
    body = runtime.shape_class.error_body(error)
    return web.Response(status=error.status, body=body, content_type="application/json")


class CompletionRoutes:
    def __init__(self, runtime: SimRuntime) -> None:
        self.runtime = runtime

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            plan = await self._plan(request, chat)
        except SimError as error:
            return error_response(self.runtime, error)
        self.runtime.engine.submit(plan.seq)
        try:
            if plan.stream:
                return await self._stream(request, plan)
            return await self._whole(request, plan)
        except ConnectionResetError:
            # The client went away mid-stream (a router cancelling, a test disconnecting):
            # an ordinary event for an engine, not an error to log.
            raise web.HTTPBadRequest() from None
        finally:
            seq = plan.seq
            if not seq.finished:
                self.runtime.engine.abort(seq)
            elif plan.prefill_only and not seq.aborted and not plan.shape.ctx.kv_transfer_params:
                # Finished, but the blocks never reached the store (the client went away).
                self.runtime.engine.release_held(seq)

    # -- admission -----------------------------------------------------------------------
    async def _plan(self, request: web.Request, chat: bool) -> _Plan:
        runtime = self.runtime
        options = runtime.options
        if options.arrival_log:
            _log_arrival(options.arrival_log, request.headers.get("X-Request-Id", "-"))
        if options.trace_log:
            _log_trace(options.trace_log, request)
        body = decode_body(await request.read(), chat, openai_schema=options.dialect == "openai")
        parsed = interpret(body, TOKENIZER)
        if body.model is not None and body.model != options.model:
            status = 400 if options.dialect == "openai" else 404
            raise SimError(
                status,
                f"The model `{body.model}` does not exist. Valid aliases: {options.model}.",
                "NotFoundError",
                "model",
            )
        stream = bool(body.stream)
        if (
            options.dialect == "sglang"
            and chat
            and stream
            and (body.return_token_ids or body.return_prompt_token_ids)
        ):
            raise SimError(400, "return_token_ids is only supported for non-streaming chat "
                           "completions; use return_output_ids_in_sglext when streaming",
                           "BadRequestError", "return_token_ids")  # fmt: skip
        try:
            text = parsed.directive_text
            scenarios = parse_directives(f"{options.always} {text}" if options.always else text)
        except ScenarioError as exc:
            raise SimError(
                400, str(exc), "BadRequestError", "messages" if chat else "prompt"
            ) from None
        priority = body.priority or 0
        if priority and options.scheduling_policy != "priority":
            raise SimError(400, f"Got priority {priority} but Priority scheduling is not "
                           "enabled.", "BadRequestError", "priority")  # fmt: skip
        if "http_500" in scenarios:
            raise SimError(500, "simulated engine failure (#sim:http_500)", "InternalServerError")
        prompt_len = len(parsed.prompt_ids)
        max_tokens = check_context(prompt_len, parsed.max_tokens, options.context_len)

        kv = body.kv_transfer_params or {}
        prefill_only = kv.get("do_remote_decode") is True
        from_remote = kv.get("do_remote_prefill") is True
        if prefill_only and options.role == "decode":
            raise SimError(400, "this engine runs --role decode: it does not prefill for a "
                           "remote decoder (do_remote_decode)", "BadRequestError",
                           "kv_transfer_params")  # fmt: skip
        if from_remote and options.role == "prefill":
            raise SimError(400, "this engine runs --role prefill: it does not decode from "
                           "remote KV (do_remote_prefill)", "BadRequestError",
                           "kv_transfer_params")  # fmt: skip
        now = runtime.engine.now()
        ready_at = (
            now + scenarios.number("slow_prefill", 0.0) if "slow_prefill" in scenarios else 0.0
        )
        if from_remote:
            tokens = await pull_blocks(runtime.session, kv, parsed.prompt_ids)
            transfer_s = (
                options.kv_transfer_base_ms / 1000 + tokens / options.kv_transfer_tokens_per_s
            )
            ready_at = max(ready_at, runtime.engine.now() + transfer_s * options.time_scale)
        if prefill_only:
            max_tokens = 1  # the prefill and its one sampled token, as the toy proxy asks

        request_id = request.headers.get("X-Request-Id") or body.request_id or uuid.uuid4().hex
        response_id = ("chatcmpl-" if chat else "cmpl-") + request_id
        dialect = options.dialect
        top = parsed.top_logprobs
        if top is None and "logprobs" in scenarios:
            top = 2
        if dialect == "openai":
            top = None  # transformers serve ignores logprobs
        generation = GenerationRequest(
            prompt_ids=parsed.prompt_ids,
            chat=chat,
            max_tokens=max_tokens,
            ignore_eos=bool(body.ignore_eos),
            stop=parsed.stop,
            seed=body.seed,
            top_logprobs=top,
            tool_names=parsed.tool_names,
            tool_id_style=dialect,
            request_id=request_id,
        )
        script = build_script(generation, scenarios, sim_seed=options.seed,
                              output_len_mean=options.output_len_mean)  # fmt: skip
        shape = runtime.shape_class(self._context(request, body, parsed, script, response_id, top))
        seq = Sequence(
            prompt_len,
            len(script.ids),
            finish_reason=script.finish_reason,
            prefilled=from_remote,
            ready_at=ready_at,
            keep_kv=prefill_only,
            streaming=stream,
            # The cache keys: the prompt, then the output (cached too once computed, so
            # a follow-up turn that quotes it hits, as on vLLM).
            token_ids=parsed.prompt_ids + script.ids if options.enable_prefix_caching else None,
            priority=priority,
        )
        remote_id = f"{response_id}-{uuid.uuid4().hex[:8]}" if prefill_only else ""
        return _Plan(parsed, scenarios, script, shape, seq, stream, prefill_only, remote_id)

    def _context(self, request: web.Request, body: Any, parsed: ParsedRequest, script: Script,
                 response_id: str, top: int | None) -> ShapeContext:  # fmt: skip
        dialect = self.runtime.options.dialect
        options = body.stream_options
        include_usage = bool(options and options.include_usage)
        headers = request.headers
        return ShapeContext(
            response_id=response_id,
            created=int(time.time()),
            model=body.model or self.runtime.options.model,
            chat=parsed.chat,
            prompt_ids=parsed.prompt_ids,
            return_token_ids=dialect != "openai"
            and bool(body.return_token_ids)
            and not self.runtime.options.predates_token_ids,
            include_usage=include_usage,
            continuous_usage=include_usage and bool(options and options.continuous_usage_stats),
            logprobs=top is not None,
            stop_reason=script.stop_reason,
            matched_stop=script.matched_stop,
            sglext_input=bool(body.return_input_ids_in_sglext)
            or headers.get("x-sglext-return-input-ids") == "1",
            sglext_output=bool(body.return_output_ids_in_sglext)
            or headers.get("x-sglext-return-output-ids") == "1",
            sglext_framed=headers.get("x-sglext-ids-framed") == "1",
            echo_text=parsed.directive_text
            if dialect == "vllm" and isinstance(body, CompletionBody) and body.echo
            else None,
            prompt_logprobs=body.prompt_logprobs if dialect == "vllm" else None,
            chat_echo=_chat_echo(body) if dialect == "vllm" else None,
        )

    def _hold_blocks(self, plan: _Plan) -> None:
        """Prefill-only requests: keep the KV for the decoder once the engine is done."""
        if plan.prefill_only and plan.seq.finished and not plan.seq.aborted:
            runtime = self.runtime
            params = runtime.kv_store.hold(plan.remote_request_id, plan.seq,
                                           plan.parsed.prompt_ids, runtime.advertised_host,
                                           runtime.port)  # fmt: skip
            plan.shape.ctx.kv_transfer_params = params

    def _report_cached(self, plan: _Plan) -> None:
        """usage.prompt_tokens_details, when the server reports it: known once admitted."""
        if self.runtime.options.enable_prompt_tokens_details:
            plan.shape.ctx.cached_tokens = plan.seq.cached_tokens or 0

    # -- responses ---------------------------------------------------------------------
    async def _whole(self, request: web.Request, plan: _Plan) -> web.StreamResponse:
        engine = self.runtime.engine
        seq, script = plan.seq, plan.script
        while not seq.finished:
            await engine.wait_progress(seq)
        self._hold_blocks(plan)
        self._report_cached(plan)
        if script.stall_at is not None:
            await asyncio.sleep(script.stall_s)
        if script.disconnect_at is not None:
            _drop_connection(request)
            return web.Response(status=500)
        if script.error_at is not None:
            error = SimError(500, "simulated engine failure (#sim:error_midstream)",
                             "InternalServerError")  # fmt: skip
            return error_response(self.runtime, error)
        delta = merge_parts(script.parts)
        id_fault = script.id_fault[0] if script.id_fault else None
        body = plan.shape.body(delta, script.ids, id_fault, script.logprobs, script.finish_reason)
        return web.Response(body=body, content_type="application/json")

    async def _stream(self, request: web.Request, plan: _Plan) -> web.StreamResponse:
        engine = self.runtime.engine
        seq, script, shape = plan.seq, plan.script, plan.shape
        ctx = shape.ctx
        # An event that only carries IDs is sent when IDs were asked for: vLLM sends its
        # empty deltas, and SGLang's completion chunks hold every new ID (it slices its
        # output IDs from the last sent one), so none is lost. (SGLang refuses IDs on
        # streamed chat; openai-dialect servers have none.)
        keep_empty = ctx.logprobs or ctx.return_token_ids
        interval = max(self.runtime.options.stream_interval, plan.parsed.body.stream_interval or 1)
        emitter = Emitter(script, interval, keep_empty=keep_empty)
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        write = response.write
        while True:
            if seq.finished:
                self._hold_blocks(plan)
            out: list[bytes] = []
            while (group := emitter.next_group(seq.produced)) is not None:
                start, end = group
                if script.error_at is not None and end > script.error_at:
                    error = SimError(500, "simulated engine failure (#sim:error_midstream)",
                                     "InternalServerError")  # fmt: skip
                    out.append(shape.error_event(error))
                    await write(b"".join(out))
                    await response.write_eof()
                    return response
                if script.disconnect_at is not None and end > script.disconnect_at:
                    if out:
                        await write(b"".join(out))
                    _drop_connection(request)
                    return response
                if script.stall_at is not None and end > script.stall_at:
                    if out:
                        await write(b"".join(out))
                        out = []
                    await asyncio.sleep(script.stall_s)
                    script.stall_at = None
                if start == 0:
                    out.append(shape.opening())
                event = emitter.event(start, end)
                if event is not None:
                    out.append(shape.chunk(event))
            if out:
                await write(b"".join(out))
                continue  # the engine may have moved on while we wrote
            if emitter.done:
                break
            await engine.wait_progress(seq)
        self._report_cached(plan)
        trailer = shape.trailer(script.ids)
        if trailer:
            await write(trailer)
        await response.write_eof()
        return response


def _chat_echo(body: Any) -> str | None:
    """The text vLLM's chat `echo` sends back: the last message's, when it is the
    assistant's (the role the answer continues) and a non-empty string."""
    if not isinstance(body, ChatBody) or not body.echo or not body.messages:
        return None
    last = body.messages[-1]
    content = last.get("content")
    if last.get("role") != "assistant" or not isinstance(content, str) or not content:
        return None
    return content


def _drop_connection(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        with contextlib.suppress(Exception):
            transport.abort()


def _log_arrival(path: str, request_id: str) -> None:
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"{time.monotonic():.6f} {request_id}\n")


def _log_trace(path: str, request: web.Request) -> None:
    """What a router passed on of the W3C trace context (vLLM records spans under it)."""
    headers = request.headers
    line = {
        "path": request.path,
        "request_id": headers.get("X-Request-Id"),
        "traceparent": headers.getall("traceparent", []),
        "tracestate": headers.getall("tracestate", []),
    }
    with open(path, "a", encoding="utf-8") as log:
        log.write(json.dumps(line) + "\n")
