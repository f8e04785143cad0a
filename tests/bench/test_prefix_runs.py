"""`narwhal bench` with prefix workloads, end to end: against a real `narwhal sim` subprocess
(what the engine received, from its usage counts) and the in-process test engine (how
conversations end, think time, flags)."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from narwhal.bench import cli
from narwhal.bench.body import completion_prompt
from narwhal.bench.config import from_args
from narwhal.bench.conversation import Conversations, Script
from narwhal.bench.session import make_workload
from narwhal.bench.transcripts import load_transcripts
from narwhal.protocol.tokenizer import SimTokenizer

EXAMPLE = Path(__file__).parents[2] / "examples" / "conversations.jsonl"
SIM_MODEL = "narwhal-sim"
TOKENIZER = SimTokenizer()
# What turn k+1's prompt adds to turn k's, besides the reply and the new message's text.
# Chat: `<|im_end|>` after the reply, `<|im_start|>user\n ... <|im_end|>`, and the
# generation prompt `<|im_start|>assistant\n` (3 units) again; turn k's own
# generation prompt is now the reply's header. So 1 + (1 + 2 + 1) + (1 + 3) = 9.
# Completions: the newline between the reply and the new message.
TEMPLATE_PER_TURN = {True: 9, False: 1}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def bench_subprocess(url: str, tmp_path: Path, *flags: str) -> dict[str, Any]:
    out_json = tmp_path / "bench.json"
    argv = [sys.executable, "-m", "narwhal", "bench", "--url", url, "--json", str(out_json)]
    proc = subprocess.run([*argv, *flags], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(out_json.read_text())
    doc["stdout"] = proc.stdout
    return doc


def bench(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = cli.run(parse(argv))
    out, err = capsys.readouterr()
    return status, out, err


def scripts_of(flags: list[str], url: str) -> Conversations:
    """The run's conversations rebuilt from the same flags (they depend on nothing else)."""
    config = from_args(parse(["--url", url, *flags]))
    transcripts = load_transcripts(config.dataset) if config.dataset is not None else None
    workload = make_workload(config, SIM_MODEL, transcripts=transcripts)
    assert isinstance(workload, Conversations)
    return workload


