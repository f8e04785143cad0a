"""`narwhal serve` logs and trace context, over real processes: JSON lines parsed back, one
access line per completion request with what the client got, the access log turned off,
the client's W3C traceparent and tracestate reaching the engines (both halves of a P/D
pair) unchanged or not at all, and no prompt or output in the log."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.e2e.conftest import Reply, Start, chat, completion, fleet_config, send, sim_process
from tests.processes import NarwhalProcess, narwhal_process, router_process, write_router_config

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
OTLP = "http://127.0.0.1:4318"


def log_lines(router: NarwhalProcess, stderr: Path) -> list[dict[str, Any]]:
    """Every line the router logged, each parsed back as JSON (after it has exited, so
    every line is written)."""
    router.terminate()
    parsed = [json.loads(line) for line in stderr.read_text().splitlines() if line]
    for line in parsed:
        assert {"ts", "level", "logger", "message"} <= set(line), line
    return parsed


def access_lines(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The access lines by request id; none twice."""
    access = [line for line in lines if line["logger"] == "narwhal.access"]
    by_id = {line["request_id"]: line for line in access}
    assert len(by_id) == len(access)
    return by_id


def usage_of(reply: Reply) -> dict[str, int]:
    if reply.headers["Content-Type"].startswith("text/event-stream"):
        (usage,) = [e["usage"] for e in reply.events() if isinstance(e, dict) and e.get("usage")]
        return dict(usage)
    return dict(reply.json()["usage"])


def request_id(reply: Reply) -> str:
    return str(reply.headers["X-Request-Id"])


async def test_json_access_lines_say_what_each_client_got(start: Start, tmp_path: Path) -> None:
    sim = start(sim_process("--time-scale", "0"))
    stderr = tmp_path / "router.log"
    config = fleet_config([("e0", sim, "vllm")])
    router = start(router_process(config, "--log-format", "json", stderr_path=stderr))
    whole = await send(router.url, chat("Hello there", max_tokens=6))
    streamed = await send(
        router.url,
        completion("Once upon", max_tokens=5, stream=True, stream_options={"include_usage": True}),
    )
    invalid = await send(router.url, chat("Hello", max_tokens="many"))
    assert (whole.status, streamed.status, invalid.status) == (200, 200, 400)

    lines = log_lines(router, stderr)
    by_id = access_lines(lines)
    assert set(by_id) == {request_id(whole), request_id(streamed), request_id(invalid)}
    for reply, route, stream in ((whole, "chat", False), (streamed, "completion", True)):
        line = by_id[request_id(reply)]
        usage = usage_of(reply)
        assert line["level"] == "INFO" and line["message"] == "completion request"
        assert {k: line[k] for k in ("route", "stream", "status", "outcome", "engines")} == {
            "route": route,
            "stream": stream,
            "status": 200,
            "outcome": "completed",
            "engines": ["e0"],
        }
        assert line["prompt_tokens"] == usage["prompt_tokens"]
        assert line["completion_tokens"] == usage["completion_tokens"] > 0
        assert 0 < line["ttft_s"] <= line["duration_s"]
    refused = by_id[request_id(invalid)]
    assert (refused["status"], refused["outcome"], refused["engines"]) == (400, "invalid", [])
    assert refused["prompt_tokens"] is None and refused["ttft_s"] is None
    # The router's other lines are JSON too, at their own levels.
    assert any(line["message"].startswith("serving model") for line in lines)


async def test_the_access_log_turned_off_by_the_configuration(start: Start, tmp_path: Path) -> None:
    sim = start(sim_process("--time-scale", "0"))
    stderr = tmp_path / "router.log"
    config = fleet_config([("e0", sim, "vllm")], logging={"access_log": False, "format": "json"})
    router = start(router_process(config, stderr_path=stderr))
    assert (await send(router.url, chat("Hello", max_tokens=4))).status == 200
    lines = log_lines(router, stderr)
    assert access_lines(lines) == {}
    assert any(line["message"].startswith("serving model") for line in lines)


