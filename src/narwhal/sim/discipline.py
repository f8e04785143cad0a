"""Prefill disciplines: how an engine fits prompts and decoding sequences into a step.

Narwhal's TTFT model must hold on engines it was not designed against, so the sim can
schedule the way other engines do. A discipline is a row of the `DISCIPLINES` table,
values the scheduler (`narwhal.sim.model`) reads once; its KV accounting, prefix
caching, preemption and disaggregated roles are the same code under every row.

- `chunked`: vLLM's V1 scheduler. Every step runs every decoding sequence, each costing
  one token of `--max-num-batched-tokens`; prompts fill the rest, split across steps
  when they do not fit (chunked prefill), as many as the budget holds.
- `serial`: one prompt at a time, first come first served, prefilled whole (no chunks,
  no step budget) in one step, so k prompts arriving together get their first tokens at
  1x, 2x, ... kx the time of one. Decoding sequences still run in every step, the
  one with the prompt included: an engine with a single prefill slot beside its decode
  batch has no reason to idle that batch, and keeping decodes going separates the one
  property this row exists to show (prompts served one after another, TTFT the prompt
  work queued ahead) from the decode stall that `sglang` shows.
- `sglang`: SGLang's default scheduler (no `--enable-mixed-chunk`; FCFS, its default
  policy). A prefill batch is built from the waiting queue up to
  `--max-num-batched-tokens` (SGLang's `--chunked-prefill-size`, 8,192 in both; one
  request at the batch's end may be cut short and is continued first in the next batch)
  and runs as a step of its own: decoding sequences stall while any prefill can be
  scheduled, and decode only in steps with no prefill. The first tokens of a prefill
  batch come together at its end. SGLang's `--max-prefill-tokens` (16,384) is not
  modelled apart: with the chunk size below it, the chunk size always binds first. Nor
  is the KV SGLang reserves for running requests' expected outputs: a prompt is
  admitted here when its blocks fit, as under every row.
- `sequential`: one request in the engine at a time, its prefill and then its whole
  decode before the next request is admitted (`transformers serve` with continuous
  batching off); `--max-num-seqs` and `--max-num-batched-tokens` do not apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

PrefillDiscipline = Literal["chunked", "serial", "sglang", "sequential"]


@dataclass(frozen=True, slots=True)
class Discipline:
    budgeted: bool  # a step's tokens are capped by the step budget; else a prompt goes whole
    decodes_in_budget: bool  # each decoding sequence takes one token of that budget (vLLM)
    decodes_stall: bool  # a step that prefills runs no decodes: decode waits for idle prefill
    prefills_per_step: int | None  # prompts (or chunks) in one step; None: as the budget holds
    max_requests: int | None  # sequences in the engine at once; None: --max-num-seqs


DISCIPLINES: Final[dict[PrefillDiscipline, Discipline]] = {
    "chunked": Discipline(True, True, False, None, None),
    "serial": Discipline(False, False, False, 1, None),
    "sglang": Discipline(True, False, True, None, None),
    "sequential": Discipline(False, False, False, 1, 1),
}
