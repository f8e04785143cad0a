"""Profiling against real sim processes: probes sized in the engine's tokens within its
max_model_len, the discipline learned from prompts sent together, re-profiling of a new
process (and none of an idle engine), and an engine whose probes cannot succeed.

The sims run at time-scale 1 (20,000 prompt tokens/s, 6 ms decode steps), so the first
tokens of the concurrent probes come tens of milliseconds apart when they come apart.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import chat, metrics_of, send, sim_process
from tests.e2e.test_predictive import engines, predictive
from tests.processes import NarwhalProcess, router_process


def _has_prefill_discipline() -> bool:
    helped = subprocess.run(
        [sys.executable, "-m", "narwhal", "sim", "--help"], capture_output=True, text=True
    )
    return "--prefill-discipline" in helped.stdout


async def _sim_requests(sim: NarwhalProcess) -> float:
    """Requests the sim has answered (every one of them, success or not)."""
    values = await metrics_of(sim.url)
    return sum(v for k, v in values.items() if k.startswith("vllm:request_success_total"))


def _profile_lines(log: Path, engine: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if f"profiler: engine {engine} " in line]


@pytest.mark.parametrize(
    ("context", "dialect"),
    [
        (2048, "vllm"),
        (600, "vllm"),
        # Served as a generic OpenAI server: no /tokenize, no tokenizer configured, chat
        # probes. Sized by the estimate, which the engine's usage corrects.
        (2048, "openai"),
    ],
)
async def test_an_engine_with_a_short_context_is_profiled_within_it(
    context: int, dialect: str
) -> None:
    """vLLM --max-model-len 2048 (common on small GPUs): the default 2,048-token probe
    and its output would be refused with a 400; fitted, every probe is answered."""
    with sim_process("--time-scale", "1", "--max-model-len", str(context)) as sim:
        config = predictive([("s0", sim)])
        config["engines"][0]["dialect"] = dialect
        with router_process(config) as router:
            engine = (await engines(router))["s0"]
            assert engine["profiling"]["state"] == "profiled", engine["profiling"]
            assert engine["eligible"] is True
            profile = engine["profile"]
            assert profile["max_model_len"] == context
            sizes = profile["probe_prompt_tokens"]
            # In the engine's own count (its usage), each with its 16 output tokens inside
            # the context, and still short and long prompts for the fit.
            assert max(sizes) + 16 <= context and max(sizes) >= 0.9 * (context - 24)
            assert min(sizes) < max(sizes) / 4
            assert profile["concurrent"]["prompt_tokens"] + 2 <= context
            # What the probes cost, as the engine itself counted it (nothing else ran).
            served = await metrics_of(sim.url)
            engine_tokens = sum(
                value
                for key, value in served.items()
                if key.startswith(("vllm:prompt_tokens_total", "vllm:generation_tokens_total"))
            )
            assert engine["profiling"]["probe_tokens"] == engine_tokens > 0
            reply = await send(router.url, chat("Hello"))
            assert reply.status == 200, reply.raw
            values = await metrics_of(router.url)
            assert values["narwhal_offered_total"] == 1  # the probes are not client traffic


async def test_configured_probe_sizes_are_used_and_fitted() -> None:
    with sim_process("--time-scale", "1", "--max-model-len", "1024") as sim:
        config = predictive([("s0", sim)])
        config["fleet"] = {"probe_prompt_tokens": [100, 400, 3000]}
        with router_process(config) as router:
            profile = (await engines(router))["s0"]["profile"]
            assert profile is not None
            # 3,000 is past the context: all three scaled down together to fit.
            small, middle, large = profile["probe_prompt_tokens"]
            assert large + 16 <= 1024 and large >= 950
            assert small == pytest.approx(100 * large / 3000, abs=2)
            assert middle == pytest.approx(400 * large / 3000, abs=2)


async def test_an_engine_that_starts_cold_is_profiled_as_it_runs_once_warm() -> None:
    """An engine whose first steps after its start take four times as long (vLLM's first
    prompt of each length took 2-5x its later ones on CPU): the profile is what the warm
    engine costs (20,000 prompt tokens/s), not what the cold start did; each probe length
    is sent twice over and the faster of the two stands."""
    with sim_process("--time-scale", "1", "--cold-steps", "4", "--cold-factor", "4") as sim:
        with router_process(predictive([("s0", sim)])) as router:
            profile = (await engines(router))["s0"]["profile"]
            assert profile is not None
            assert profile["prefill_s"]["per_1k_tokens"] == pytest.approx(0.05, rel=0.25)


@pytest.mark.parametrize(
    ("flags", "discipline"),
    [
        # vLLM's chunked prefill, a budget the four 1,024-token probes fit in one step:
        # their first tokens come together at its end.
        ((), "batched"),
        # A step budget of 256 tokens: each prompt takes four steps, one after another.
        (("--max-num-batched-tokens", "256"), "serial"),
    ],
)
async def test_the_prefill_discipline_is_learned_from_prompts_sent_together(
    flags: tuple[str, ...], discipline: str
) -> None:
    with sim_process("--time-scale", "1", *flags) as sim:
        with router_process(predictive([("s0", sim)])) as router:
            profile = (await engines(router))["s0"]["profile"]
            concurrent = profile["concurrent"]
            assert concurrent["prefill_discipline"] == discipline, concurrent
            assert len(concurrent["first_token_s"]) == 4
            assert concurrent["prompt_tokens"] == pytest.approx(1024, abs=2)
            # The sim prefills 20,000 tokens/s whether prompts come together or not.
            assert concurrent["batched_prefill_tokens_per_s"] == pytest.approx(20_000, rel=0.4)
            spread = concurrent["first_token_spread"]
            assert spread < 0.3 if discipline == "batched" else spread > 0.7


@pytest.mark.parametrize(
    ("discipline", "learned"),
    [
        # One prompt a step, decoding going on beside it.
        ("serial", "serial"),
        # No continuous batching: each request's output is done before the next starts.
        ("sequential", "one_at_a_time"),
    ],
)
async def test_an_engine_that_prefills_one_prompt_at_a_time_is_told_apart(
    discipline: str, learned: str
) -> None:
    with sim_process("--time-scale", "1", "--prefill-discipline", discipline) as sim:
        with router_process(predictive([("s0", sim)])) as router:
            concurrent = (await engines(router))["s0"]["profile"]["concurrent"]
            assert concurrent["prefill_discipline"] == learned, concurrent
            assert concurrent["first_token_spread"] > 0.7


async def test_an_engine_restarted_with_another_context_is_reprofiled_to_fit_it(
    tmp_path: Path,
) -> None:
    log = tmp_path / "router.log"
    with sim_process("--time-scale", "1") as sim:
        port = sim.url.rsplit(":", 1)[1]
        config = predictive([("s0", sim)])
        config["fleet"] = {"probe_interval_s": 0.2}
        with router_process(config, stderr_path=log) as router:
            before = (await engines(router))["s0"]["profile"]
            assert before["max_model_len"] == 32768
            sim.terminate()
            with sim_process("--time-scale", "1", "--port", port, "--max-model-len", "2048"):
                profile = await _profile_where(router, lambda p: p["max_model_len"] == 2048)
                assert max(profile["probe_prompt_tokens"]) + 16 <= 2048
                reply = await send(router.url, chat("Hello again"))
                assert reply.status == 200, reply.raw
                report = (await engines(router))["s0"]["profiling"]
                assert report["runs"] == 2 and report["state"] == "profiled"
    lines = _profile_lines(log, "s0")
    # Once profiled at start, once again after it came back (it was seen down: probes
    # every 0.2 s): one line each, with its reason.
    profiled = [line for line in lines if " profiled (" in line]
    assert len(profiled) == 2, lines
    assert "(first profile)" in profiled[0]
    assert "(the engine came back up)" in profiled[1]


async def _restart_unseen(
    tmp_path: Path, context: str, then: Callable[[NarwhalProcess], Awaitable[None]]
) -> str:
    """Profile a sim, restart it on its port with `--max-model-len context` between two
    health checks (5 s apart), run `then` against the router; the router's log."""
    log = tmp_path / "router.log"
    with sim_process("--time-scale", "1") as sim:
        port = sim.url.rsplit(":", 1)[1]
        config = predictive([("s0", sim)])
        config["fleet"] = {"probe_interval_s": 5.0, "stale_after_s": 30.0}
        with router_process(config, stderr_path=log) as router:
            assert (await engines(router))["s0"]["profile"]["max_model_len"] == 32768
            # Just after a round: the next is 4.5 s or more away.
            await _report_where(router, lambda e: e["monitoring"]["scrape_age_s"] < 0.5)
            sim.terminate()
            with sim_process("--time-scale", "1", "--port", port, "--max-model-len", context):
                await then(router)
                report = (await engines(router))["s0"]
                assert report["monitoring"]["consecutive_failures"] == 0  # never seen down
    text = log.read_text()
    assert "fleet: engine s0 is down" not in text
    return text


