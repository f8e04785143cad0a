"""Workload sizing: how many prompt tokens a request brings.

By default the simulator's deterministic tokenizer (shared with `narwhal sim`, so the
router's sizing of simulated traffic is exact). With `tokenizer:` set to a tokenizer.json,
the Hugging Face `tokenizers` package (the optional extra `narwhal[tokenizers]`) sizes
prompts as the real model does; chat prompts then count each message's text plus a small
per-message allowance for the chat template.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from narwhal.protocol.requests import CompletionRequest
from narwhal.protocol.tokenizer import SimTokenizer

_TEMPLATE_TOKENS_PER_MESSAGE = 4


class PromptSizer:
    def __init__(self, count_text: Callable[[str], int] | None = None) -> None:
        self._sim = SimTokenizer()
        self._count_text = count_text

    def __call__(self, request: CompletionRequest) -> int:
        body = request.body
        if request.route == "chat":
            messages: Sequence[Mapping[str, object]] = body["messages"]
            if self._count_text is None:
                return self._sim.chat_prompt_count(messages)
            return sum(
                self._count_text(_message_text(m)) + _TEMPLATE_TOKENS_PER_MESSAGE for m in messages
            )
        prompt = body["prompt"]
        if isinstance(prompt, str):
            return self._count_prompt(prompt)
        if prompt and isinstance(prompt[0], int):
            return len(prompt)
        return sum(len(p) if isinstance(p, list) else self._count_prompt(p) for p in prompt)

    def _count_prompt(self, text: str) -> int:
        if self._count_text is None:
            return len(self._sim.completion_prompt_ids(text))
        return self._count_text(text)


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def load_sizer(tokenizer_path: str | None) -> PromptSizer:
    if tokenizer_path is None:
        return PromptSizer()
    try:
        from tokenizers import Tokenizer  # type: ignore[import-not-found,unused-ignore]
    except ImportError as e:
        raise SystemExit(
            "tokenizer: is set, which needs the Hugging Face tokenizers package: "
            "pip install 'narwhal[tokenizers]'"
        ) from e
    tokenizer = Tokenizer.from_file(tokenizer_path)

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return PromptSizer(count)
