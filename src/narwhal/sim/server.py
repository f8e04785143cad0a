"""The sim's HTTP server: routes per dialect, and the in-process API (`start_sim`).

vllm    /v1/chat/completions /v1/completions /v1/models /health /metrics /tokenize
        /detokenize /version
sglang  the same, plus /get_model_info /get_server_info /health_generate
openai  /v1/chat/completions /v1/completions /v1/models /health ({"status":"ok"});
        /metrics and /tokenize answer 404 like `transformers serve`
all     POST /sim/kv/pull (the prefill side of the PD handshake, see kv.py) and
        GET /sim/state (the scheduler's live numbers, for tests and curious operators:
        load, KV blocks used / held / cached-but-free, prefix-cache counters, and the
        prompt tokens actually prefilled, which cache hits do not add to)
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Any, Final

import msgspec
from aiohttp import web

from narwhal.protocol.tokenizer import SimTokenizer
from narwhal.sim.auth import auth_middlewares
from narwhal.sim.completions import CompletionRoutes, error_response
from narwhal.sim.events import SimError
from narwhal.sim.kv import PULL_PATH
from narwhal.sim.options import SimOptions
from narwhal.sim.runtime import VERSIONS, SimRuntime
from narwhal.sim.script import TOKENIZER

_encode: Final = msgspec.json.encode
_SHUTDOWN_TIMEOUT_S: Final = 1.0
_MAX_BODY: Final = 64 * 1024 * 1024


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=_encode(payload), content_type="application/json")


class _AuxRoutes:
    """Everything but the completion routes."""

    def __init__(self, runtime: SimRuntime) -> None:
        self.runtime = runtime
        self.tokenizer: SimTokenizer = TOKENIZER

    async def health(self, request: web.Request) -> web.Response:
        if self.runtime.options.dialect == "openai":
            return _json({"status": "ok"})
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        options, created = self.runtime.options, self.runtime.started
        owner = {"vllm": "vllm", "sglang": "sglang"}.get(options.dialect, "narwhal-sim")
        card: dict[str, Any] = {"id": options.model, "object": "model", "created": created,
                                "owned_by": owner}  # fmt: skip
        if options.dialect != "openai":
            card |= {"root": options.model, "parent": None, "max_model_len": options.context_len}
        if options.dialect == "vllm":
            card["permission"] = [
                {"id": f"modelperm-{self.runtime.engine_id[:8]}", "object": "model_permission",
                 "created": created, "allow_create_engine": False, "allow_sampling": True,
                 "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                 "allow_fine_tuning": False, "organization": "*", "group": None,
                 "is_blocking": False}
            ]  # fmt: skip
        return _json({"object": "list", "data": [card]})

    async def metrics(self, request: web.Request) -> web.Response:
        if self.runtime.options.broken_metrics:
            return web.Response(status=500, text="metrics are broken (--broken-metrics)")
        return web.Response(
            body=self.runtime.metrics.render(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def version(self, request: web.Request) -> web.Response:
        options = self.runtime.options
        return _json({"version": options.vllm_version or VERSIONS[options.dialect]})

    async def tokenize(self, request: web.Request) -> web.Response:
        raw = await request.read()
        delay = self.runtime.options.tokenize_delay_s
        if delay:
            await asyncio.sleep(delay)
        try:
            body = msgspec.json.decode(raw)
            if not isinstance(body, dict):
                raise SimError(400, "request body must be a JSON object")
            if isinstance(body.get("messages"), list):
                ids = self.tokenizer.chat_prompt_ids(body["messages"])
            elif isinstance(body.get("prompt"), str):
                ids = self.tokenizer.encode(body["prompt"])
                if body.get("add_special_tokens", True):
                    ids.insert(0, self.tokenizer.bos_id)
            else:
                raise SimError(400, "give either prompt (a string) or messages", param="prompt")
        except msgspec.DecodeError as exc:
            return error_response(self.runtime, SimError(400, f"invalid JSON: {exc}"))
        except SimError as error:
            return error_response(self.runtime, error)
        scale = self.runtime.options.tokenize_scale
        if scale != 1.0 and ids:  # the prompt's IDs over and over, or cut short
            ids = (ids * math.ceil(scale))[: max(1, round(len(ids) * scale))]
        strs = (
            [self.tokenizer.token_text(i) for i in ids] if body.get("return_token_strs") else None
        )
        return _json({"count": len(ids), "max_model_len": self.runtime.options.context_len,
                      "tokens": ids, "token_strs": strs})  # fmt: skip

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            body = msgspec.json.decode(await request.read(), type=dict[str, list[int]])
            return _json({"prompt": self.tokenizer.decode(body.get("tokens", []))})
        except (msgspec.DecodeError, ValueError) as exc:
            return error_response(self.runtime, SimError(400, str(exc), param="tokens"))

    async def server_info(self, request: web.Request) -> web.Response:
        options = self.runtime.options
        return _json({"model_path": options.model, "tokenizer_path": options.model,
                      "is_generation": True,
                      "max_total_num_tokens": options.num_gpu_blocks * options.block_size,
                      "max_running_requests": options.max_num_seqs,
                      "context_length": options.context_len,
                      "version": VERSIONS["sglang"]})  # fmt: skip

    async def kv_pull(self, request: web.Request) -> web.Response:
        try:
            body = msgspec.json.decode(await request.read(), type=dict[str, str])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return _json({"error": f"bad pull request: {exc}"}, 400)
        found = self.runtime.kv_store.pull(
            body.get("remote_engine_id", ""), body.get("remote_request_id", "")
        )
        if found is None:
            return _json({"error": "KV blocks unknown or expired"}, 404)
        num_tokens, digest = found
        return _json({"num_tokens": num_tokens, "prompt_digest": digest})

    async def state(self, request: web.Request) -> web.Response:
        scheduler = self.runtime.engine.scheduler
        pool, size = scheduler.pool, scheduler.block_size
        counters = scheduler.counters
        return _json({"running": scheduler.num_running, "waiting": scheduler.num_waiting,
                      "prefill_discipline": self.runtime.options.prefill_discipline,
                      # KV in blocks; the *_tokens figures are the same in block-size units
                      "block_size": size, "num_gpu_blocks": pool.num_blocks,
                      "kv_used_blocks": scheduler.used_blocks,
                      "kv_held_blocks": scheduler.held_blocks,
                      "kv_cached_free_blocks": pool.num_cached_free(),
                      "kv_used_tokens": scheduler.used_blocks * size,
                      "kv_held_tokens": scheduler.held_blocks * size,
                      "kv_usage": scheduler.kv_usage, "held_requests": len(self.runtime.kv_store),
                      "preemptions": scheduler.preemptions,
                      "prefix_cache_queries": counters.queries,
                      "prefix_cache_hits": counters.hits,
                      "prefill_tokens_computed": scheduler.prefill_tokens})  # fmt: skip


def build_app(runtime: SimRuntime) -> web.Application:
    app = web.Application(client_max_size=_MAX_BODY, middlewares=auth_middlewares(runtime.options))
    completions = CompletionRoutes(runtime)
    aux = _AuxRoutes(runtime)
    dialect = runtime.options.dialect
    router = app.router
    router.add_post("/v1/chat/completions", completions.chat)
    router.add_post("/v1/completions", completions.completions)
    router.add_get("/v1/models", aux.models)
    router.add_get("/health", aux.health)
    router.add_post(PULL_PATH, aux.kv_pull)
    router.add_get("/sim/state", aux.state)
    if dialect != "openai":
        router.add_get("/metrics", aux.metrics)
        router.add_post("/tokenize", aux.tokenize)
        router.add_post("/detokenize", aux.detokenize)
        router.add_get("/version", aux.version)
    if dialect == "sglang":
        router.add_get("/get_model_info", aux.server_info)
        router.add_get("/get_server_info", aux.server_info)
        router.add_get("/health_generate", aux.health)
    return app


class RunningSim:
    """A sim serving on a socket; `close()` stops the server and the engine."""

    def __init__(self, url: str, runner: web.AppRunner, runtime: SimRuntime) -> None:
        self.url = url
        self._runner = runner
        self._runtime = runtime

    @property
    def runtime(self) -> SimRuntime:
        return self._runtime

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._runner.cleanup()
        await self._runtime.close()


async def start_sim(options: SimOptions, host: str = "127.0.0.1", port: int = 0) -> RunningSim:
    """Start one simulated engine in the running event loop; port 0 picks a free port."""
    runtime = SimRuntime.create(options)
    runner = web.AppRunner(
        build_app(runtime), access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S
    )
    try:
        await runner.setup()
        site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True)
        await site.start()
    except BaseException:
        await runner.cleanup()
        await runtime.close()
        raise
    bound_port = int(runner.addresses[0][1])
    runtime.port = bound_port
    if host not in ("0.0.0.0", "::", ""):
        runtime.advertised_host = host
    runtime.engine.start()
    url_host = f"[{host}]" if ":" in host else host
    return RunningSim(f"http://{url_host}:{bound_port}", runner, runtime)
