"""Prompt sizing in the router's own process: a configured tokenizer.json, or the text estimate.

By default the simulator's deterministic tokenizer (shared with `narwhal sim`, so the
router's sizing of simulated traffic is exact). With `tokenizer:` set to a tokenizer.json,
the Hugging Face `tokenizers` package (the optional extra: `pip install '.[tokenizers]'`)
sizes prompts as the real model does; chat prompts then count each message's text plus a small
per-message allowance for the chat template.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from narwhal.config import ConfigError
from narwhal.protocol.requests import CompletionRequest
from narwhal.protocol.tokenizer import SimTokenizer, chat_prompt_parts, split_at_spaces

_TEMPLATE_TOKENS_PER_MESSAGE = 4
# Tokenized between two yields to the event loop: about a millisecond of work.
_PIECE_CHARS = 16 * 1024


class PromptSizer:
    def __init__(self, count_text: Callable[[str], int] | None = None) -> None:
        self._sim = SimTokenizer()
        self._count_text = count_text

    @property
    def exact(self) -> bool:
        """Whether counts come from the model's own tokenizer (a configured tokenizer.json)."""
        return self._count_text is not None

    @property
    def text_counter(self) -> Callable[[str], int] | None:
        """A text's count by the configured tokenizer.json; None without one."""
        return self._count_text

    def count_text(self, text: str) -> int:
        """One text's count, as a prompt of it alone would be counted (no template)."""
        return self._count(text)

    def __call__(self, request: CompletionRequest) -> int:
        fixed, texts = self._parts(request)
        count = self._count
        return fixed + sum(count(text) for text in texts)

    async def size_long(self, request: CompletionRequest) -> int:
        """The same count, for long prompts, yielding to the event loop between pieces.

        The tokenizers run in C without releasing the GIL, so neither a plain call nor a
        worker thread would let other streams move while a megabyte is tokenized.
        """
        fixed, texts = self._parts(request)
        total = fixed
        for text in texts:
            for piece in split_at_spaces(text, _PIECE_CHARS):
                total += self._count(piece)
                await asyncio.sleep(0)
        return total

    def _count(self, text: str) -> int:
        return self._sim.count(text) if self._count_text is None else self._count_text(text)

    def _parts(self, request: CompletionRequest) -> tuple[int, list[str]]:
        """(tokens counted without encoding, texts to encode), whichever tokenizer."""
        body = request.body
        if request.route == "chat":
            messages: Sequence[Mapping[str, Any]] = body["messages"]
            if self._count_text is None:
                return chat_prompt_parts(messages)
            return _TEMPLATE_TOKENS_PER_MESSAGE * len(messages), [
                _message_text(m) for m in messages
            ]
        prompt = body["prompt"]
        bos = 1 if self._count_text is None else 0
        if isinstance(prompt, str):
            return bos, [prompt]
        if prompt and isinstance(prompt[0], int):
            return len(prompt), []
        fixed = sum(len(p) if isinstance(p, list) else bos for p in prompt)
        return fixed, [p for p in prompt if isinstance(p, str)]


def token_id_count(request: CompletionRequest) -> int | None:
    """The exact count of a completion prompt given as token IDs (a list of IDs, or a list of
    such lists), which no tokenizer is needed for; None for any prompt with text in it."""
    if request.route != "completion":
        return None
    prompt = request.body["prompt"]
    if isinstance(prompt, str):
        return None
    # parse_request has checked the shapes: all IDs, or each item a string or an ID list.
    if isinstance(prompt[0], int):
        return len(prompt)
    if all(isinstance(p, list) for p in prompt):
        return sum(len(p) for p in prompt)
    return None


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def load_sizer(tokenizer_path: str | None) -> PromptSizer:
    """The sizer for a configured tokenizer.json (None: the simulator's tokenizer); a file
    that cannot be loaded, or no `tokenizers` package, is a ConfigError naming the key."""
    if tokenizer_path is None:
        return PromptSizer()
    try:
        with open(tokenizer_path, "rb"):
            pass  # a missing or unreadable file is said in the OS's words, package or not
    except OSError as e:
        raise ConfigError(f"tokenizer: cannot read {tokenizer_path}: {e.strerror or e}") from None
    try:
        from tokenizers import Tokenizer  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise ConfigError(
            "tokenizer: is set, which needs the Hugging Face tokenizers package: "
            "pip install tokenizers (or '.[tokenizers]' from Narwhal's checkout)"
        ) from None
    try:
        tokenizer = Tokenizer.from_file(tokenizer_path)
    except Exception as e:  # the tokenizers package raises plain Exception for bad files
        raise ConfigError(f"tokenizer: {tokenizer_path} is not a tokenizer.json: {e}") from None

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return PromptSizer(count)
