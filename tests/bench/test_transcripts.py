"""Conversation datasets: OpenAI messages and ShareGPT lines, and errors that name the line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.bench.transcripts import Exchange, Transcript, load_transcripts
from narwhal.bench.workload import DatasetError, load_dataset

EXAMPLE = Path(__file__).parents[2] / "examples" / "conversations.jsonl"


def write(tmp_path: Path, *lines: Any) -> Path:
    path = tmp_path / "c.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def test_both_forms_become_the_same_transcript(tmp_path: Path) -> None:
    system = {"role": "system", "content": "be brief"}
    openai = {"messages": [system, user("a"), assistant("b"), user("c")]}
    sharegpt = {
        "id": "x1",  # other keys are ignored
        "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": "a"},
            {"from": "gpt", "value": "b"},
            {"from": "human", "value": "c"},
        ],
    }
    path = write(tmp_path, openai, "", sharegpt)
    first, second = load_transcripts(path)
    expected = Transcript((system,), (Exchange(user("a"), (assistant("b"),)), Exchange(user("c"))))
    assert first == second == expected


def test_what_lies_between_user_messages_stays_with_the_one_before(tmp_path: Path) -> None:
    note = {"role": "developer", "content": "note"}
    parts = {"role": "user", "content": [{"type": "text", "text": "p"}]}
    path = write(tmp_path, {"messages": [user("a"), user("b"), assistant("c"), note, parts]})
    (t,) = load_transcripts(path)
    assert t.opening == ()
    assert t.exchanges == (
        Exchange(user("a")),
        Exchange(user("b"), (assistant("c"), note)),
        Exchange(parts),
    )


def test_the_example_dataset() -> None:
    transcripts = load_transcripts(EXAMPLE)
    assert [len(t.exchanges) for t in transcripts] == [3, 2, 2, 3]
    assert [len(t.opening) for t in transcripts] == [1, 0, 0, 1]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", r"c\.jsonl:2: "),
        ("[1]", r"c\.jsonl:2: expected a JSON object"),
        ({"prompt": "x"}, "exactly one of 'messages' .OpenAI. and 'conversations'"),
        ({"messages": [user("a")], "conversations": []}, "exactly one of"),
        ({"messages": []}, "'messages' must be a non-empty list"),
        ({"messages": ["hi"]}, r"messages\[0\] must be an object"),
        ({"messages": [user("a"), {"role": "tool", "content": "x"}]}, r"messages\[1\]\.role"),
        ({"messages": [{"role": "user", "content": 5}]}, r"messages\[0\]\.content must be"),
        ({"messages": [{"role": "user"}]}, r"messages\[0\]\.content must be"),
        ({"messages": [assistant("only")]}, "no user message"),
        ({"conversations": {}}, "'conversations' must be a non-empty list"),
        ({"conversations": [{"from": "bing", "value": "x"}]}, r"conversations\[0\]\.from"),
        ({"conversations": [{"from": "human", "value": 1}]}, r"conversations\[0\]\.value"),
        ({"conversations": [{"from": "gpt", "value": "x"}]}, "no user message"),
    ],
)
def test_bad_lines_name_their_line(tmp_path: Path, line: Any, message: str) -> None:
    path = write(tmp_path, {"messages": [user("fine")]}, line)
    with pytest.raises(DatasetError, match=message) as caught:
        load_transcripts(path)
    assert f"{path}:2: " in str(caught.value)


def test_missing_or_empty_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"missing\.jsonl"):
        load_transcripts(tmp_path / "missing.jsonl")
    with pytest.raises(DatasetError, match="no conversations"):
        load_transcripts(write(tmp_path, "", "  "))


def test_a_sharegpt_line_given_to_the_single_workload_says_what_to_use(tmp_path: Path) -> None:
    path = write(tmp_path, {"conversations": [{"from": "human", "value": "x"}]})
    with pytest.raises(DatasetError, match=r"c\.jsonl:1: .*--workload multi-turn"):
        load_dataset(path)
