"""Completions' `echo: true`, as vLLM answers it to a client that did not ask for token IDs.

vLLM echoes the prompt's text before the first output (streamed: on each choice's first
chunk, the one that carries the prompt's IDs; non-streaming: in front of the text), but
blanks it when the request asks `return_token_ids` (completion/serving.py: `if
request.return_token_ids: prompt_text = ""`), while logprobs and `text_offset` still
cover the prompt. Narwhal asks token-ID engines for `return_token_ids` on every request
(seed, "Token identity"), so for a client that did not ask for IDs the echoed text is the
router's to put back, and it has it: the client's own prompt string.

A prompt of token IDs has no text the router could put back: vLLM detokenizes it, with
the model's tokenizer, only when the IDs were not asked for. Such a request is sent to
the engine as the client wrote it, without `return_token_ids` (`engine_token_ids`), and
its output is counted from usage, as for an engine without IDs.

Whatever the IDs asked, vLLM streams the prompt's IDs on the echo chunk (its echo and
its `return_token_ids` share that code), so a streaming echo client keeps them there
(`Exposure.echo`); its non-streaming answer has them only with `return_token_ids`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from narwhal.protocol.requests import CompletionRequest


def echoes(request: CompletionRequest) -> bool:
    """A completion request with `echo: true` (chat's echo is not touched by IDs)."""
    return request.route == "completion" and request.echo


def echo_text(request: CompletionRequest) -> str | None:
    """The prompt text the engine blanks and the router puts back for this client, or
    None when there is none to restore (no echo, IDs asked, a prompt of token IDs)."""
    if not echoes(request) or request.return_token_ids:
        return None
    prompt = request.body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # a batch of one: the same answer as the prompt alone
    return prompt if isinstance(prompt, str) else None


def engine_token_ids(request: CompletionRequest) -> bool:
    """Whether a token-ID engine may be asked `return_token_ids` for this request: not
    for an echo of token IDs to a client without IDs (its text only the engine can
    write, and only without them)."""
    if not echoes(request) or request.return_token_ids:
        return True
    return echo_text(request) is not None


def restore_echo(event: Mapping[str, Any], text: str) -> bool:
    """Put `text` in front of the text of each choice of `event` that carries the
    prompt's IDs (vLLM's echo chunk, the first of its choice), in place; whether any
    did."""
    choices = event.get("choices")
    if type(choices) is not list:
        return False
    restored = False
    for choice in choices:
        if type(choice) is dict and type(choice.get("prompt_token_ids")) is list:
            output = choice.get("text")
            if type(output) is str:
                choice["text"] = text + output
                restored = True
    return restored
