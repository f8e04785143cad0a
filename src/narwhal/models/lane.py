"""One engine's prefill lane (sans-IO): a twin of its chunked-prefill scheduler.

vLLM's scheduler (and SGLang's, and the simulator's) runs in steps. Each step decodes
one token for every running sequence and spends what is left of a token budget
(`max_num_batched_tokens`) on prefill, first come first served, chunking the prompt
that does not fit; a prompt's first token comes at the end of the step that finishes
its prefill. So a request's TTFT is quantized by steps: it waits for the step in
progress to end, then for the steps that clear the prompts ahead of it, and its own
step is stretched by the prompts that arrive before that step starts. On an engine
whose steps take 0.4 s under load, treating prefill as a fluid that drains at a rate
is off by a large share of a step, so the lane follows the steps.

What the lane knows: every prompt Narwhal placed there (tokens, placement time, in
order), and every first token (a step ended then; several within a short window are
one step's). When a step ends, the prompts that finished are taken out with all those
ahead of them, and the budget the step had left is credited to the next prompts that
were waiting when it began (the chunk it prefilled of them). `project` then runs the
steps forward for one more prompt:

    the step in progress:  ends at its start + base + its prefill tokens x per token
    then:                  ceil(tokens ahead and own / budget) steps, the last holding
                           also the prompts expected to arrive before it starts

`finish` also returns each prompt's service time by the departure rule of a
first-come-first-served server (finish - max(placed, previous finish)), which the
model's regression learns from. Costs: O(1) per placement, O(prompts finished) per
finish, O(prompts ahead) per projection (the prompts placed and not yet finished).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

# Finish events of one step reach the router within a few milliseconds of each other
# (one read per stream); within a quarter of the last step's length, or this, they
# are taken as one step's.
_SAME_STEP_S: Final = 0.003


@dataclass(slots=True)
class _Prompt:
    tokens: int
    remaining: int  # not yet prefilled, as far as the lane can tell
    placed_at: float


@dataclass(frozen=True, slots=True)
class StepCosts:
    """What one engine step costs, from the engine's model."""

    budget: int  # tokens per step (decodes take one each)
    base: float  # seconds per step whatever it holds
    per_token: float  # seconds per prefilled token
    per_prompt: float  # seconds per prompt whose prefill starts in the step


@dataclass(slots=True)
class PrefillLane:
    _prompts: dict[object, _Prompt] = field(default_factory=dict)  # placement order
    _step_start: float = -math.inf  # when the step in progress began
    _ended_start: float = -math.inf  # when the step that ended last had begun
    _last_end: float = -math.inf  # when it ended
    _step_done: int = 0  # tokens the last step is known to have finished
    _granted: list[tuple[_Prompt, int]] = field(default_factory=list)
    _last_finish: float = -math.inf  # for the departure rule
    version: int = 0  # changes with every change to the lane: a cache key

    def __len__(self) -> int:
        return len(self._prompts)

    def prompts(self) -> Iterator[tuple[int, int, float]]:
        """(tokens, remaining, placed_at) of every prompt in the lane, in order."""
        for prompt in self._prompts.values():
            yield prompt.tokens, prompt.remaining, prompt.placed_at

    def tokens(self) -> int:
        """Prompt tokens of every prefill in the lane (what they hold in KV, or will)."""
        return sum(prompt.tokens for prompt in self._prompts.values())

    def waiting_tokens(self) -> int:
        """Prompt tokens of the prefills not started yet (no KV allocated for them)."""
        return sum(p.tokens for p in self._prompts.values() if p.remaining == p.tokens)

    def add(self, key: object, tokens: int, now: float) -> None:
        self.remove(key)
        first = next(iter(self._prompts.values()), None)
        if first is None or first.placed_at > self._step_start:
            # No prefill in the step in progress (the engine idles or only decodes, in
            # steps of milliseconds): a step with this prompt starts at once.
            self._step_start = now
        tokens = max(1, tokens)
        self._prompts[key] = _Prompt(tokens, tokens, now)
        self.version += 1

    def remove(self, key: object) -> None:
        """A prefill that will not finish here (failed, cancelled)."""
        if self._prompts.pop(key, None) is not None:
            self.version += 1

    def finish(self, key: object, now: float, budget: int) -> float | None:
        """The prefill of `key` finished at `now` (its first token): the step that ended
        then is accounted for; returns its service time (None for an unknown key)."""
        prompt = self._prompts.get(key)
        self.version += 1
        window = _SAME_STEP_S
        if self._ended_start > -math.inf:
            window = max(window, 0.25 * (self._last_end - self._ended_start))
        if now - self._last_end > window:  # a new step ended
            self._ended_start, self._last_end = self._step_start, now
            self._step_start = now
            self._step_done = 0
            self._granted = []
        # This step's credit to the prompts after those it finished is worked out anew
        # with each finish it brings (the finishes of one step come one by one).
        for waiting, granted in self._granted:
            waiting.remaining += granted
            self._step_done -= granted
        self._granted = []
        service = None
        if prompt is not None:
            # First come, first served: every prompt ahead of it is done too.
            for other_key in list(self._prompts):
                other = self._prompts.pop(other_key)
                self._step_done += other.remaining
                if other_key == key:
                    break
            started = max(prompt.placed_at, self._last_finish)
            service = max(0.0, now - started)
            self._last_finish = max(self._last_finish, now)
        left = budget - self._step_done
        for waiting in self._prompts.values():
            if left <= 0 or waiting.placed_at > self._ended_start:
                break  # placed after the step began: it was not in it
            # Keep a token back: had the step finished it, its first token would be here.
            take = min(left, waiting.remaining - 1)
            if take > 0:
                waiting.remaining -= take
                self._step_done += take
                self._granted.append((waiting, take))
            left -= take
        return service

    def project(
        self, tokens: int, now: float, costs: StepCosts, arrivals: float
    ) -> tuple[float, float]:
        """(seconds until a prompt of `tokens` placed now would have its first token,
        seconds of prefill work ahead of it); `arrivals` is the prompt tokens per
        second expected to be placed here meanwhile."""
        budget = max(1, costs.budget)
        in_step = 0  # tokens the step in progress holds
        in_step_prompts = 0
        ahead = 0  # tokens waiting for later steps
        ahead_prompts = 0
        for prompt in self._prompts.values():
            if prompt.placed_at <= self._step_start:
                in_step += prompt.remaining
                in_step_prompts += prompt.remaining == prompt.tokens
            else:
                ahead += prompt.remaining
                ahead_prompts += 1
        residual = 0.0
        if in_step:
            held = min(in_step, budget)
            step = costs.base + held * costs.per_token + in_step_prompts * costs.per_prompt
            residual = max(0.0, self._step_start + step - now)
            ahead += in_step - held
        own = ahead + tokens
        steps = max(1, math.ceil(own / budget))
        last_room = steps * budget - own
        waited = residual + (steps - 1) * (costs.base + budget * costs.per_token)
        joiners = min(float(last_room), max(0.0, arrivals * waited))
        first_token = (
            residual
            + steps * costs.base
            + (own + joiners) * costs.per_token
            + (ahead_prompts + 1) * costs.per_prompt
        )
        work_ahead = first_token - (costs.base + tokens * costs.per_token + costs.per_prompt)
        return first_token, max(0.0, work_ahead)
