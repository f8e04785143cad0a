"""Every setting of one simulated engine, declared once.

`SimOptions` is the single source of defaults: the CLI builds one flag per field
(`--time-scale` for `time_scale`) from the field's type, default and `help` metadata,
and the in-process API takes the same object. Defaults model one H100 serving an
8B-class model with vLLM's V1 scheduler defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from narwhal.protocol.dialects import Dialect, vllm_supplies_token_ids
from narwhal.sim.discipline import PrefillDiscipline

Role = Literal["both", "prefill", "decode"]


def _help(text: str) -> dict[str, Any]:
    return {"help": text}


@dataclass(frozen=True, slots=True)
class SimOptions:
    model: str = field(
        default="narwhal-sim", metadata=_help("model name served; any other name gets 404")
    )
    dialect: Dialect = field(
        default="vllm",
        metadata=_help(
            "wire dialect: vllm (0.33 shapes), sglang (0.5.23), openai (transformers serve)"
        ),
    )
    role: Role = field(
        default="both",
        metadata=_help(
            "disaggregated-serving role: prefill answers kv_transfer_params with do_remote_decode, "
            "decode pulls KV blocks for do_remote_prefill; both does either"
        ),
    )
    seed: int = field(
        default=0,
        metadata=_help("seed of every generated output (same seed + same prompt = same output)"),
    )
    time_scale: float = field(
        default=1.0,
        metadata=_help(
            "multiplies every modelled duration (prefill, decode steps, KV transfer); "
            "0 = never sleep (benchmark the sim itself)"
        ),
    )
    max_model_len: int = field(
        default=32768, metadata=_help("context length; prompt + max_tokens above it gets 400")
    )
    prefill_discipline: PrefillDiscipline = field(
        default="chunked",
        metadata=_help(
            "how a step is filled: chunked (vLLM V1: decodes and chunked prefills share "
            "--max-num-batched-tokens), serial (one whole prompt per step, first come first "
            "served, decodes alongside), sglang (SGLang: prefill batches of up to "
            "--max-num-batched-tokens run alone, decodes stall meanwhile), sequential (one "
            "request in the engine at a time, prefill then its whole decode)"
        ),
    )
    max_num_seqs: int = field(
        default=256, metadata=_help("continuous batching: sequences running at once")
    )
    max_num_batched_tokens: int = field(
        default=8192,
        metadata=_help(
            "chunked prefill: tokens scheduled per engine step (decodes count one each)"
        ),
    )
    kv_capacity_tokens: int = field(
        default=450_000,
        metadata=_help(
            "KV-cache capacity in tokens: num_gpu_blocks is this over --block-size "
            "(rounded down); requests wait when no block is free"
        ),
    )
    block_size: int = field(
        default=16,
        metadata=_help(
            "tokens per KV-cache block (vLLM's --block-size): the unit of KV allocation, "
            "of prefix caching and of the block ids a prefill engine hands to a decoder"
        ),
    )
    enable_prefix_caching: bool = field(
        default=True,
        metadata=_help(
            "automatic prefix caching, on by default as in vLLM's V1 engine: full blocks "
            "of a prompt already in the cache are reused, not prefilled again"
        ),
    )
    enable_prompt_tokens_details: bool = field(
        default=False,
        metadata=_help(
            "report usage.prompt_tokens_details.cached_tokens (vLLM's flag of that name; "
            "SGLang's --enable-cache-report); without it the field is null"
        ),
    )
    prefill_tokens_per_s: float = field(
        default=20_000.0, metadata=_help("prefill throughput in prompt tokens per second")
    )
    prefill_overhead_ms: float = field(
        default=2.0, metadata=_help("fixed cost per request added to the step its prefill starts")
    )
    decode_base_ms: float = field(
        default=6.0, metadata=_help("cost of one engine step whatever its batch")
    )
    decode_per_seq_ms: float = field(
        default=0.08,
        metadata=_help("added step cost per decoding sequence, so TPOT grows with the batch"),
    )
    output_len_mean: float = field(
        default=256.0,
        metadata=_help(
            "mean output length when the model stops by itself (gamma, shape 2), "
            "capped by max_tokens"
        ),
    )
    stream_interval: int = field(
        default=1,
        metadata=_help(
            "server-wide tokens per streamed event; a request's stream_interval can only raise it"
        ),
    )
    kv_transfer_base_ms: float = field(
        default=2.0, metadata=_help("decode role: fixed cost of pulling a prompt's KV")
    )
    kv_transfer_tokens_per_s: float = field(
        default=200_000.0,
        metadata=_help("decode role: KV transfer speed in prompt tokens per second"),
    )
    kv_hold_s: float = field(
        default=30.0,
        metadata=_help(
            "prefill role: wall-clock seconds prefilled KV blocks are held for a decoder "
            "(not scaled by --time-scale, like vLLM's lease)"
        ),
    )
    drift_after_s: float | None = field(
        default=None,
        metadata=_help(
            "fault: after this many wall-clock seconds, decode steps slow by --drift-factor"
        ),
    )
    drift_factor: float = field(
        default=2.0, metadata=_help("fault: decode-step multiplier once --drift-after-s has passed")
    )
    cold_steps: int = field(
        default=0,
        metadata=_help(
            "fault: the first this many steps that prefill take --cold-factor times as long "
            "(an engine warming up after its start, as vLLM's first requests do)"
        ),
    )
    cold_factor: float = field(
        default=3.0, metadata=_help("fault: the step-time multiplier of --cold-steps")
    )
    broken_metrics: bool = field(default=False, metadata=_help("fault: /metrics answers 500"))
    tokenize_delay_s: float = field(
        default=0.0,
        metadata=_help("fault: /tokenize answers this many seconds late (an engine under load)"),
    )
    tokenize_scale: float = field(
        default=1.0,
        metadata=_help(
            "fault: /tokenize counts this many times the prompt's tokens (a tokenizer that "
            "a router's estimate does not match; completions are as they were)"
        ),
    )
    always: str = field(
        default="",
        metadata=_help(
            "directives applied to every request as if its prompt held them, e.g. "
            "'#sim:bool_token_id' (an engine whose every answer has the fault)"
        ),
    )

    arrival_log: str | None = field(
        default=None,
        metadata=_help(
            "append a line per completion request received: the host's monotonic clock "
            "(comparable across processes) and its X-Request-Id (for tests of who sent what)"
        ),
    )
    trace_log: str | None = field(
        default=None,
        metadata=_help(
            "append a JSON line per completion request received: its path, X-Request-Id and "
            "the traceparent and tracestate values it carried (lists, empty when absent)"
        ),
    )
    scheduling_policy: Literal["fcfs", "priority"] = field(
        default="fcfs",
        metadata=_help(
            "vllm dialect: as vLLM's --scheduling-policy; priority orders waiting requests "
            "by their `priority` field (lower first), fcfs refuses a nonzero one with a 400"
        ),
    )
    vllm_version: str | None = field(
        default=None,
        metadata=_help(
            "vllm dialect: the version GET /version reports (default: a current one); one "
            "before 0.10.2 also ignores return_token_ids and sends no token IDs, as those "
            "vLLM releases do"
        ),
    )
    api_key: str | None = field(
        default=None,
        metadata=_help(
            "require Authorization: Bearer KEY, as vLLM's and SGLang's --api-key do (401 "
            "otherwise): on /v1/* (vllm, openai dialects), on all but /health and /metrics "
            "(sglang)"
        ),
    )
    authorization_log: str | None = field(
        default=None,
        metadata=_help(
            "append a line per request answered: method, path, status and the "
            "Authorization header it carried ('-' when none), for tests of what a router sends"
        ),
    )

    def __post_init__(self) -> None:
        positive = {
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "block_size": self.block_size,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "kv_transfer_tokens_per_s": self.kv_transfer_tokens_per_s,
            "output_len_mean": self.output_len_mean,
            "stream_interval": self.stream_interval,
            "drift_factor": self.drift_factor,
            "cold_factor": self.cold_factor,
            "tokenize_scale": self.tokenize_scale,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        non_negative = {
            "time_scale": self.time_scale,
            "prefill_overhead_ms": self.prefill_overhead_ms,
            "decode_base_ms": self.decode_base_ms,
            "decode_per_seq_ms": self.decode_per_seq_ms,
            "kv_transfer_base_ms": self.kv_transfer_base_ms,
            "kv_hold_s": self.kv_hold_s,
            "tokenize_delay_s": self.tokenize_delay_s,
            "cold_steps": self.cold_steps,
        }
        for name, value in non_negative.items():
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.drift_after_s is not None and self.drift_after_s < 0:
            raise ValueError(f"drift_after_s must be >= 0, got {self.drift_after_s}")
        if self.kv_capacity_tokens < self.block_size:
            raise ValueError(
                f"kv_capacity_tokens ({self.kv_capacity_tokens}) must hold at least one block "
                f"of block_size ({self.block_size}) tokens"
            )
        if self.dialect not in get_args(Dialect):
            raise ValueError(f"unknown dialect {self.dialect!r}")
        if self.prefill_discipline not in get_args(PrefillDiscipline):
            raise ValueError(f"unknown prefill_discipline {self.prefill_discipline!r}")
        if self.role not in ("both", "prefill", "decode"):
            raise ValueError(f"unknown role {self.role!r}")
        if self.always:
            from narwhal.sim.scenarios import ScenarioError, parse_directives

            try:
                parse_directives(self.always)
            except ScenarioError as exc:
                raise ValueError(f"always: {exc}") from None

    @property
    def predates_token_ids(self) -> bool:
        """A vLLM reporting a release before `return_token_ids` (0.10.2): it sends none."""
        version = self.vllm_version
        return (
            self.dialect == "vllm"
            and version is not None
            and vllm_supplies_token_ids(version) is False
        )

    @property
    def num_gpu_blocks(self) -> int:
        """KV-cache blocks, as vLLM reports them in `vllm:cache_config_info`."""
        return self.kv_capacity_tokens // self.block_size

    @property
    def context_len(self) -> int:
        """The usable context: a lone sequence must always fit in the KV cache."""
        return min(self.max_model_len, self.num_gpu_blocks * self.block_size)