async def test_a_restart_seen_only_in_its_counters_is_reprofiled_to_its_new_context(
    tmp_path: Path,
) -> None:
    """An engine restarted between two health checks never looks down; its metrics'
    counters going back say it is a new process: its /v1/models is read again and it is
    re-profiled within its new max_model_len, logged once with that reason."""

    async def reprofiled(router: NarwhalProcess) -> None:
        profile = await _profile_where(router, lambda p: p["max_model_len"] == 2048)
        assert max(profile["probe_prompt_tokens"]) + 16 <= 2048
        assert (await engines(router))["s0"]["profiling"]["reprofiles"] == 1

    text = await _restart_unseen(tmp_path, "2048", reprofiled)
    lines = [line for line in text.splitlines() if "profiler: engine s0 re-profiled" in line]
    assert len(lines) == 1, lines
    assert "restarted (its metrics counters went back; max_model_len 32768 -> 2048)" in lines[0]


async def test_a_restarted_engine_its_probes_cannot_measure_leaves_placement(
    tmp_path: Path,
) -> None:
    """Its old profile is another process's: a new one whose context leaves no room for a
    probe is out of placement (not served on the old profile), with the reason."""

    async def out(router: NarwhalProcess) -> None:
        engine = await _report_where(router, lambda e: e["profiling"]["state"] == "failed")
        assert engine["eligible"] is False and engine["profile"] is None
        assert "max_model_len 24" in engine["profiling"]["reason"]
        reply = await send(router.url, chat("Hi"))
        assert reply.status == 503 and reply.json()["error"]["code"] == "backend_unavailable"

    text = await _restart_unseen(tmp_path, "24", out)
    lines = [line for line in text.splitlines() if "profiler: engine s0 stays out" in line]
    assert len(lines) == 1, lines


