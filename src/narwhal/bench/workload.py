"""What each request asks for (`--workload single`): prompt, output length, encoded body.

The workloads with shared prefixes live in `shared_prefix` (a few long system
prompts, short suffixes) and `conversation` (multi-turn); this module also holds
what they share: lengths, the prompt text and the JSONL reader.

Everything is deterministic from `--seed` and the request's position in the
run (warm-up requests take the first positions), so two runs with the same
flags send the same bodies in the same order.

Prompts of N tokens are plain common words, about four characters per token,
sliced from a text generated once from the seed. Each prompt starts at a
different word and with its position number, so no two prompts share a
prefix an engine's prefix cache could reuse. Dataset entries are used in a
seeded shuffled order, cycling when the run needs more requests than lines.
"""

from __future__ import annotations

import bisect
import random
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from narwhal.bench.body import CHARS_PER_TOKEN, RequestShape, message_texts

_WORD_TEXT = (
    "the of and to in is it you that he was for on are with as his they be at one have "
    "this from or had by hot word but what some we can out other were all there when up "
    "use your how said an each she which do their time if will way about many then them "
    "write would like so these her long make thing see him two has look more day could go "
    "come did number sound no most people my over know water than call first who may down "
    "side been now find any new work part take get place made live where after back little "
    "only round man year came show every good me give our under name very through just form "
    "great think say help low line turn cause much mean before move right boy old too same "
    "tell does set three want air well also play small end put home read hand port large "
    "spell add even land here must big high such follow act why ask men change went light "
    "kind off need house try us again animal point mother world near build self earth father"
)
_WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True, slots=True)
class LengthRange:
    """A fixed token count (`low == high`) or a uniform integer range, inclusive."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str) -> LengthRange:
        """`N` or `A:B` with 0 <= A <= B."""
        low_text, sep, high_text = text.partition(":")
        try:
            low = int(low_text)
            high = int(high_text) if sep else low
        except ValueError:
            raise ValueError(f"expected N or A:B, got {text!r}") from None
        if low < 0 or high < low:
            raise ValueError(f"expected 0 <= A <= B, got {text!r}")
        return cls(low, high)

    def draw(self, rng: random.Random) -> int:
        return self.low if self.low == self.high else rng.randint(self.low, self.high)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    body: bytes
    prompt_tokens: int
    max_tokens: int
    system_prompt: int = -1  # which shared system prompt it starts with; -1 for none


class RequestSource(Protocol):
    """Independent requests, in order (`Workload`, `SharedPrefixWorkload`)."""

    def next(self) -> RequestSpec: ...


class PromptText:
    """Deterministic plain-word text to cut prompts of about N tokens from."""

    def __init__(self, seed: int, max_tokens: int) -> None:
        rng = random.Random(seed)
        needed = max(2 * CHARS_PER_TOKEN * max_tokens + 64, 1 << 16)
        words: list[str] = []
        starts = array("q")
        pos = 0
        while pos < needed:
            word = rng.choice(_WORDS)
            starts.append(pos)
            words.append(word)
            pos += len(word) + 1
        self._text = " ".join(words)
        self._starts = starts
        # Any start in the first half leaves room for the longest prompt.
        self._choices = max(1, len(starts) // 2)

    def take(self, key: int, tokens: int, label: str | None = None) -> str:
        """About `tokens` tokens of text placed by `key`, starting with `label` (default
        `key` and a colon).

        Distinct labels that end with the colon and hold none before it make texts that
        differ within their first characters (neither label is a prefix of the other),
        so no two of them share a prefix block in an engine's cache.
        """
        if tokens <= 0:
            return ""
        head = f"{key}:" if label is None else label
        chars = max(0, tokens * CHARS_PER_TOKEN - len(head) - 1)
        first = (key * 0x9E3779B1) % self._choices
        begin = self._starts[first]
        last = bisect.bisect_left(self._starts, begin + chars)
        end = self._starts[last] - 1 if last < len(self._starts) else len(self._text)
        return f"{head} {self._text[begin:end]}" if end > begin else head


@dataclass(frozen=True, slots=True)
class DatasetItem:
    """One line of a `--dataset` file."""

    prompt: str | None
    messages: list[Any] | None
    max_tokens: int | None
    fields: dict[str, Any] = field(default_factory=dict)  # any other keys, sent as they are

    def text_length(self) -> int:
        if self.prompt is not None:
            return len(self.prompt)
        return sum(len(c) for c in message_texts(self.messages or []))


class DatasetError(ValueError):
    pass


def read_jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each non-blank line's object with where it is (`FILE:LINE`), for error messages."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise DatasetError(f"{path}: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = msgspec.json.decode(line)
        except msgspec.DecodeError as exc:
            raise DatasetError(f"{where}: {exc}") from None
        if not isinstance(obj, dict):
            raise DatasetError(f"{where}: expected a JSON object")
        yield where, obj


def load_dataset(path: Path) -> list[DatasetItem]:
    """Parse a JSONL file of {"prompt": str | "messages": [...], "max_tokens": int, ...}."""
    items: list[DatasetItem] = []
    for where, obj in read_jsonl(path):
        if "conversations" in obj:
            raise DatasetError(
                f"{where}: a ShareGPT conversation; replay it with --workload multi-turn"
            )
        prompt = obj.pop("prompt", None)
        messages = obj.pop("messages", None)
        max_tokens = obj.pop("max_tokens", None)
        if (prompt is None) == (messages is None):
            raise DatasetError(f"{where}: expected exactly one of 'prompt' and 'messages'")
        if prompt is not None and not isinstance(prompt, str):
            raise DatasetError(f"{where}: 'prompt' must be a string")
        if messages is not None and not (isinstance(messages, list) and messages):
            raise DatasetError(f"{where}: 'messages' must be a non-empty list")
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0
        ):
            raise DatasetError(f"{where}: 'max_tokens' must be a non-negative integer")
        items.append(DatasetItem(prompt, messages, max_tokens, obj))
    if not items:
        raise DatasetError(f"{path}: no requests in the file")
    return items


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """The request-shaping flags."""

    endpoint: str  # "chat" | "completions"
    model: str
    stream: bool
    token_ids: bool
    ignore_eos: bool
    extra: dict[str, Any]
    prompt_tokens: LengthRange
    max_tokens: LengthRange
    seed: int
    dataset: list[DatasetItem] | None = None

    @property
    def shape(self) -> RequestShape:
        return RequestShape(
            self.endpoint, self.model, self.stream, self.token_ids, self.ignore_eos, self.extra
        )


class Workload:
    """Yields the run's requests in order; `next()` is cheap enough for the hot path."""

    def __init__(self, spec: WorkloadSpec) -> None:
        self._spec = spec
        self._chat = spec.endpoint == "chat"
        self._rng = random.Random(spec.seed)
        self._count = 0
        self._base = spec.shape.base()
        self._dataset = spec.dataset
        self._text: PromptText | None = None
        if spec.dataset is not None:
            self._order = list(range(len(spec.dataset)))
            random.Random(spec.seed).shuffle(self._order)
        else:
            self._text = PromptText(spec.seed, spec.prompt_tokens.high)

    def next(self) -> RequestSpec:
        key = self._count
        self._count += 1
        body = dict(self._base)
        if self._dataset is not None:
            item = self._dataset[self._order[key % len(self._order)]]
            prompt_tokens = item.text_length() // CHARS_PER_TOKEN
            max_tokens = item.max_tokens
            if max_tokens is None:
                max_tokens = self._spec.max_tokens.draw(self._rng)
            self._set_prompt(body, item.prompt, item.messages)
            body.update(item.fields)
        else:
            assert self._text is not None
            prompt_tokens = self._spec.prompt_tokens.draw(self._rng)
            max_tokens = self._spec.max_tokens.draw(self._rng)
            self._set_prompt(body, self._text.take(key, prompt_tokens), None)
        body["max_tokens"] = max_tokens
        body.update(self._spec.extra)
        return RequestSpec(msgspec.json.encode(body), prompt_tokens, max_tokens)

    def _set_prompt(self, body: dict[str, Any], prompt: str | None, messages: Any) -> None:
        if self._chat:
            body["messages"] = (
                messages if messages is not None else [{"role": "user", "content": prompt}]
            )
        else:
            body["prompt"] = prompt if prompt is not None else "\n".join(message_texts(messages))
