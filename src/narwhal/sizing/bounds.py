"""Whether a decision taken on a prompt's size could be flipped by the size's error (sans-IO).

A calibrated estimate comes with bounds the engines' count is expected in (`PromptSize.low`,
`.high`). A decision that is monotone in the prompt's tokens (more tokens never turn a
refusal into an admission: the predictive check's two 429s, the context length) is the
same for every count between the bounds when it is the same at both: then the router acts
at once, on the estimate. Only when the two ends differ is the engine's own count worth a
round trip (bounded in time; `WorkloadSizer.engine_count`), which the caller awaits.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Literal

from narwhal.sizing import PromptSize

ContextVerdict = Literal["fits", "exceeds"]


def needs_engine_count(size: PromptSize, verdict: Callable[[int], Hashable]) -> bool:
    """True when `verdict(tokens)` differs at the two ends of the size's bounds: the
    decision needs the engine's count. False when it is decided (one evaluation for an
    exact size: none; two otherwise)."""
    if size.settled:
        return False
    return verdict(size.low) != verdict(size.high)


def context_fit(prompt_tokens: int, max_tokens: int | None, max_model_len: int | None) -> bool:
    """Whether the prompt and the output it may ask for fit the model's context (vLLM
    refuses prompt + max_tokens over max_model_len with a 400). Unknown length: fits."""
    if max_model_len is None:
        return True
    return prompt_tokens + (max_tokens or 0) <= max_model_len


def context_verdict(
    size: PromptSize, max_tokens: int | None, max_model_len: int | None
) -> ContextVerdict | None:
    """The context-length check on a sized prompt: "fits" or "exceeds" when that holds
    for every count within its bounds, None when only the engine's count can say (the
    `context_length_exceeded` 400 then waits for `WorkloadSizer.engine_count`)."""
    fits_high = context_fit(size.high, max_tokens, max_model_len)
    if fits_high:
        return "fits"
    return "exceeds" if not context_fit(size.low, max_tokens, max_model_len) else None
