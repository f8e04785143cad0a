"""Multi-turn conversations and shared system prompts, sans-IO: what each request sends."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.bench.body import CHARS_PER_TOKEN, RequestShape, completion_prompt
from narwhal.bench.conversation import (
    Conversation,
    ConversationCounts,
    Conversations,
    ConversationSpec,
    SecondsRange,
)
from narwhal.bench.runner import arrival_offsets
from narwhal.bench.shared_prefix import SharedPrefixWorkload, SystemPrompts, SystemPromptSpec
from narwhal.bench.transcripts import load_transcripts
from narwhal.bench.workload import LengthRange, PromptText

EXAMPLE = Path(__file__).parents[2] / "examples" / "conversations.jsonl"
CHAT = RequestShape("chat", "m", True, True, False, {})
COMPLETIONS = RequestShape("completions", "m", False, False, False, {"temperature": 0})


def spec(**changes: Any) -> ConversationSpec:
    fields: dict[str, Any] = {
        "turns": LengthRange(2, 6),
        "suffix_tokens": LengthRange(20, 80),
        "max_tokens": LengthRange(4, 32),
        "think_s": SecondsRange(0.0, 2.0),
        "seed": 7,
    }
    fields.update(changes)
    return ConversationSpec(**fields)


def prompts(count: int = 3, seed: int = 7, zipf: float | None = None) -> SystemPrompts:
    return SystemPrompts(SystemPromptSpec(count, LengthRange(500, 500), zipf), seed, text(seed))


def text(seed: int = 7) -> PromptText:
    return PromptText(seed, 2000)


def generated(
    shape: RequestShape = CHAT,
    seed: int = 7,
    prompts: SystemPrompts | None = None,
    **changes: Any,
) -> Conversations:
    return Conversations(spec(seed=seed, **changes), shape, prompts=prompts, text=text(seed))


def play(conversation: Conversation) -> list[dict[str, Any]]:
    """Every turn's body, answering turn k with the reply "reply k"."""
    bodies = []
    while not conversation.done:
        bodies.append(json.loads(conversation.next_request().body))
        conversation.received(f"reply {conversation.sent}")
    return bodies


