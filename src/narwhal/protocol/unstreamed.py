"""Requests vLLM answers only without streaming, forwarded unstreamed (sans-IO).

vLLM refuses some requests with `stream: true`: `prompt_logprobs` above 0 or -1 (400,
`param` `prompt_logprobs`, in both routes' protocol validation) and beam search on
completions ("Streaming is not currently supported with beam search"). Narwhal asks
engines for a stream (DESIGN.md §4), so such a request from a NON-streaming client goes
to a vLLM engine as vLLM's own non-streaming request (`upstream_body(streamed=False)`:
no stream, no stream options, still `return_token_ids`, whose lists count the output as
the stream's would), and its answer is relayed in vLLM's shape (`relay_answer`): the
exposure rules hide what the client did not ask for (ID lists written as null, as vLLM
writes them then), usage stays, an echo's blanked prompt text goes back (`echo.py`).
A streaming client's such request goes to the engine as it is, and the client gets the
engine's own 400 with its `param`.

What the router learns from such an answer: its output length (IDs, or usage); not its
prefill time or TTFT, since one answer at the end has no first-token time (the
dispatcher marks no first token for it, and observes no TTFT).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from narwhal.protocol.echo import restore_echo
from narwhal.protocol.events import EngineOutputError
from narwhal.protocol.exposure import Exposure, apply_exposure
from narwhal.protocol.requests import CompletionRequest
from narwhal.protocol.tracker import OutputTracker


def unstreamed_field(request: CompletionRequest) -> str | None:
    """The field that makes vLLM answer this request only without streaming, or None."""
    body = request.body
    prompt_logprobs = body.get("prompt_logprobs")
    if type(prompt_logprobs) is int and (prompt_logprobs > 0 or prompt_logprobs == -1):
        return "prompt_logprobs"
    if request.route == "completion" and body.get("use_beam_search") is True:
        return "use_beam_search"
    return None


def relay_answer(
    answer: dict[str, Any], tracker: OutputTracker, exposure: Exposure, now: float
) -> dict[str, Any]:
    """The engine's non-streaming answer, accounted by `tracker` (its IDs validated and
    counted, its usage and finish reasons taken) and made what the client may see.
    Raises UpstreamError when the answer is not a finished completion."""
    tracker.observe(answer, now)
    if not tracker.finished:
        raise EngineOutputError("engine answered without a finished choice")
    if exposure.echo_text is not None:
        restore_echo(answer, exposure.echo_text)
    # A non-streaming answer always carries its usage; its per-choice prompt IDs are
    # there only when asked, echo or not (unlike the stream's echo chunk).
    apply_exposure(answer, replace(exposure, usage=True, continuous_usage=True, echo=False))
    return answer