async def test_a_drifting_engine_is_reprofiled_once_with_its_drift_in_the_log(
    tmp_path: Path,
) -> None:
    """Decode steps three times slower from 6 s after start (after its profile): served
    requests drive the TPOT drift past 0.3, and the engine is re-profiled (no sooner than
    30 s after its profile), its profile rescaled by what the probes measured, one line
    saying so."""
    log = tmp_path / "router.log"
    with sim_process("--time-scale", "1", "--drift-after-s", "6", "--drift-factor", "3") as sim:
        with router_process(predictive([("s0", sim)]), stderr_path=log) as router:
            deadline = time.monotonic() + 45
            i = 0
            while (await engines(router))["s0"]["profiling"]["reprofiles"] == 0:
                assert time.monotonic() < deadline, (await engines(router))["s0"]
                reply = await send(router.url, chat(f"#sim:len=12 drift {i}"))
                assert reply.status == 200, reply.raw
                i += 1
            engine = (await engines(router))["s0"]
    profile = engine["profile"]
    assert profile["kind"] == "reprofile"
    assert profile["rescaled"]["tpot"] == pytest.approx(3.0, rel=0.35)
    assert engine["profiling"]["runs"] == 2
    reprofiled = [line for line in _profile_lines(log, "s0") if "re-profiled" in line]
    assert len(reprofiled) == 1, reprofiled
    assert "(drift +" in reprofiled[0] and " past 0.30: prefill " in reprofiled[0]
    assert "TPOT +" in reprofiled[0]