def common_prefix(a: str, b: str) -> int:
    """How many leading characters `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_the_same_seed_makes_the_same_conversations() -> None:
    a, b, other = generated(seed=7), generated(seed=7), generated(seed=8)
    for number in range(20):
        assert a.script(number) == b.script(number)
        assert a.script(number) != other.script(number)
    first = [play(a.start(100)) for _ in range(10)]
    again = [play(b.start(100)) for _ in range(10)]
    assert first == again
    scripts = [a.script(n) for n in range(200)]
    assert {s.turns for s in scripts} == {2, 3, 4, 5, 6}  # drawn per conversation
    assert all(s.think_s[0] == 0.0 and all(0 <= t <= 2 for t in s.think_s) for s in scripts)
    assert all(4 <= m <= 32 for s in scripts for m in s.max_tokens)
    # Arrival times too: a seeded Poisson process per stage.
    times = list(itertools.islice(arrival_offsets(7, 0, 2.0), 50))
    assert times == list(itertools.islice(arrival_offsets(7, 0, 2.0), 50))
    assert times[0] == 0.0 and times == sorted(times)
    assert times != list(itertools.islice(arrival_offsets(8, 0, 2.0), 50))


def test_each_turn_sends_the_last_ones_messages_its_reply_and_a_new_message() -> None:
    conversation = generated(prompts=prompts()).start(100)
    bodies = play(conversation)
    assert len(bodies) == conversation.script.turns >= 2
    system = bodies[0]["messages"][0]
    assert system["role"] == "system"
    for k, body in enumerate(bodies[1:], start=2):
        before = bodies[k - 2]["messages"]
        messages = body["messages"]
        assert messages[: len(before)] == before
        reply, new = messages[len(before) :]
        assert reply == {"role": "assistant", "content": f"reply {k - 1}"}
        assert new["role"] == "user" and new["content"].startswith(
            f"{conversation.script.number}.{k}:"
        )
        assert body["max_tokens"] == conversation.script.max_tokens[k - 1]
    assert [len(b["messages"]) for b in bodies] == [2 * k for k in range(1, len(bodies) + 1)]
    assert bodies[0]["stream"] is True and bodies[0]["return_token_ids"] is True
    assert conversation.history == bodies[-1]["messages"] + [
        {"role": "assistant", "content": f"reply {len(bodies)}"}
    ]


def test_a_completions_turn_starts_with_the_last_prompt_and_its_reply() -> None:
    bodies = play(generated(COMPLETIONS, prompts=prompts()).start(100))
    for k in range(1, len(bodies)):
        before, prompt = bodies[k - 1]["prompt"], bodies[k]["prompt"]
        assert prompt.startswith(before + f"reply {k}\n")
        assert bodies[k]["temperature"] == 0 and "messages" not in bodies[k]


def test_user_messages_have_the_configured_length() -> None:
    fixed = generated(suffix_tokens=LengthRange(100, 100))
    for number in range(5):
        for exchange in fixed.script(number).transcript.exchanges:
            content = exchange.user["content"]
            assert abs(len(content) - 100 * CHARS_PER_TOKEN) <= 8


def test_unrelated_conversations_share_no_leading_64_characters() -> None:
    source = generated(turns=LengthRange(3, 3))
    texts = []
    for _ in range(300):
        conversation = source.start(100)
        play(conversation)
        texts.append(completion_prompt(conversation.history))
    texts.sort()  # the longest common prefix of any pair is that of two neighbours
    assert max(common_prefix(a, b) for a, b in itertools.pairwise(texts)) < 64


def test_conversations_share_their_system_prompt_and_nothing_more() -> None:
    shared = prompts(count=2)
    source = generated(prompts=shared)
    by_prompt: dict[int, list[str]] = {}
    for _ in range(100):
        conversation = source.start(100)
        first = json.loads(conversation.next_request().body)["messages"]
        assert first[0] == shared.message(conversation.script.system_prompt)
        by_prompt.setdefault(conversation.script.system_prompt, []).append(completion_prompt(first))
    assert sorted(by_prompt) == [0, 1]
    for index, texts in by_prompt.items():
        system = shared.texts[index]
        assert all(t.startswith(system + "\n") for t in texts)
        rests = sorted(t[len(system) :] for t in texts)
        assert max(common_prefix(a, b) for a, b in itertools.pairwise(rests)) < 64


def test_system_prompts_are_distinct_and_of_their_length() -> None:
    shared = SystemPrompts(SystemPromptSpec(8, LengthRange(2000, 2000), None), 3, text(3))
    assert len(set(shared.texts)) == 8
    assert all(abs(len(t) - 2000 * CHARS_PER_TOKEN) <= 8 for t in shared.texts)
    ordered = sorted(shared.texts)
    assert max(common_prefix(a, b) for a, b in itertools.pairwise(ordered)) < 64
    again = SystemPrompts(SystemPromptSpec(8, LengthRange(2000, 2000), None), 3, text(3))
    assert again.texts == shared.texts


def test_shared_prefix_requests_send_one_prompt_exactly_and_a_fresh_suffix() -> None:
    shared = prompts(count=4)
    workload = SharedPrefixWorkload(
        CHAT, shared, text(), LengthRange(64, 64), LengthRange(8, 8), seed=7
    )
    specs = [workload.next() for _ in range(400)]
    seen: dict[int, int] = {}
    suffixes = []
    for s in specs:
        system, user = json.loads(s.body)["messages"]
        assert system == {"role": "system", "content": shared.texts[s.system_prompt]}
        assert user["role"] == "user"
        suffixes.append(user["content"])
        seen[s.system_prompt] = seen.get(s.system_prompt, 0) + 1
        assert s.prompt_tokens == (len(system["content"]) + len(user["content"])) // 4
    assert sorted(seen) == [0, 1, 2, 3] and min(seen.values()) > 50  # uniform
    suffixes.sort()
    assert max(common_prefix(a, b) for a, b in itertools.pairwise(suffixes)) < 64
    again = SharedPrefixWorkload(
        CHAT, prompts(count=4), text(), LengthRange(64, 64), LengthRange(8, 8), seed=7
    )
    assert [again.next().body for _ in range(400)] == [s.body for s in specs]


def test_zipf_favours_the_first_prompts() -> None:
    shared = prompts(count=5, zipf=1.5)
    workload = SharedPrefixWorkload(
        COMPLETIONS, shared, text(), LengthRange(8, 8), LengthRange(1, 1), seed=1
    )
    counts = [0] * 5
    for _ in range(2000):
        spec_ = workload.next()
        counts[spec_.system_prompt] += 1
        assert json.loads(spec_.body)["prompt"].startswith(shared.texts[spec_.system_prompt] + "\n")
    assert counts == sorted(counts, reverse=True) and counts[0] > 2 * counts[2] > 0


def test_a_conversation_is_cut_to_the_requests_left() -> None:
    source = generated(turns=LengthRange(5, 5))
    assert source.start(3).script.turns == 3
    assert source.start(0).script.turns == 1
    whole = source.start(100)
    assert whole.script == source.script(2) and whole.script.turns == 5
    assert source.mean_turns == 5.0


def test_dataset_conversations_replay_user_turns_with_the_replies_received() -> None:
    transcripts = load_transcripts(EXAMPLE)
    source = Conversations(spec(), CHAT, transcripts=transcripts)
    assert source.mean_turns == (3 + 2 + 2 + 3) / 4
    played = {}
    for _ in range(4):
        conversation = source.start(100)
        line = transcripts.index(conversation.script.transcript)
        played[line] = play(conversation)
    assert sorted(played) == [0, 1, 2, 3]  # a seeded order, every line once per pass
    bike = played[0]
    file = transcripts[0]
    assert [m["role"] for m in bike[-1]["messages"]] == [
        "system", "user", "assistant", "user", "assistant", "user",
    ]  # fmt: skip
    assert bike[-1]["messages"][2] == {"role": "assistant", "content": "reply 1"}
    users = [e.user["content"] for e in file.exchanges]
    assert [b["messages"][-1]["content"] for b in bike] == users


def test_dataset_replies_send_the_files_own_assistant_messages() -> None:
    transcripts = load_transcripts(EXAMPLE)
    source = Conversations(spec(dataset_replies=True), CHAT, transcripts=transcripts)
    unix = transcripts[3]
    for _ in range(4):
        conversation = source.start(100)
        if conversation.script.transcript == unix:
            break
    bodies = play(conversation)
    messages = bodies[-1]["messages"]
    assert [m["content"] for m in messages if m["role"] == "assistant"] == ["ls -lS", "ls -lSr"]
    assert messages[0] == {"role": "system", "content": "Answer as a terse unix manual page would."}


def test_dataset_conversations_with_a_shared_system_prompt_first() -> None:
    transcripts = load_transcripts(EXAMPLE)
    shared = prompts(count=1)
    source = Conversations(spec(), CHAT, prompts=shared, transcripts=transcripts)
    for _ in range(4):
        first = json.loads(source.start(100).next_request().body)["messages"]
        assert first[0] == shared.message(0)


def test_conversation_counts() -> None:
    counts = ConversationCounts(started=4)
    for ending in ("completed", "failed", "unreadable", "cut"):
        counts.add(ending)
    assert counts == ConversationCounts(4, 1, 1, 1, 1)


@pytest.mark.parametrize("bad", ["", "x", "-1", "2:1", "1:x", "nan", "inf"])
def test_seconds_range_refuses(bad: str) -> None:
    with pytest.raises(ValueError):
        SecondsRange.parse(bad)


def test_seconds_range() -> None:
    assert SecondsRange.parse("0.5") == SecondsRange(0.5, 0.5)
    assert SecondsRange.parse("0:2") == SecondsRange(0.0, 2.0)
