"""Scripted behaviour per request, chosen by `#sim:NAME` / `#sim:NAME=VALUE` in the prompt.

The directive is read from the last user message's text (chat) or the prompt
(completions); several may appear. An unknown name is a 400, so a typo in a test
fails loudly instead of silently testing the plain path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

# name -> (takes a value, what it does); the table is also the --help epilogue.
CATALOGUE: Final[dict[str, str]] = {
    "tool_calls": "two parallel tool calls streamed in fragments; finish_reason tool_calls",
    "function_call": "legacy delta.function_call (name, then argument fragments)",
    "reasoning": "reasoning deltas before the content",
    "refusal": "delta.refusal strings instead of content",
    "logprobs": "logprobs on even if the request did not ask",
    "long": "run to max_tokens (finish_reason length)",
    "len=N": "stop by EOS after exactly N tokens (N counts the EOS)",
    "no_token_ids": "one content event without its token_ids list",
    "bool_token_id": "one event's token_ids holds a JSON true",
    "negative_token_id": "one event's token_ids holds -1",
    "malformed_token_ids": "one event's token_ids is a string, not a list",
    "audio_delta": "one delta carries an audio object",
    "annotations": "one delta (choice, for completions) carries url_citation annotations",
    "error_midstream[=N]": "an error event after N tokens (default 3), then [DONE]",
    "disconnect_midstream[=N]": "the TCP connection drops after N tokens (default 3)",
    "stall=S": "no bytes for S wall-clock seconds after the second token (not time-scaled)",
    "slow_prefill=S": "S wall-clock seconds more before prefill (not time-scaled)",
    "http_500": "answer 500 before any stream",
}
_KNOWN: Final = frozenset(key.split("=")[0].split("[")[0] for key in CATALOGUE)
_NEEDS_VALUE: Final = frozenset({"len", "stall", "slow_prefill"})
_DIRECTIVE_RE: Final = re.compile(r"#sim:([a-z_0-9]+)(?:=([^\s#]+))?")

ID_FAULTS: Final = ("no_token_ids", "bool_token_id", "negative_token_id", "malformed_token_ids")


class ScenarioError(ValueError):
    """A directive that cannot be honoured (unknown name or bad value)."""


@dataclass(frozen=True, slots=True)
class Scenarios:
    values: dict[str, str | None] = field(default_factory=dict)

    def __contains__(self, name: object) -> bool:
        return name in self.values

    def __bool__(self) -> bool:
        return bool(self.values)

    def number(self, name: str, default: float) -> float:
        raw = self.values.get(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise ScenarioError(f"#sim:{name} needs a number, got {raw!r}") from None
        if value < 0:
            raise ScenarioError(f"#sim:{name} must not be negative, got {raw!r}")
        return value

    def position(self, name: str, default: int) -> int | None:
        """Where (in tokens) a mid-stream fault strikes, or None when it is not asked."""
        if name not in self.values:
            return None
        return int(self.number(name, default))

    @property
    def id_fault(self) -> str | None:
        return next((name for name in ID_FAULTS if name in self.values), None)


NO_SCENARIOS: Final = Scenarios()


def parse_directives(text: str) -> Scenarios:
    if "#sim:" not in text:
        return NO_SCENARIOS
    values: dict[str, str | None] = {}
    for name, value in _DIRECTIVE_RE.findall(text):
        if name not in _KNOWN:
            known = ", ".join(sorted(_KNOWN))
            raise ScenarioError(f"unknown directive #sim:{name} (known: {known})")
        if name in _NEEDS_VALUE and not value:
            raise ScenarioError(f"#sim:{name} needs a value, e.g. #sim:{name}=2")
        values[name] = value or None
    scenarios = Scenarios(values)
    for name in values:  # validate numbers now, so a bad value is a 400 and not a 500 later
        if name in _NEEDS_VALUE or name in ("error_midstream", "disconnect_midstream"):
            scenarios.number(name, 0)
    return scenarios
