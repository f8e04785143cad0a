"""The engine's performance model: a continuous-batching scheduler, one step at a time.

Synchronous and clock-free: `schedule(now)` decides the next step's batch and its
modelled duration, `finish_step(step, now)` applies it (tokens come out at the end of
a step). `narwhal.sim.engine` owns the loop that sleeps between the two; tests can
drive this class directly.

The rules follow vLLM's V1 scheduler closely enough for a router to learn from:
- running sequences go first: every decoding sequence costs one token of the step's
  budget (`max_num_batched_tokens`), sequences still prefilling take what remains in
  chunks (chunked prefill), then waiting sequences are admitted in arrival order while
  `max_num_seqs` and the KV cache allow; the first that does not fit blocks the rest;
- a step costs `decode_base + decode_per_seq * decoding` (times the drift factor once
  drift has set in) plus `prefill tokens / prefill_tokens_per_s` plus a per-request
  overhead for each prefill that starts, so TPOT grows with the batch and TTFT with
  the prompt and the queue in front of it;
- KV is counted in tokens: a sequence holds its prompt plus its output; when a decode
  step would overflow, the most recently admitted sequence is preempted (its KV freed,
  recomputed later), as vLLM's recompute preemption does;
- the step that completes a prefill samples that sequence's next token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from narwhal.sim.options import SimOptions


class SeqState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request inside the engine. `waiter` is an opaque slot for the async layer."""

    __slots__ = (
        "aborted",
        "arrival",
        "finish_reason",
        "first_token_at",
        "keep_kv",
        "kv",
        "last_token_at",
        "prefill_left",
        "produced",
        "prompt_len",
        "ready_at",
        "started",
        "state",
        "streaming",
        "target",
        "waiter",
    )

    def __init__(
        self,
        prompt_len: int,
        target: int,
        *,
        finish_reason: str = "stop",
        prefilled: bool = False,
        ready_at: float = 0.0,
        keep_kv: bool = False,
        streaming: bool = True,
    ) -> None:
        self.prompt_len = prompt_len
        self.target = target
        self.finish_reason = finish_reason
        # A sequence whose KV came from a prefill engine recomputes only its last prompt
        # token, as vLLM does to get the logits for its first sampled token.
        self.prefill_left = 1 if prefilled else prompt_len
        self.ready_at = ready_at
        self.keep_kv = keep_kv
        self.streaming = streaming  # False: wake the waiter only when finished
        self.produced = 0
        self.kv = 0
        self.started = False
        self.state = SeqState.WAITING
        self.aborted = False
        self.arrival = 0.0
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.waiter: Any = None

    @property
    def finished(self) -> bool:
        return self.state is SeqState.FINISHED

    def kv_need(self) -> int:
        """KV tokens to allocate on admission: the whole context (recomputed after preemption)."""
        return self.prompt_len + self.produced


@dataclass(slots=True)
class Step:
    decodes: list[Sequence]
    prefills: list[tuple[Sequence, int]]
    duration: float  # seconds of model time, before --time-scale


@dataclass(slots=True)
class StepResult:
    progressed: list[Sequence] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)
    first_tokens: list[Sequence] = field(default_factory=list)
    preempted: int = 0


