"""A deterministic tokenizer shared by the simulator and the router's prompt sizing.

It is not any real model's tokenizer. It exists so that `narwhal sim` and the router
agree exactly on token counts without a `tokenizer.json`, and so that sizing a prompt
costs one regular-expression pass (thousands of prompts per second).

Text is cut into *units* by one regular expression, each unit one token:

    " ?[A-Za-z][a-z]{0,4}"   an optional space, a letter, up to four lower-case letters
    " ?[0-9]{1,3}"            an optional space and up to three digits
    " ?[!-/:-@[-`{-~]{1,2}"   an optional space and one or two ASCII punctuation marks
    "\n{1,4}"                 a run of up to four newlines
    "."                       any other single character (other whitespace, non-ASCII)

English prose comes out at roughly 3.5-4 characters per token, markdown nearer 3.
Every unit maps to its id arithmetically (no table, no Python `hash()`), so the
mapping is the same in every process and every run, and `decode(encode(text)) == text`
for any text. A few ids at
the bottom are special tokens (chat template markers, BOS, EOS); they decode to their
marker text, which does not encode back to the same id.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final

SPECIAL_TOKENS: Final = (
    "<|pad|>",
    "<|bos|>",
    "<|eos|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
)
PAD_ID: Final = 0
BOS_ID: Final = 1
EOS_ID: Final = 2
IM_START_ID: Final = 3
IM_END_ID: Final = 4
THINK_START_ID: Final = 5
THINK_END_ID: Final = 6
TOOL_CALL_START_ID: Final = 7
TOOL_CALL_END_ID: Final = 8
_SPECIAL_SPAN: Final = 16  # room for more markers without moving any other id

_PUNCTUATION: Final = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
_UNIT_RE: Final = re.compile(
    r" ?[A-Za-z][a-z]{0,4}| ?[0-9]{1,3}| ?[!-/:-@\[-`{-~]{1,2}|\n{1,4}|.", re.DOTALL
)

# Letter units: (space?, first letter of 52, 0-4 trailing lower-case letters).
_REST_OFFSETS: Final = (0, 1, 27, 703, 18279)  # units with fewer trailing letters come first
_REST_SPAN: Final = 475255  # 1 + 26 + 26**2 + 26**3 + 26**4
_LETTER_BASE: Final = _SPECIAL_SPAN
_LETTER_SPAN: Final = 2 * 52 * _REST_SPAN
# Digit units: (space?, 1-3 digits); "7", "07" and "007" are different units.
_DIGIT_OFFSETS: Final = (0, 10, 110)
_DIGIT_HALF: Final = 1110
_DIGIT_BASE: Final = _LETTER_BASE + _LETTER_SPAN
_DIGIT_SPAN: Final = 2 * _DIGIT_HALF
# Punctuation units: (space?, one or two of the 32 ASCII marks).
_PUNCT_INDEX: Final = {ch: i for i, ch in enumerate(_PUNCTUATION)}
_PUNCT_HALF: Final = 32 + 32 * 32
_PUNCT_BASE: Final = _DIGIT_BASE + _DIGIT_SPAN
_PUNCT_SPAN: Final = 2 * _PUNCT_HALF
# Newline runs of length 1-4.
_NEWLINE_BASE: Final = _PUNCT_BASE + _PUNCT_SPAN
_NEWLINE_SPAN: Final = 4
# Everything else: one token per code point.
_CHAR_BASE: Final = _NEWLINE_BASE + _NEWLINE_SPAN
_CHAR_SPAN: Final = 0x110000

VOCAB_SIZE: Final = _CHAR_BASE + _CHAR_SPAN
_CACHE_LIMIT: Final = 1 << 17


def _letter_index(ch: str) -> int:
    code = ord(ch)
    return code - 97 if code >= 97 else 26 + code - 65


def _unit_id(unit: str) -> int:
    """The id of one unit as cut by `_UNIT_RE`."""
    spaced = len(unit) > 1 and unit[0] == " "
    body = unit[1:] if spaced else unit
    head = body[0]
    if "a" <= head <= "z" or "A" <= head <= "Z":
        rest = 0
        for ch in body[1:]:
            rest = rest * 26 + ord(ch) - 97
        rest += _REST_OFFSETS[len(body) - 1]
        return _LETTER_BASE + ((52 if spaced else 0) + _letter_index(head)) * _REST_SPAN + rest
    if "0" <= head <= "9":
        return (
            _DIGIT_BASE + (_DIGIT_HALF if spaced else 0) + _DIGIT_OFFSETS[len(body) - 1] + int(body)
        )
    if head in _PUNCT_INDEX:
        index = _PUNCT_INDEX[head]
        if len(body) == 2:
            index = 32 + 32 * index + _PUNCT_INDEX[body[1]]
        return _PUNCT_BASE + (_PUNCT_HALF if spaced else 0) + index
    if head == "\n":
        return _NEWLINE_BASE + len(unit) - 1
    return _CHAR_BASE + ord(unit)


def _unit_text(token_id: int) -> str:
    """The text of one id; special tokens give their marker."""
    if token_id < 0 or token_id >= VOCAB_SIZE:
        raise ValueError(f"token id {token_id} is outside the vocabulary")
    if token_id < _LETTER_BASE:
        return SPECIAL_TOKENS[token_id] if token_id < len(SPECIAL_TOKENS) else ""
    if token_id < _DIGIT_BASE:
        index, rest = divmod(token_id - _LETTER_BASE, _REST_SPAN)
        spaced, head = divmod(index, 52)
        first = chr(97 + head) if head < 26 else chr(65 + head - 26)
        length = sum(1 for offset in _REST_OFFSETS[1:] if rest >= offset)
        value = rest - _REST_OFFSETS[length]
        tail = ""
        for _ in range(length):
            value, letter = divmod(value, 26)
            tail = chr(97 + letter) + tail
        return (" " if spaced else "") + first + tail
    if token_id < _PUNCT_BASE:
        spaced, value = divmod(token_id - _DIGIT_BASE, _DIGIT_HALF)
        width = 3 if value >= 110 else 2 if value >= 10 else 1
        digits = str(value - _DIGIT_OFFSETS[width - 1]).zfill(width)
        return (" " if spaced else "") + digits
    if token_id < _NEWLINE_BASE:
        spaced, index = divmod(token_id - _PUNCT_BASE, _PUNCT_HALF)
        marks = _PUNCTUATION[index] if index < 32 else _PUNCTUATION[(index - 32) // 32]
        if index >= 32:
            marks += _PUNCTUATION[(index - 32) % 32]
        return (" " if spaced else "") + marks
    if token_id < _CHAR_BASE:
        return "\n" * (token_id - _NEWLINE_BASE + 1)
    return chr(token_id - _CHAR_BASE)


class _IdCache(dict[str, int]):
    """unit → id; misses are computed. Bounded so adversarial text cannot grow it forever."""

    def __missing__(self, unit: str) -> int:
        token_id = _unit_id(unit)
        if len(self) < _CACHE_LIMIT:
            self[unit] = token_id
        return token_id


class _TextCache(dict[int, str]):
    def __missing__(self, token_id: int) -> str:
        text = _unit_text(token_id)
        if len(self) < _CACHE_LIMIT:
            self[token_id] = text
        return text


def _content_text(content: object) -> str:
    """A chat message's text: a string, a list of text parts (others ignored), or None."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts: list[str] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type", "text") == "text":
                text = part.get("text")
                if isinstance(text, str):
                    texts.append(text)
        return "".join(texts)
    return ""


