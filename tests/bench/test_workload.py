"""Request generation: lengths, prompts, dataset, bodies; all deterministic from the seed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.bench.workload import (
    CHARS_PER_TOKEN,
    DatasetError,
    LengthRange,
    PromptText,
    Workload,
    WorkloadSpec,
    load_dataset,
)


def spec(**changes: Any) -> WorkloadSpec:
    fields: dict[str, Any] = {
        "endpoint": "chat",
        "model": "m",
        "stream": True,
        "token_ids": True,
        "ignore_eos": False,
        "extra": {},
        "prompt_tokens": LengthRange(100, 100),
        "max_tokens": LengthRange(16, 16),
        "seed": 0,
    }
    fields.update(changes)
    return WorkloadSpec(**fields)


def bodies(workload: Workload, n: int) -> list[dict[str, Any]]:
    return [json.loads(workload.next().body) for _ in range(n)]


def test_length_range_parse() -> None:
    assert LengthRange.parse("64") == LengthRange(64, 64)
    assert LengthRange.parse("100:400") == LengthRange(100, 400)
    for bad in ("", "x", "5:2", "-1", "1:2:3"):
        with pytest.raises(ValueError):
            LengthRange.parse(bad)


def test_prompt_text_length_and_determinism() -> None:
    text = PromptText(seed=1, max_tokens=2000)
    for tokens in (1, 10, 128, 2000):
        prompt = text.take(7, tokens)
        assert abs(len(prompt) - tokens * CHARS_PER_TOKEN) <= 8, tokens
    assert text.take(3, 128) == PromptText(seed=1, max_tokens=2000).take(3, 128)
    assert text.take(3, 128) != text.take(4, 128)
    assert text.take(3, 128) != PromptText(seed=2, max_tokens=2000).take(3, 128)
    assert text.take(0, 0) == ""
    assert text.take(5, 64).replace(" ", "").replace(":", "").isalnum()


def test_chat_bodies() -> None:
    first, second = bodies(Workload(spec(ignore_eos=True, extra={"temperature": 0.5})), 2)
    assert first["model"] == "m" and first["stream"] is True
    assert first["stream_options"] == {"include_usage": True}
    assert first["return_token_ids"] is True and first["ignore_eos"] is True
    assert first["max_tokens"] == 16 and first["temperature"] == 0.5
    assert first["messages"][0]["role"] == "user"
    assert first["messages"][0]["content"] != second["messages"][0]["content"]


def test_completions_no_stream_no_ids_and_extra_overrides() -> None:
    (body,) = bodies(
        Workload(
            spec(endpoint="completions", stream=False, token_ids=False, extra={"max_tokens": 3})
        ),
        1,
    )
    assert isinstance(body["prompt"], str)
    assert "stream_options" not in body and "return_token_ids" not in body
    assert "ignore_eos" not in body and body["stream"] is False
    assert body["max_tokens"] == 3  # --extra is merged last


def test_uniform_ranges_are_seeded() -> None:
    ranged = spec(prompt_tokens=LengthRange(10, 40), max_tokens=LengthRange(1, 8))
    a = [Workload(ranged).next() for _ in range(1)]
    wa, wb = Workload(ranged), Workload(ranged)
    specs_a = [wa.next() for _ in range(50)]
    specs_b = [wb.next() for _ in range(50)]
    assert [s.body for s in specs_a] == [s.body for s in specs_b]
    assert a[0].body == specs_a[0].body
    assert all(10 <= s.prompt_tokens <= 40 and 1 <= s.max_tokens <= 8 for s in specs_a)
    assert len({s.max_tokens for s in specs_a}) > 3


def test_dataset_lines(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(
        '{"prompt": "abcdefgh", "max_tokens": 5}\n'
        "\n"
        '{"messages": [{"role": "user", "content": "hello"}], "temperature": 0}\n'
    )
    items = load_dataset(path)
    assert len(items) == 2
    workload = Workload(spec(dataset=items))
    got = bodies(workload, 4)
    prompts = sorted(json.dumps(b["messages"]) for b in got[:2])
    assert prompts == sorted(
        json.dumps(m)
        for m in ([{"role": "user", "content": "abcdefgh"}], [{"role": "user", "content": "hello"}])
    )
    assert got[2:] == got[:2]  # cycles in the same order
    by_prompt = {b["messages"][0]["content"]: b for b in got}
    assert by_prompt["abcdefgh"]["max_tokens"] == 5
    assert by_prompt["hello"]["max_tokens"] == 16 and by_prompt["hello"]["temperature"] == 0
    (completion,) = bodies(Workload(spec(endpoint="completions", dataset=items[1:])), 1)
    assert completion["prompt"] == "hello"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "d.jsonl:1"),
        ("[1]", "expected a JSON object"),
        ('{"max_tokens": 3}', "exactly one of"),
        ('{"prompt": "a", "messages": [{"content": "b"}]}', "exactly one of"),
        ('{"prompt": 5}', "'prompt' must be a string"),
        ('{"messages": []}', "non-empty list"),
        ('{"prompt": "a", "max_tokens": -1}', "non-negative"),
    ],
)
def test_dataset_errors_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(DatasetError, match=message):
        load_dataset(path)


def test_dataset_missing_or_empty(tmp_path: Path) -> None:
    with pytest.raises(DatasetError):
        load_dataset(tmp_path / "missing.jsonl")
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(DatasetError, match="no requests"):
        load_dataset(tmp_path / "e.jsonl")