async def test_probes_that_cannot_succeed_keep_the_engine_out_with_one_line_and_backoff(
    tmp_path: Path,
) -> None:
    """An engine whose context leaves no room for a probe stays out of placement, with
    the reason in /admin/engines and one log line, retried with backoff; meanwhile an idle
    healthy engine beside it gets no probes at all: Narwhal re-profiled idle engines every
    30 s, and this watches for longer than that."""
    log = tmp_path / "router.log"
    with (
        sim_process("--time-scale", "1", "--max-model-len", "24") as tiny,
        sim_process("--time-scale", "1") as idle,
    ):
        with router_process(
            predictive([("tiny", tiny), ("idle", idle)]), stderr_path=log
        ) as router:
            served = await _sim_requests(idle)
            started = time.monotonic()
            await asyncio.sleep(31.0)
            report = await engines(router)
            elapsed = time.monotonic() - started
            tiny_state = report["tiny"]
            assert tiny_state["eligible"] is False and tiny_state["profile"] is None
            assert tiny_state["profiling"]["state"] == "failed"
            assert "max_model_len 24" in tiny_state["profiling"]["reason"]
            # Retried after 1, 2, 4, 8, 16 s: a handful of attempts, not one a tick.
            attempts = tiny_state["profiling"]["attempts"]
            assert 4 <= attempts <= 7, attempts
            assert elapsed < 40
            # The idle engine: profiled once, and not probed since.
            assert report["idle"]["profiling"]["runs"] == 1
            assert await _sim_requests(idle) == served
            reply = await send(router.url, chat("Hi"))
            assert reply.status == 200 and reply.json()["model"]
    failures = [line for line in _profile_lines(log, "tiny") if "stays out" in line]
    assert len(failures) == 1, failures


async def _profile_where(router: NarwhalProcess, test: Any) -> Any:
    """The engine s0's profile, once it passes `test`."""
    engine = await _report_where(router, lambda e: e["profile"] is not None and test(e["profile"]))
    return engine["profile"]


async def _report_where(router: NarwhalProcess, test: Any, timeout_s: float = 20.0) -> Any:
    """The engine s0's /admin/engines report, once it passes `test`."""
    deadline = time.monotonic() + timeout_s
    engine = None
    while time.monotonic() < deadline:
        engine = (await engines(router))["s0"]
        if test(engine):
            return engine
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {engine}")


async def test_an_engine_its_bound_refuses_while_idle_is_probed_and_serves_again(
    tmp_path: Path,
) -> None:
    """One first token late on an idle engine (a host that stalled for 0.6 s, where the
    profile says milliseconds) makes its bound refuse the next requests, and nothing
    admitted could lower it again. The router probes the idle engine itself, learns from
    the probe as from a client request, and admits again within seconds (one line says
    so); before, the engine was refused every request from then on."""
    log = tmp_path / "router.log"
    with sim_process("--time-scale", "1") as sim:
        config = predictive([("s0", sim)], ttft_target_s=0.5)
        with router_process(config, stderr_path=log) as router:
            await _report_where(router, lambda e: e["profile"] is not None)
            stalled = await send(router.url, chat("#sim:slow_prefill=0.6 stalled", max_tokens=2))
            assert stalled.status == 200, stalled.raw
            statuses: list[int] = []
            deadline = time.monotonic() + 20.0
            while time.monotonic() < deadline:
                reply = await send(router.url, chat(f"again {len(statuses)}", max_tokens=2))
                statuses.append(reply.status)
                if reply.status == 200:
                    break
                assert reply.status == 429, reply.raw
                assert reply.json()["error"]["code"] == "ttft_budget_exceeded", reply.raw
                await asyncio.sleep(0.2)
            # The stall did make it refuse (else this tests nothing), and it serves again.
            assert statuses[0] == 429 and statuses[-1] == 200, statuses
            engine = (await engines(router))["s0"]
            probes = engine["profiling"]["idle_probes"]
            assert 1 <= probes <= 4, engine["profiling"]
            values = await metrics_of(router.url)
            assert values['narwhal_engine_idle_probes_total{engine="s0"}'] == probes
            assert values["narwhal_offered_total"] == 1 + len(statuses)  # probes are not
    lines = [line for line in _profile_lines(log, "s0") if "refused requests while idle" in line]
    assert len(lines) == 1, lines