class SimTokenizer:
    """Encode, decode and count with the unit grammar described in the module docstring."""

    vocab_size: int = VOCAB_SIZE
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def __init__(self) -> None:
        self._ids = _IdCache()
        self._texts = _TextCache()
        self._findall = _UNIT_RE.findall

    def encode(self, text: str) -> list[int]:
        return list(map(self._ids.__getitem__, self._findall(text)))

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(map(self._texts.__getitem__, ids))

    def token_text(self, token_id: int) -> str:
        """The text of a single id (a special token gives its marker)."""
        return self._texts[token_id]

    def count(self, text: str) -> int:
        return len(self._findall(text))

    def chat_prompt_ids(self, messages: Sequence[Mapping[str, object]]) -> list[int]:
        """A fixed ChatML-like template, ending with the assistant generation prompt:

        `<|im_start|>` role "\\n" content `<|im_end|>` per message, then
        `<|im_start|>assistant\\n`.
        """
        ids: list[int] = []
        for message in messages:
            role = message.get("role")
            ids.append(IM_START_ID)
            ids += self.encode((role if isinstance(role, str) else "user") + "\n")
            ids += self.encode(_content_text(message.get("content")))
            ids.append(IM_END_ID)
        ids.append(IM_START_ID)
        ids += self.encode("assistant\n")
        return ids

    def chat_prompt_count(self, messages: Sequence[Mapping[str, object]]) -> int:
        """== len(chat_prompt_ids(messages)), without building the list."""
        fixed, texts = chat_prompt_parts(messages)
        return fixed + sum(self.count(text) for text in texts)

    def completion_prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        """BOS then the text's ids; a sequence of ints is taken as ids as they are."""
        if isinstance(prompt, str):
            return [BOS_ID, *self.encode(prompt)]
        return list(prompt)


def chat_prompt_parts(messages: Sequence[Mapping[str, object]]) -> tuple[int, list[str]]:
    """The chat template as (its special tokens, the texts to encode): the prompt's token
    count is the first plus the counts of the others (`SimTokenizer.chat_prompt_ids`)."""
    texts = ["assistant\n"]
    for message in messages:
        role = message.get("role")
        texts.append((role if isinstance(role, str) else "user") + "\n")
        texts.append(_content_text(message.get("content")))
    return 1 + 2 * len(messages), texts


def split_at_spaces(text: str, size: int) -> list[str]:
    """`text` in pieces of about `size` characters whose token counts add up to its own.

    Every piece but the first starts with a space: a space only ever starts a unit (see
    the unit table above), so a cut just before one never joins or splits a unit. Text
    with no space in a stretch stays in one piece.
    """
    pieces: list[str] = []
    start = 0
    while len(text) - start > size:
        cut = text.find(" ", start + size)
        if cut < 0:
            break
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def message_text(content: object) -> str:
    """The text the template sees for one message's `content` (exported for the sim)."""
    return _content_text(content)
