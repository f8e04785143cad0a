"""A small vLLM-shaped engine on 127.0.0.1 (ephemeral port) for the bench's own tests, and
`sim_url`: a real `narwhal sim --time-scale 0` subprocess on an ephemeral port.

It runs in a thread with its own event loop, so tests can call the bench's
synchronous `run()` (which owns its loop) or start it as a subprocess.

Per request it streams a role chunk, one chunk per token (with `token_ids` when
asked; `test_ids_per_chunk` ids per chunk), a finishing chunk and, when asked, a
usage-only chunk, then `[DONE]`. A directive in the prompt picks a fault:
`#fault:429`, `#fault:truncate` (connection dropped mid-stream),
`#fault:error` (an error event after two tokens), `#fault:nodone` (no
`[DONE]`), `#fault:slow` (a 2 s pause before the first token).

Body keys steer it too (a `--dataset` line sends its other keys as they are):
`test_first_delay` (seconds before the first token), and `test_error`, an object
that makes the answer an OpenAI error envelope instead: `status` (default 429),
`code`, `retry_after` (the Retry-After header) and `pad` (that many bytes of
padding ahead of the `error` object, for a body too large to read whole).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

MODEL = "test-model"


def _prompt_text(body: dict[str, Any]) -> str:
    if "prompt" in body:
        return str(body["prompt"])
    return " ".join(str(m.get("content", "")) for m in body.get("messages", []))


def _chunk(obj: str, rid: str, choice: dict[str, Any] | None, **top: Any) -> bytes:
    payload: dict[str, Any] = {"id": rid, "object": obj, "created": 1, "model": MODEL}
    payload["choices"] = [] if choice is None else [choice]
    payload.update(top)
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    body = await request.json()
    prompt = _prompt_text(body)
    n = int(body.get("max_tokens", 16))
    ids_on = bool(body.get("return_token_ids"))
    per_chunk = int(body.get("test_ids_per_chunk", 1))
    delay = float(body.get("test_token_delay", 0.0))
    usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
    if "#fault:429" in prompt:
        error = {"message": "busy", "type": "rate_limit", "param": None, "code": 429}
        return web.json_response({"error": error}, status=429)
    if "test_error" in body:
        return _error_answer(body["test_error"])
    if not body.get("stream"):
        text = "".join(f" w{i}" for i in range(n))
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if ids_on:
            choice["token_ids"] = list(range(100, 100 + n))
        return web.json_response(
            {"id": "x", "object": "chat.completion", "choices": [choice], "usage": usage}
        )

    obj = "chat.completion.chunk" if chat else "text_completion"
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if "#fault:slow" in prompt:
        await asyncio.sleep(2.0)
    if "test_first_delay" in body:
        await asyncio.sleep(float(body["test_first_delay"]))
    if chat:
        role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        await resp.write(_chunk(obj, "r", role, prompt_token_ids=[1, 2, 3] if ids_on else None))
    sent = 0
    while sent < n:
        k = min(per_chunk, n - sent)
        text = "".join(f" w{sent + j}" for j in range(k))
        choice = {"index": 0, "finish_reason": "length" if sent + k == n else None}
        if chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        choice["token_ids"] = list(range(100 + sent, 100 + sent + k)) if ids_on else None
        await resp.write(_chunk(obj, "r", choice))
        sent += k
        if "#fault:error" in prompt and sent >= 2:
            error = {"message": "engine died", "type": "InternalServerError", "code": 500}
            await resp.write(b"data: " + json.dumps({"error": error}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        if "#fault:truncate" in prompt and sent >= n // 2:
            assert request.transport is not None
            request.transport.close()
            return resp
        if delay:
            await asyncio.sleep(delay)
    options = body.get("stream_options") or {}
    if options.get("include_usage"):
        await resp.write(_chunk(obj, "r", None, usage=usage))
    if "#fault:nodone" not in prompt:
        await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _error_answer(spec: dict[str, Any]) -> web.Response:
    error = {"message": "refused", "type": "rate_limit_error", "param": None}
    error["code"] = spec.get("code")
    envelope: dict[str, Any] = {"pad": "x" * spec["pad"]} if "pad" in spec else {}
    envelope["error"] = error
    headers = {"Retry-After": str(spec["retry_after"])} if "retry_after" in spec else None
    return web.json_response(envelope, status=spec.get("status", 429), headers=headers)


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, True)


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, False)


class EngineThread:
    """The test engine, served from its own thread and loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def _start(self) -> str:
        app = web.Application()
        app.router.add_get("/v1/models", _models)
        app.router.add_post("/v1/chat/completions", _chat)
        app.router.add_post("/v1/completions", _completions)
        self.runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    def stop(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    engine = EngineThread()
    engine.start()
    try:
        yield engine.url
    finally:
        engine.stop()


def _sim_available() -> bool:
    try:
        return importlib.util.find_spec("narwhal.sim.cli") is not None
    except ModuleNotFoundError:
        return False


@pytest.fixture
def sim_url() -> Iterator[str]:
    if not _sim_available():
        pytest.skip("narwhal.sim.cli is not importable yet (`narwhal sim` is being built)")
    proc = subprocess.Popen(
        [sys.executable, "-m", "narwhal", "sim", "--port", "0", "--time-scale", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        prefix = "narwhal sim listening on "
        assert line.startswith(prefix), f"unexpected first line from narwhal sim: {line!r}"
        yield line[len(prefix) :].strip()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