async def test_the_embedded_default_logs_text_access_lines_unless_told_not_to(
    start: Start, tmp_path: Path
) -> None:
    """Text is the default format: the access line is key=value pairs."""
    with_log, without_log = tmp_path / "on.log", tmp_path / "off.log"
    on = start(narwhal_process(["serve", "--port", "0"], stderr_path=with_log))
    off = start(
        narwhal_process(["serve", "--port", "0", "--no-access-log"], stderr_path=without_log)
    )
    reply = await send(on.url, chat("Hello", max_tokens=4))
    assert reply.status == 200
    assert (await send(off.url, chat("Hello", max_tokens=4))).status == 200
    on.terminate()
    off.terminate()
    usage = usage_of(reply)
    (line,) = [line for line in with_log.read_text().splitlines() if "narwhal.access" in line]
    assert re.fullmatch(
        rf"\S+ \S+ INFO narwhal\.access: request_id={request_id(reply)} route=chat stream=false "
        r"status=200 outcome=completed engines=sim-prefill,sim-decode "
        rf"prompt_tokens={usage['prompt_tokens']} completion_tokens={usage['completion_tokens']} "
        r"ttft_s=\d+\.\d{6} duration_s=\d+\.\d{6} upstream_timeout=- tenant=default "
        r"class=standard",
        line,
    ), line
    text = without_log.read_text()
    assert "narwhal.access" not in text and "serving model" in text


def traces_seen(path: Path) -> dict[str, dict[str, Any]]:
    """The sim's --trace-log, by the client's part of each request id."""
    seen: dict[str, dict[str, Any]] = {}
    for raw in path.read_text().splitlines():
        line = json.loads(raw)
        seen[line["request_id"].rsplit("-", 1)[0]] = line
    return seen


async def test_a_valid_trace_context_reaches_the_engine_unchanged(
    start: Start, tmp_path: Path
) -> None:
    trace_log = tmp_path / "trace.log"
    sim = start(sim_process("--time-scale", "0", "--trace-log", str(trace_log)))
    router = start(router_process(fleet_config([("e0", sim, "vllm")])))
    sent = {
        "traced": {"traceparent": TRACEPARENT, "tracestate": TRACESTATE},
        "parent-only": {"traceparent": TRACEPARENT},
        "invalid": {"traceparent": TRACEPARENT.upper(), "tracestate": TRACESTATE},
        "zeros": {"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"},
        "bad-state": {"traceparent": TRACEPARENT, "tracestate": "Not Valid"},
        "untraced": {},
    }
    for name, headers in sent.items():
        body = chat("Hello", max_tokens=3, stream=name == "traced")
        reply = await send(router.url, body, headers={"X-Request-Id": name, **headers})
        assert reply.status == 200, reply.raw
    seen = traces_seen(trace_log)
    assert {name: (line["traceparent"], line["tracestate"]) for name, line in seen.items()} == {
        "traced": ([TRACEPARENT], [TRACESTATE]),
        "parent-only": ([TRACEPARENT], []),
        "invalid": ([], []),  # nor its tracestate: it belongs to no valid trace
        "zeros": ([], []),
        "bad-state": ([TRACEPARENT], []),
        "untraced": ([], []),
    }


async def test_both_halves_of_a_disaggregated_pair_carry_the_trace_context(
    start: Start, tmp_path: Path
) -> None:
    logs = {role: tmp_path / f"{role}.log" for role in ("prefill", "decode")}
    sims = {
        role: start(sim_process("--time-scale", "0", "--role", role, "--trace-log", str(log)))
        for role, log in logs.items()
    }
    config = fleet_config([])
    config["engines"] = [
        {"name": f"{role[0]}0", "url": sim.url, "role": role} for role, sim in sims.items()
    ]
    router = start(router_process(config))
    headers = {"X-Request-Id": "pd", "traceparent": TRACEPARENT, "tracestate": TRACESTATE}
    for stream in (True, False):
        reply = await send(router.url, chat("Hello", max_tokens=4, stream=stream), headers=headers)
        assert reply.status == 200, reply.raw
    for log in logs.values():
        lines = [json.loads(raw) for raw in log.read_text().splitlines()]
        assert len(lines) == 2
        for line in lines:
            assert line["path"] == "/v1/chat/completions"
            assert (line["traceparent"], line["tracestate"]) == ([TRACEPARENT], [TRACESTATE])