class Scheduler:
    def __init__(self, options: SimOptions, *, drift_at: float | None = None) -> None:
        self.max_num_seqs = options.max_num_seqs
        self.max_batched = options.max_num_batched_tokens
        self.kv_capacity = options.kv_capacity_tokens
        self.base_s = options.decode_base_ms / 1000.0
        self.per_seq_s = options.decode_per_seq_ms / 1000.0
        self.prefill_rate = options.prefill_tokens_per_s
        self.overhead_s = options.prefill_overhead_ms / 1000.0
        self.drift_at = drift_at
        self.drift_factor = options.drift_factor
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.kv_used = 0  # running sequences' KV plus blocks held for remote decoders
        self.kv_held = 0
        self.preemptions = 0

    # -- what the outside sees --------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.kv_used / self.kv_capacity)

    def next_ready_time(self) -> float | None:
        """When a waiting sequence that is not ready yet becomes ready (idle wake-up)."""
        return min((s.ready_at for s in self.waiting), default=None)

    # -- changes from the outside ------------------------------------------------------
    def add(self, seq: Sequence, now: float) -> None:
        seq.arrival = now
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        if seq.state is SeqState.WAITING:
            self.waiting.remove(seq)
        elif seq.state is SeqState.RUNNING:
            self.running.remove(seq)
            self.kv_used -= seq.kv
            seq.kv = 0
        seq.state = SeqState.FINISHED
        seq.aborted = True

    def release_held(self, tokens: int) -> None:
        """A remote decoder pulled (or the lease dropped) KV held after a prefill."""
        self.kv_held -= tokens
        self.kv_used -= tokens

    # -- the step ----------------------------------------------------------------------
    def schedule(self, now: float) -> Step | None:
        decodes = [s for s in self.running if s.prefill_left == 0]
        while decodes and self.kv_used + len(decodes) > self.kv_capacity:
            victim = self.running[-1]
            self._preempt(victim)
            if victim in decodes:
                decodes.remove(victim)
        budget = self.max_batched - len(decodes)
        prefills: list[tuple[Sequence, int]] = []
        starts = 0
        for seq in self.running:
            if seq.prefill_left and budget > 0:
                chunk = min(seq.prefill_left, budget)
                prefills.append((seq, chunk))
                budget -= chunk
        if self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            budget, starts = self._admit(now, budget, prefills)
        if not decodes and not prefills:
            return None
        decode_s = self.base_s + self.per_seq_s * len(decodes)
        if self.drift_at is not None and now >= self.drift_at:
            decode_s *= self.drift_factor
        prefill_tokens = sum(chunk for _, chunk in prefills)
        duration = decode_s + prefill_tokens / self.prefill_rate + self.overhead_s * starts
        return Step(decodes, prefills, duration)

    def _admit(
        self, now: float, budget: int, prefills: list[tuple[Sequence, int]]
    ) -> tuple[int, int]:
        admitted = 0
        for seq in self.waiting:
            if len(self.running) >= self.max_num_seqs or budget <= 0:
                break
            if seq.ready_at > now:
                continue  # e.g. waiting for remote KV: later arrivals may go first, as in vLLM
            need = seq.kv_need()
            if self.kv_used + need > self.kv_capacity:
                break  # first come, first served: nothing overtakes the head of the line
            seq.state = SeqState.RUNNING
            seq.kv = need
            self.kv_used += need
            self.running.append(seq)
            chunk = min(seq.prefill_left, budget)
            prefills.append((seq, chunk))
            budget -= chunk
            admitted += 1
        if admitted:
            self.waiting = [s for s in self.waiting if s.state is SeqState.WAITING]
        starts = sum(1 for seq, _ in prefills[-admitted:] if not seq.started) if admitted else 0
        for seq, _ in prefills:
            seq.started = True
        return budget, starts

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv_used -= seq.kv
        seq.kv = 0
        seq.state = SeqState.WAITING
        # Recompute: the prompt and everything generated so far is prefilled again.
        seq.prefill_left = seq.prompt_len + seq.produced
        seq.ready_at = 0.0
        self.waiting.insert(0, seq)
        self.preemptions += 1

    def finish_step(self, step: Step, now: float) -> StepResult:
        result = StepResult()
        progressed = result.progressed
        for seq in step.decodes:
            if seq.state is SeqState.RUNNING:
                progressed.append(seq)
        for seq, chunk in step.prefills:
            if seq.state is not SeqState.RUNNING:
                continue
            seq.prefill_left -= chunk
            if seq.prefill_left == 0:
                progressed.append(seq)
        for seq in progressed:
            seq.produced += 1
            seq.kv += 1
            self.kv_used += 1
            if seq.first_token_at is None:
                seq.first_token_at = now
                result.first_tokens.append(seq)
            if seq.produced >= seq.target:
                self._finish(seq)
                result.finished.append(seq)
        return result

    def _finish(self, seq: Sequence) -> None:
        self.running.remove(seq)
        seq.state = SeqState.FINISHED
        if seq.keep_kv:
            # The prompt's blocks stay for the decoder; the sampled token's slot is freed.
            self.kv_held += seq.prompt_len
            self.kv_used -= seq.kv - seq.prompt_len
        else:
            self.kv_used -= seq.kv
        seq.kv = 0