def by_conversation(doc: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    turns: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in doc["stages"][0]["requests"]:
        turns[r["conversation"]].append(r)
    return {n: sorted(rs, key=lambda r: r["turn"]) for n, rs in turns.items()}


def opening_messages(script: Script) -> list[dict[str, Any]]:
    return [*script.transcript.opening, script.transcript.exchanges[0].user]


def check_history_grew_by_the_reply(
    script: Script, turns: list[dict[str, Any]], *, chat: bool = True
) -> None:
    """Turn 1 is exactly the scripted opening; each later turn holds the previous prompt,
    the reply received and the new user message (the sim's own prompt token counts)."""
    opening = opening_messages(script)
    if chat:
        assert turns[0]["usage_prompt_tokens"] == TOKENIZER.chat_prompt_count(opening)
    else:
        ids = TOKENIZER.completion_prompt_ids(completion_prompt(opening))
        assert turns[0]["usage_prompt_tokens"] == len(ids)
    for before, turn in itertools.pairwise(turns):
        new = script.transcript.exchanges[turn["turn"] - 1].user["content"]
        grew = turn["usage_prompt_tokens"] - before["usage_prompt_tokens"]
        reply = grew - TEMPLATE_PER_TURN[chat] - TOKENIZER.count(new)
        # The reply's text, counted again: the sim's punctuation tokens may join in pairs
        # when re-read (",." is one unit), so between half its output tokens and all.
        out = before["output_tokens"]
        assert math.ceil(out / 2) <= reply <= out, (script.number, turn["turn"], grew, out)


@pytest.mark.parametrize("mode", [[], ["--no-stream"], ["--endpoint", "completions"]])
def test_multi_turn_against_narwhal_sim(sim_url: str, tmp_path: Path, mode: list[str]) -> None:
    flags = [*mode, "--workload", "multi-turn", "-n", "18", "-c", "3", "--turns", "3",
             "--suffix-tokens", "40", "--system-prompts", "2", "--system-prompt-tokens", "120",
             "--max-tokens", "12", "--warmup", "0", "--seed", "5"]  # fmt: skip
    doc = bench_subprocess(sim_url, tmp_path, *flags)
    assert "multi-turn, 3 turns of 40 tokens" in doc["stdout"]
    assert "conversations 6 started: 6 completed" in doc["stdout"]
    assert "  turn 3" in doc["stdout"]
    stage = doc["stages"][0]
    conversations = stage["summary"]["conversations"]
    assert (conversations["started"], conversations["completed"], conversations["cut"]) == (6, 6, 0)
    assert [t["turn"] for t in conversations["ttft_by_turn_s"]] == [1, 2, 3]
    assert all(t["count"] == 6 for t in conversations["ttft_by_turn_s"])
    source = scripts_of(flags, sim_url)
    turns = by_conversation(doc)
    assert sorted(turns) == list(range(6))
    for number, recorded in turns.items():
        script = source.script(number)
        assert [r["turn"] for r in recorded] == [1, 2, 3]
        assert all(r["error"] is None and r["output_tokens"] > 0 for r in recorded)
        assert {r["system_prompt"] for r in recorded} == {script.system_prompt}
        assert {r["url"] for r in recorded} == {0}
        check_history_grew_by_the_reply(script, recorded, chat="completions" not in mode)
        # A turn starts only after the previous reply has ended.
        for before, turn in itertools.pairwise(recorded):
            assert turn["start_s"] >= before["start_s"] + before["latency_s"]


@pytest.mark.parametrize("dataset_replies", [False, True])
def test_dataset_conversations_against_narwhal_sim(
    sim_url: str, tmp_path: Path, dataset_replies: bool
) -> None:
    flags = ["--workload", "multi-turn", "--dataset", str(EXAMPLE), "-n", "10", "-c", "2",
             "--max-tokens", "6", "--warmup", "0"]  # fmt: skip
    if dataset_replies:
        flags.append("--dataset-replies")
    doc = bench_subprocess(sim_url, tmp_path, *flags)
    source = scripts_of(flags, sim_url)
    turns = by_conversation(doc)
    assert sorted(turns) == [0, 1, 2, 3]  # 3 + 2 + 2 + 3 turns: the example once
    for number, recorded in turns.items():
        script = source.script(number)
        assert [r["turn"] for r in recorded] == list(range(1, script.turns + 1))
        if not dataset_replies:
            check_history_grew_by_the_reply(script, recorded)
            continue
        # The file's own history: every prompt is known exactly.
        history = list(script.transcript.opening)
        for exchange, r in zip(script.transcript.exchanges, recorded, strict=True):
            history.append(exchange.user)
            assert r["usage_prompt_tokens"] == TOKENIZER.chat_prompt_count(history)
            history.extend(exchange.after)


def write_lines(path: Path, *conversations: list[str]) -> Path:
    lines = [{"messages": [{"role": "user", "content": u} for u in c]} for c in conversations]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_failed_turn_ends_its_conversation(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = write_lines(tmp_path / "c.jsonl", ["hello", "#fault:429 now", "never sent"])
    out_json = tmp_path / "r.json"
    status, out, _ = bench(
        ["--url", engine_url, "--workload", "multi-turn", "--dataset", str(dataset), "-n", "3",
         "-c", "1", "--max-tokens", "3", "--warmup", "0", "--json", str(out_json)],
        capsys,
    )  # fmt: skip
    assert status == 0
    doc = json.loads(out_json.read_text())
    records = doc["stages"][0]["requests"]
    # The third turn is never sent: its budget goes to a next conversation, cut to one turn.
    assert [(r["conversation"], r["turn"], r["status"]) for r in records] == [
        (0, 1, 200), (0, 2, 429), (1, 1, 200),
    ]  # fmt: skip
    conversations = doc["stages"][0]["summary"]["conversations"]
    assert (conversations["started"], conversations["completed"]) == (2, 1)
    assert (conversations["failed"], conversations["cut"]) == (1, 0)
    assert "2 started: 1 completed, 1 ended by a failed turn, 0 cut" in out


def test_open_loop_conversations_send_the_rate_in_requests(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "r.json"
    status, out, _ = bench(
        ["--url", engine_url, "--url", engine_url, "--workload", "multi-turn", "--turns", "2:4",
         "--rate", "300", "-n", "30", "--max-tokens", "2", "--warmup", "4",
         "--json", str(out_json)],
        capsys,
    )  # fmt: skip
    assert status == 0
    doc = json.loads(out_json.read_text())
    stage = doc["stages"][0]
    assert stage["rate"] == 300.0 and stage["conversation_rate"] == 100.0  # 3 turns a mean
    assert "300 req/s as conversations Poisson at 100/s (generated" in out
    assert stage["issued"] == len(stage["requests"]) == 30
    conversations = stage["summary"]["conversations"]
    assert conversations["started"] == conversations["completed"]
    turns = by_conversation(doc)
    assert sum(len(t) for t in turns.values()) == 30
    assert min(turns) > 0  # the warm-up's conversations took the first numbers
    for number, recorded in turns.items():
        assert [r["turn"] for r in recorded] == list(range(1, len(recorded) + 1))
        assert {r["url"] for r in recorded} == {number % 2}  # one --url per conversation


def test_think_time_waits_after_each_reply(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "r.json"
    status, _, _ = bench(
        ["--url", engine_url, "--workload", "multi-turn", "--turns", "3", "--think-time", "0.2",
         "-n", "3", "-c", "1", "--max-tokens", "2", "--warmup", "0", "--json", str(out_json)],
        capsys,
    )  # fmt: skip
    assert status == 0
    records = json.loads(out_json.read_text())["stages"][0]["requests"]
    for before, turn in itertools.pairwise(records):
        assert turn["start_s"] >= before["start_s"] + before["latency_s"] + 0.2


def test_a_duration_cuts_conversations_between_turns(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "r.json"
    status, out, _ = bench(
        ["--url", engine_url, "--workload", "multi-turn", "--turns", "5", "--think-time", "30",
         "-n", "100", "-c", "2", "--duration", "0.5", "--max-tokens", "2", "--warmup", "0",
         "--json", str(out_json)],
        capsys,
    )  # fmt: skip
    assert status == 0
    stage = json.loads(out_json.read_text())["stages"][0]
    # Each user's second turn is due 30 s after its first reply, past the stage's end: the
    # conversation is cut at once (the stage does not sleep through the think time), and
    # the user starts no other conversation.
    assert [r["turn"] for r in stage["requests"]] == [1, 1]
    assert stage["summary"]["window_s"] < 30
    conversations = stage["summary"]["conversations"]
    assert (conversations["started"], conversations["cut"]) == (2, 2)
    assert "2 cut by the stage's end" in out


def test_shared_prefix_run(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "r.json"
    status, out, _ = bench(
        ["--url", engine_url, "--workload", "shared-prefix", "--system-prompts", "3",
         "--system-prompt-tokens", "50", "--suffix-tokens", "8", "-n", "30", "-c", "3",
         "--max-tokens", "2", "--json", str(out_json)],
        capsys,
    )  # fmt: skip
    assert status == 0
    assert "shared-prefix, suffix 8 tokens, 3 system prompts of 50 tokens (uniform)" in out
    assert "conversations" not in out
    doc = json.loads(out_json.read_text())
    assert doc["config"]["workload"] == "shared-prefix"
    assert doc["config"]["prefix"]["system_prompts"] == 3
    records = doc["stages"][0]["requests"]
    assert {r["system_prompt"] for r in records} == {0, 1, 2}
    assert all(r["conversation"] is None and r["turn"] is None for r in records)
    assert doc["stages"][0]["summary"]["conversations"] is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--turns", "3"], "--turns needs --workload multi-turn"),
        (["--dataset-replies"], "--dataset-replies needs --workload multi-turn"),
        (["--suffix-tokens", "3"], "--suffix-tokens needs --workload multi-turn or shared"),
        (["--workload", "shared-prefix", "--turns", "3"], "--turns is for --workload multi-turn"),
        (["--workload", "shared-prefix", "--dataset", "x"], "--dataset is for --workload single"),
        (["--workload", "multi-turn", "--prompt-tokens", "5"], "use --suffix-tokens"),
        (["--workload", "multi-turn", "--dataset-replies"], "--dataset-replies needs --dataset"),
        (["--workload", "multi-turn", "--dataset", "x", "--turns", "2"], "does not apply"),
        (["--workload", "multi-turn", "--turns", "0"], "--turns must be at least 1"),
        (["--workload", "multi-turn", "--think-time", "-1"], "--think-time"),
        (["--workload", "multi-turn", "--system-prompt-zipf", "1"], "needs --system-prompts"),
        (["--workload", "shared-prefix", "--system-prompts", "0"], "at least 1"),
        (["--workload", "shared-prefix", "--system-prompt-zipf", "0"], "must be positive"),
        (["--workload", "shared-prefix", "--system-prompt-tokens", "0"], "at least 1"),
    ],
)
def test_prefix_flags_where_they_mean_nothing_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = bench(["--url", "http://127.0.0.1:1", *argv], capsys)
    assert status == 2
    assert message in err


def test_a_bad_conversation_dataset_exits_2_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "a"}]}\n{"conversations": 3}\n')
    status, out, err = bench(
        ["--url", "http://127.0.0.1:1", "--workload", "multi-turn", "--dataset", str(path)], capsys
    )
    assert status == 2 and out == ""
    assert f"--dataset: {path}:2: 'conversations' must be a non-empty list" in err