async def test_no_prompt_or_output_in_the_log(start: Start, tmp_path: Path) -> None:
    marker = "zebra-marker-7f3a91"
    sims = [start(sim_process("--time-scale", "0")) for _ in range(2)]
    stderr = tmp_path / "router.log"
    config = fleet_config([("e0", sims[0], "vllm"), ("e1", sims[1], "vllm")])
    router = start(router_process(config, "--log-format", "json", stderr_path=stderr))
    replies = [
        await send(router.url, chat(f"{marker} hello", max_tokens=8)),
        await send(router.url, completion(f"{marker} once", max_tokens=8, stream=True)),
        # Every attempt fails (logged as warnings), before and after the response starts.
        await send(router.url, chat(f"#sim:http_500 {marker}", max_tokens=4)),
        await send(
            router.url, chat(f"#sim:stall=0.2 #sim:error_midstream=4 {marker}", stream=True)
        ),
    ]
    assert [r.status for r in replies] == [200, 200, 502, 200]
    outputs = [replies[0].json()["choices"][0]["message"]["content"]]
    outputs += ["".join(e["choices"][0]["text"] for e in replies[1].events()[:-1])]
    lines = log_lines(router, stderr)
    assert len(access_lines(lines)) == 4
    assert sum(line["level"] == "WARNING" for line in lines) >= 3
    text = stderr.read_text()
    assert marker not in text
    for output in outputs:
        assert len(output) > 20 and output not in text


def test_otlp_endpoint_without_the_sdk_is_one_clear_error(tmp_path: Path) -> None:
    """Without the otel extra, as where it is not installed: an import that fails. Both
    `serve --otlp-endpoint` and `check-config` on a file with tracing.otlp_endpoint say so."""
    hidden = tmp_path / "opentelemetry"
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('not installed (test)')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    config = tmp_path / "narwhal.yaml"
    config.write_text(
        "model: m\nengines: [{name: e0, url: 'http://127.0.0.1:9'}]\n"
        f"tracing: {{otlp_endpoint: '{OTLP}'}}\n"
    )
    for args in (["serve", "--port", "0", "--otlp-endpoint", OTLP], ["check-config", str(config)]):
        result = subprocess.run(
            [sys.executable, "-m", "narwhal", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert result.returncode == 2, args
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("error: tracing.otlp_endpoint (--otlp-endpoint) needs the Open")
        assert line.endswith("pip install '.[otel]'")


def test_otlp_endpoint_must_be_a_url() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "narwhal", "serve", "--port", "0", "--otlp-endpoint", "collector"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: tracing.otlp_endpoint: expected an http:// or https:// URL of an OTLP/HTTP "
        'collector, got "collector"'
    )


async def test_under_json_every_line_the_process_writes_is_json(tmp_path: Path) -> None:
    """Container logs mix stdout and stderr: with `--log-format json` the lines outside the
    log (listening, draining, a configuration error) are JSON objects too, and the process
    exits once its last line is out."""
    path = tmp_path / "narwhal.yaml"
    serve = [sys.executable, "-m", "narwhal", "serve", "--config", str(path), "--log-format"]
    with sim_process("--time-scale", "0") as sim:
        write_router_config(path, fleet_config([("e0", sim, "vllm")]))
        proc = await asyncio.to_thread(
            subprocess.Popen,
            [*serve, "json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        try:
            assert proc.stdout is not None
            first = json.loads(await asyncio.to_thread(proc.stdout.readline))
            url = first["url"]
            assert first["message"] == f"narwhal listening on {url}"
            reply = await send(url, chat(max_tokens=4))
            assert reply.status == 200, reply.raw
            proc.send_signal(signal.SIGTERM)
            out, err = await asyncio.to_thread(proc.communicate, timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                await asyncio.to_thread(proc.communicate)
    assert proc.returncode == 0
    stdout = [json.loads(line) for line in out.decode().splitlines() if line]
    assert [line["message"] for line in stdout] == ["narwhal draining"]
    stderr = [json.loads(line) for line in err.decode().splitlines() if line]
    assert stderr and all({"ts", "level", "logger", "message"} <= set(line) for line in stderr)

    path.write_text("model: m\nengines: []\nserving: {port: many}\n")
    checked = await asyncio.to_thread(
        subprocess.run, [*serve, "json"], capture_output=True, timeout=60
    )
    assert checked.returncode == 2 and not checked.stdout
    errors = [json.loads(line) for line in checked.stderr.decode().splitlines() if line]
    assert errors and all(line["level"] == "ERROR" for line in errors)
    assert any("serving.port" in line["message"] for line in errors), errors
