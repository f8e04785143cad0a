"""The context-length refusal (sans-IO): a prompt and its output cap beyond the model's context.

vLLM refuses such a request itself (400), but only once the router has queued, placed and
sent it, and as an engine error; the router knows the context from every engine's
/v1/models (`max_model_len`), so it refuses first, before any engine work, with OpenAI's
code `context_length_exceeded` (DESIGN.md "Errors") and `param` the field to change:
`messages`/`prompt` when the prompt alone leaves no room for one output token, else the
output cap the client set (`max_completion_tokens` or `max_tokens`).

The prompt's size may be an estimate: the caller passes the fewest tokens it can be
(`least`), and only that is held against the limit, so an estimate's error never refuses
a request the engine would serve. The message shows the count it was refused on.
"""

from __future__ import annotations

from narwhal.errors import ContextLengthExceeded
from narwhal.protocol.requests import CompletionRequest


def check_context_length(
    request: CompletionRequest, *, least: int, exact: bool, limit: int
) -> None:
    """Raise `ContextLengthExceeded` when a prompt of at least `least` tokens (its exact
    count when `exact`) with the request's output cap cannot fit `limit` tokens."""
    prompt_field = "messages" if request.route == "chat" else "prompt"
    counted = f"{least}" if exact else f"at least {least} (estimated)"
    if least >= limit:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {limit} tokens. However, your "
            f"{prompt_field} has {counted} tokens, which leaves no room for output. "
            f"Please reduce the length of the {prompt_field}.",
            param=prompt_field,
        )
    cap = request.max_tokens
    if cap is not None and least + cap > limit:
        cap_field = (
            "max_completion_tokens"
            if request.body.get("max_completion_tokens") is not None
            else "max_tokens"
        )
        raise ContextLengthExceeded(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{'' if exact else 'at least '}{least + cap} tokens ({counted} in the "
            f"{prompt_field}, {cap} in the completion). Please reduce the length of the "
            f"{prompt_field} or `{cap_field}`.",
            param=cap_field,
        )
