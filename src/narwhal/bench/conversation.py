"""Multi-turn conversations (`--workload multi-turn`): every turn sends the whole history.

A conversation is a `Script`, played by a `Conversation` (sans-IO). Turn 1 sends
the opening (a shared system prompt, with `--system-prompts`, then a dataset
line's own system messages) and user message 1; turn k sends everything turn
k-1 sent, the reply it received, and user message k. The reply is the text the
server answered (see `reply`), so turn k's prompt starts with exactly the tokens
turn k-1's engine computed and may hold in its prefix cache. With
`--dataset-replies` the dataset's own assistant messages stand in for the
replies instead: every run then sends the same prompts, whatever the engines
answer, but an engine's cache holds its own reply, not the file's, so only the
prefix up to the previous user message can be reused.

Scripts are made from the seed: conversation N's number of turns, user messages,
output lengths, system prompt and pauses come from a generator seeded by
(`--seed`, N) alone, so neither timing nor replies change them. Conversations are
numbered in the order they start, warm-up first, continuing across the stages of
a sweep. A generated user message starts with "N.K:" (conversation N, turn K)
and at a word picked by both, so no two conversations share a prefix past their
system prompt: an engine's cache hits only where the workload means it to.
From a dataset, conversation N replays line `order[N % lines]` of a seeded
shuffle (cycling when the run needs more conversations than lines: a repeated
line sends the same prefix again).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any

from narwhal.bench.body import RequestShape, estimated_tokens
from narwhal.bench.shared_prefix import SystemPrompts
from narwhal.bench.transcripts import Exchange, Transcript
from narwhal.bench.workload import LengthRange, PromptText, RequestSpec

# How a conversation ends. One whose turn fails ends there: its next turn would have to
# send a reply that never came, and an invented one is a prefix no engine computed.
COMPLETED = "completed"  # every turn was answered
FAILED = "failed"  # a turn failed: any error, a refusal or rejection (429) included
UNREADABLE = "unreadable"  # a turn succeeded but its reply's text could not be read
CUT = "cut"  # the stage ended, or was interrupted, before its next turn


@dataclass(frozen=True, slots=True)
class SecondsRange:
    """A fixed duration (`low == high`) or a uniform range, in seconds."""

    low: float
    high: float

    @classmethod
    def parse(cls, text: str) -> SecondsRange:
        """`S` or `A:B` with 0 <= A <= B."""
        low_text, sep, high_text = text.partition(":")
        try:
            low = float(low_text)
            high = float(high_text) if sep else low
        except ValueError:
            raise ValueError(f"expected S or A:B seconds, got {text!r}") from None
        if not (math.isfinite(low) and math.isfinite(high)) or low < 0 or high < low:
            raise ValueError(f"expected 0 <= A <= B seconds, got {text!r}")
        return cls(low, high)

    def draw(self, rng: random.Random) -> float:
        return self.low if self.low == self.high else rng.uniform(self.low, self.high)


@dataclass(frozen=True, slots=True)
class ConversationSpec:
    """The conversation flags."""

    turns: LengthRange  # generated conversations; a dataset line has its own
    suffix_tokens: LengthRange  # each generated user message
    max_tokens: LengthRange  # each turn
    think_s: SecondsRange  # the pause between a reply's end and the next turn
    seed: int
    dataset_replies: bool = False


@dataclass(frozen=True, slots=True)
class Script:
    """Everything one conversation will send, bar the replies."""

    number: int
    transcript: Transcript
    max_tokens: tuple[int, ...]  # per turn
    think_s: tuple[float, ...]  # before each turn; 0 before the first
    system_prompt: int = -1  # which shared system prompt opens it; -1 for none

    @property
    def turns(self) -> int:
        return len(self.transcript.exchanges)

    def truncated(self, turns: int) -> Script:
        """Its first `turns` turns (a stage's last conversation, cut to fit its -n)."""
        if turns >= self.turns:
            return self
        kept = replace(self.transcript, exchanges=self.transcript.exchanges[:turns])
        return replace(
            self, transcript=kept, max_tokens=self.max_tokens[:turns], think_s=self.think_s[:turns]
        )


class Conversation:
    """One conversation in progress: the history so far and which turn is next."""

    def __init__(self, script: Script, shape: RequestShape, *, dataset_replies: bool) -> None:
        self.script = script
        self.shape = shape
        self._dataset_replies = dataset_replies
        self._history: list[dict[str, Any]] = list(script.transcript.opening)
        self.sent = 0  # turns sent so far; the last one sent is turn `sent`

    @property
    def done(self) -> bool:
        return self.sent >= self.script.turns

    @property
    def pause_s(self) -> float:
        """How long to wait, after the last reply, before the next turn."""
        return self.script.think_s[self.sent]

    @property
    def history(self) -> list[dict[str, Any]]:
        """The messages sent so far, with the replies received (a copy)."""
        return list(self._history)

    def next_request(self) -> RequestSpec:
        """The next turn's request: the history and its user message."""
        exchange = self.script.transcript.exchanges[self.sent]
        self._history.append(exchange.user)
        max_tokens = self.script.max_tokens[self.sent]
        self.sent += 1
        body = self.shape.encode(self._history, max_tokens)
        tokens = estimated_tokens(self._history)
        return RequestSpec(body, tokens, max_tokens, self.script.system_prompt)

    def received(self, reply: str) -> None:
        """The last turn's reply arrived: the next turn sends it back (or the file's own)."""
        after = self.script.transcript.exchanges[self.sent - 1].after
        if self._dataset_replies:
            self._history.extend(after)
            return
        self._history.append({"role": "assistant", "content": reply})
        # What else the file has between two user messages (a system note) stays.
        self._history.extend(m for m in after if m.get("role") != "assistant")


class Conversations:
    """Makes the run's conversations, numbered in the order they start."""

    def __init__(
        self,
        spec: ConversationSpec,
        shape: RequestShape,
        *,
        prompts: SystemPrompts | None = None,
        text: PromptText | None = None,
        transcripts: list[Transcript] | None = None,
    ) -> None:
        if (text is None) == (transcripts is None):
            raise ValueError("conversations come from generated text or a dataset, one of them")
        self._spec = spec
        self.shape = shape
        self._prompts = prompts
        self._text = text
        self._transcripts = transcripts
        self._order: list[int] = []
        if transcripts is not None:
            self._order = list(range(len(transcripts)))
            random.Random(spec.seed).shuffle(self._order)
        self._count = 0

    @property
    def mean_turns(self) -> float:
        """Turns per conversation on average (what turns a request rate into arrivals)."""
        if self._transcripts is not None:
            return sum(len(t.exchanges) for t in self._transcripts) / len(self._transcripts)
        return (self._spec.turns.low + self._spec.turns.high) / 2

    def script(self, number: int) -> Script:
        """Conversation `number`'s script: the same for the same seed and number."""
        spec = self._spec
        rng = random.Random(f"{spec.seed}:conversation:{number}")
        system = -1 if self._prompts is None else self._prompts.pick(rng)
        if self._transcripts is not None:
            transcript = self._transcripts[self._order[number % len(self._order)]]
        else:
            transcript = self._generated(number, spec.turns.draw(rng), rng)
        if self._prompts is not None:
            opening = (self._prompts.message(system), *transcript.opening)
            transcript = replace(transcript, opening=opening)
        turns = len(transcript.exchanges)
        max_tokens = tuple(spec.max_tokens.draw(rng) for _ in range(turns))
        think_s = (0.0, *(spec.think_s.draw(rng) for _ in range(turns - 1)))
        return Script(number, transcript, max_tokens, think_s, system)

    def _generated(self, number: int, turns: int, rng: random.Random) -> Transcript:
        assert self._text is not None
        exchanges = []
        for turn in range(1, turns + 1):
            tokens = self._spec.suffix_tokens.draw(rng)
            text = self._text.take(number * 1_000_003 + turn, tokens, label=f"{number}.{turn}:")
            exchanges.append(Exchange({"role": "user", "content": text}))
        return Transcript((), tuple(exchanges))

    def start(self, max_turns: int) -> Conversation:
        """The next conversation, with at most `max_turns` turns (at least one)."""
        number = self._count
        self._count += 1
        script = self.script(number).truncated(max(1, max_turns))
        return Conversation(script, self.shape, dataset_replies=self._spec.dataset_replies)


@dataclass(slots=True)
class ConversationCounts:
    """How a stage's conversations ended."""

    started: int = 0
    completed: int = 0
    failed: int = 0
    unreadable: int = 0
    cut: int = 0

    def add(self, ending: str) -> None:
        if ending == COMPLETED:
            self.completed += 1
        elif ending == FAILED:
            self.failed += 1
        elif ending == UNREADABLE:
            self.unreadable += 1
        else:
            self.cut += 1
