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
- KV is counted in blocks (`narwhal.sim.prefix_cache`): a sequence is admitted with
  blocks for its whole context, the cached prefix of its prompt reused and only the
  rest prefilled (and paid for); decoding takes a new block when the last one is full,
  and when none is free the most recently admitted sequence is preempted (its blocks
  freed, its context recomputed later, hits permitting), as vLLM's recompute
  preemption does. A block is registered in the cache as soon as the step that fills
  it is scheduled, as vLLM does, so even a request admitted in the same step can share it;
- the step that completes a prefill samples that sequence's next token.

Those are the `chunked` discipline's rules; `--prefill-discipline` picks another row of
`narwhal.sim.discipline.DISCIPLINES` (one prompt at a time, SGLang's prefill-first
batches, one request at a time), which changes only how a step is filled: what is
charged, cached, preempted and reported stays the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

from narwhal.sim.discipline import DISCIPLINES
from narwhal.sim.options import SimOptions
from narwhal.sim.prefix_cache import Block, BlockPool, CacheCounters, extend_hashes

_UNBOUNDED: Final = 1 << 62  # the step budget of a discipline that prefills prompts whole


class SeqState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request inside the engine. `waiter` is an opaque slot for the async layer.

    `token_ids`, when given, is the prompt followed by every token the request will
    generate (the sim knows its output in advance): the blocks' cache keys. Without it
    the sequence takes KV blocks but neither reuses nor leaves cached prefixes.
    """

    __slots__ = (
        "aborted",
        "arrival",
        "blocks",
        "cached_tokens",
        "finish_reason",
        "first_token_at",
        "hashes",
        "keep_kv",
        "last_token_at",
        "num_committed",
        "preempted",
        "prefill_left",
        "priority",
        "produced",
        "prompt_len",
        "ready_at",
        "remote_kv",
        "started",
        "state",
        "streaming",
        "target",
        "token_ids",
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
        token_ids: list[int] | None = None,
        priority: int = 0,
    ) -> None:
        self.prompt_len = prompt_len
        self.priority = priority  # --scheduling-policy priority: waiting order, lower first
        self.target = target
        self.finish_reason = finish_reason
        # A sequence whose KV came from a prefill engine recomputes only its last prompt
        # token, as vLLM does to get the logits for its first sampled token.
        self.prefill_left = 1 if prefilled else prompt_len
        self.remote_kv = prefilled
        self.ready_at = ready_at
        self.keep_kv = keep_kv
        self.streaming = streaming  # False: wake the waiter only when finished
        self.token_ids = token_ids
        self.produced = 0
        self.blocks: list[Block] = []
        self.hashes: list[int] = []  # chained hashes of the full blocks of token_ids so far
        self.num_committed = 0  # leading blocks registered in the cache (or found there)
        self.cached_tokens: int | None = None  # tokens not prefilled at first admission
        self.preempted = False
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

    @property
    def num_tokens(self) -> int:
        """The context so far: the prompt and every token sampled."""
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
        discipline = DISCIPLINES[options.prefill_discipline]
        self.max_num_seqs = discipline.max_requests or options.max_num_seqs
        self.max_batched = options.max_num_batched_tokens if discipline.budgeted else _UNBOUNDED
        self.decodes_in_budget = discipline.decodes_in_budget
        self.decodes_stall = discipline.decodes_stall
        # Never binding when None: a step's prefills are running sequences.
        self.max_prefills = discipline.prefills_per_step or self.max_num_seqs
        self.block_size = options.block_size
        self.pool = BlockPool(
            options.num_gpu_blocks, options.block_size, caching=options.enable_prefix_caching
        )
        self.caching = options.enable_prefix_caching
        self.counters = CacheCounters()
        self.base_s = options.decode_base_ms / 1000.0
        self.per_seq_s = options.decode_per_seq_ms / 1000.0
        self.prefill_rate = options.prefill_tokens_per_s
        self.overhead_s = options.prefill_overhead_ms / 1000.0
        self.drift_at = drift_at
        self.drift_factor = options.drift_factor
        self.cold_steps = options.cold_steps
        self.cold_factor = options.cold_factor
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.held_blocks = 0  # blocks of finished prefills kept for remote decoders
        self.preemptions = 0
        self.prefill_tokens = 0  # prompt tokens computed (cache hits excluded)

    # -- what the outside sees --------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def used_blocks(self) -> int:
        """Blocks referenced by running sequences or held for decoders (not cached-free)."""
        return self.pool.num_used

    @property
    def kv_usage(self) -> float:
        return self.pool.usage

    def next_ready_time(self) -> float | None:
        """When a waiting sequence that is not ready yet becomes ready (idle wake-up)."""
        return min((s.ready_at for s in self.waiting), default=None)

    # -- changes from the outside ------------------------------------------------------
    def add(self, seq: Sequence, now: float) -> None:
        """Queue the sequence: behind every waiting one of its priority or a lower value
        (all 0 under fcfs: arrival order), as vLLM's priority scheduler orders its
        waiting queue by (priority, arrival)."""
        seq.arrival = now
        waiting = self.waiting
        at = len(waiting)
        while at and waiting[at - 1].priority > seq.priority:
            at -= 1
        waiting.insert(at, seq)

    def abort(self, seq: Sequence) -> None:
        if seq.state is SeqState.WAITING:
            self.waiting.remove(seq)
        elif seq.state is SeqState.RUNNING:
            self.running.remove(seq)
            self._free(seq)
        seq.state = SeqState.FINISHED
        seq.aborted = True

    def release_held(self, seq: Sequence) -> None:
        """A remote decoder pulled (or the lease dropped) the blocks kept after a prefill."""
        self.held_blocks -= len(seq.blocks)
        self._free(seq)

    # -- the step ----------------------------------------------------------------------
    def schedule(self, now: float) -> Step | None:
        if self.decodes_stall:
            # Prefill first: decoding sequences get a step only when no prefill can run.
            prefills, starts = self._plan_prefills(now, self.max_batched)
            decodes = [] if prefills else self._decodes()
        else:
            decodes = self._decodes()
            budget = self.max_batched - len(decodes) if self.decodes_in_budget else self.max_batched
            prefills, starts = self._plan_prefills(now, budget)
        if not decodes and not prefills:
            return None
        decode_s = self.base_s + self.per_seq_s * len(decodes)
        if self.drift_at is not None and now >= self.drift_at:
            decode_s *= self.drift_factor
        prefill_tokens = sum(chunk for _, chunk in prefills)
        self.prefill_tokens += prefill_tokens
        duration = decode_s + prefill_tokens / self.prefill_rate + self.overhead_s * starts
        if prefills and self.cold_steps > 0:
            self.cold_steps -= 1
            duration *= self.cold_factor
        return Step(decodes, prefills, duration)

    def _decodes(self) -> list[Sequence]:
        decodes = [s for s in self.running if s.prefill_left == 0]
        return self._grow(decodes) if decodes else decodes

    def _plan_prefills(self, now: float, budget: int) -> tuple[list[tuple[Sequence, int]], int]:
        """This step's prefill chunks: running sequences' first, then admissions."""
        prefills: list[tuple[Sequence, int]] = []
        starts = 0
        for seq in self.running:
            if seq.prefill_left and budget > 0 and len(prefills) < self.max_prefills:
                chunk = min(seq.prefill_left, budget)
                prefills.append((seq, chunk))
                budget -= chunk
                self._commit(seq, chunk)
        if self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            budget, starts = self._admit(now, budget, prefills)
        return prefills, starts

    def _grow(self, decodes: list[Sequence]) -> list[Sequence]:
        """Give each decoding sequence room for the token it computes in this step.

        A sequence whose blocks are full needs a new one; while fewer are free than
        needed, the most recently admitted sequence is preempted (it may be one of them).
        """
        # Once per token of every running sequence: arithmetic inline, no calls, on purpose.
        size = self.block_size
        needing = [s for s in decodes if len(s.blocks) * size < s.prompt_len + s.produced]
        if needing:
            while needing and len(needing) > self.pool.num_free:
                victim = self.running[-1]
                self._preempt(victim)
                if victim in decodes:
                    decodes.remove(victim)
                if victim in needing:
                    needing.remove(victim)
            for seq in needing:
                seq.blocks += self.pool.allocate(1)
        if self.caching:
            # The token computed in this step fills a block once every `size` steps.
            for seq in [
                s for s in decodes if (s.prompt_len + s.produced) // size > s.num_committed
            ]:
                self._commit(seq, 0)
        return decodes

    def _admit(
        self, now: float, budget: int, prefills: list[tuple[Sequence, int]]
    ) -> tuple[int, int]:
        admitted = 0
        size = self.block_size
        pool = self.pool
        counters = self.counters
        batch_queries = batch_hits = 0
        for seq in self.waiting:
            if len(self.running) >= self.max_num_seqs or budget <= 0:
                break
            if len(prefills) >= self.max_prefills:
                break
            if seq.ready_at > now:
                continue  # e.g. waiting for remote KV: later arrivals may go first, as in vLLM
            context = seq.num_tokens  # after a preemption, the output so far is context too
            hits = self._lookup(seq, context)
            need = -(-context // size) - len(hits)
            if not pool.can_allocate(need, hits):
                break  # first come, first served: nothing overtakes the head of the line
            pool.touch(hits)
            seq.blocks = hits + pool.allocate(need)
            seq.num_committed = len(hits)
            hit_tokens = len(hits) * size
            if seq.remote_kv:
                seq.prefill_left = 1  # the rest arrived from the prefill engine
            else:
                seq.prefill_left = context - hit_tokens
            if seq.cached_tokens is None:
                # vLLM's num_cached_tokens: what the first scheduling found computed,
                # KV pulled from a prefill engine included (usage.prompt_tokens_details).
                seq.cached_tokens = context - seq.prefill_left
            if self.caching and not seq.preempted:
                # vLLM counts a lookup once, at admission, and a preempted request's
                # second lookup apart (not exported), so it cannot inflate the hit rate.
                counters.queries += context
                counters.hits += hit_tokens
            batch_queries += context
            batch_hits += hit_tokens
            seq.state = SeqState.RUNNING
            self.running.append(seq)
            chunk = min(seq.prefill_left, budget)
            prefills.append((seq, chunk))
            budget -= chunk
            self._commit(seq, chunk)
            admitted += 1
        if admitted:
            self.waiting = [s for s in self.waiting if s.state is SeqState.WAITING]
            counters.batch_queries, counters.batch_hits = batch_queries, batch_hits
        starts = sum(1 for seq, _ in prefills[-admitted:] if not seq.started) if admitted else 0
        for seq, _ in prefills:
            seq.started = True
        return budget, starts

    def _lookup(self, seq: Sequence, context: int) -> list[Block]:
        if not self.caching or seq.token_ids is None:
            return []
        full = (context - 1) // self.block_size
        extend_hashes(seq.hashes, seq.token_ids, self.block_size, full)
        return self.pool.lookup(seq.hashes, context)

    def _commit(self, seq: Sequence, chunk: int) -> None:
        """Register the blocks this step fills (a `chunk` of prefill, or one decode token)."""
        if not self.caching or seq.token_ids is None:
            return
        computed = seq.num_tokens - seq.prefill_left + chunk
        full = computed // self.block_size
        if full <= seq.num_committed:
            return
        extend_hashes(seq.hashes, seq.token_ids, self.block_size, full)
        register = self.pool.register
        for i in range(seq.num_committed, full):
            register(seq.blocks[i], seq.hashes[i])
        seq.num_committed = full

    def _free(self, seq: Sequence) -> None:
        self.pool.free(seq.blocks)
        seq.blocks = []
        seq.num_committed = 0

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._free(seq)
        seq.state = SeqState.WAITING
        # Recompute: the prompt and everything generated so far is prefilled again,
        # but what is still cached (often its own blocks) is a hit on re-admission.
        seq.prefill_left = seq.num_tokens
        seq.remote_kv = False
        seq.preempted = True
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
            # The prompt's blocks stay for the decoder (the sampled token never got a
            # slot: its KV would have been computed by the next step).
            self.held_blocks += len(seq.blocks)
        else:
            self._free(seq)
