"""What each engine dialect does on the wire, in one table (sans-IO).

A dialect is how Narwhal talks to an engine (`engines[].dialect` in the configuration,
`narwhal sim --dialect`): vLLM first, SGLang second, any OpenAI-compatible server third
(DESIGN.md). Every decision the router takes by dialect reads `capabilities(dialect)`,
and nothing else names a dialect (`tests/test_layout.py` holds it): what the upstream
request asks for (`upstream.upstream_body`), what the engine's events carry (the
tracker's token IDs, the exposure filter's nulls), where and how a prompt is counted (the
tokenize route and its chat form: sizing and the probes' lengths), whose metric names its
/metrics page carries and whether it may have none (the fleet monitor), and what
/admin/engines reports (`token_accounting`). Each fact cites the PROTOCOL.md section it
comes from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Final, Literal, get_args

from narwhal.protocol.events import Route

Dialect = Literal["vllm", "sglang", "openai"]
TokenAccounting = Literal["token_ids", "unavailable"]
MetricsVendor = Literal["vllm", "sglang"]
"""Whose metric names an engine's /metrics page carries (`narwhal.fleet.scrape`)."""

ROUTES: Final[frozenset[Route]] = frozenset(get_args(Route))
# vLLM's own request fields, which a generic OpenAI-compatible server may answer 422 to
# (PROTOCOL.md §6.3).
VLLM_ONLY_FIELDS: Final = ("return_token_ids", "stream_interval", "kv_transfer_params")


@dataclass(frozen=True, slots=True)
class DialectCapabilities:
    """One dialect's facts, as the router's decisions ask them."""

    name: Dialect
    token_ids_on: frozenset[Route]
    """The routes on which the engine gives validated token IDs on every event that
    carries output, when asked with `return_token_ids`: vLLM on both (PROTOCOL.md §1.2,
    §1.3), SGLang on /v1/completions only (§6.1). There Narwhal asks for them and counts
    and times output by them."""
    sglext_ids_on: frozenset[Route]
    """The routes on which the engine gives a stream's IDs only at its end, in one
    `sglext` chunk, when asked (SGLang's streamed chat, §6.1): an exact count, no
    per-token timing."""
    vllm_fields: frozenset[str]
    """Which of `VLLM_ONLY_FIELDS` the engine takes; the others are removed from the
    upstream body (SGLang has no `stream_interval`; generic servers take none, §6.3)."""
    null_usage: bool
    """The engine writes `"usage": null` on its chunks whatever was asked: SGLang dumps
    them with their null fields (§6.1); vLLM leaves the key out, and OpenAI writes the
    null only when usage was asked (§2.5)."""
    null_ids: bool
    """The engine writes its ID lists as null when they were not asked for: vLLM does
    (§1.2); SGLang leaves them out (§6.1)."""
    metrics_optional: bool
    """The engine may serve no /metrics, or a page without load metrics, and still be
    healthy: generic servers (`transformers serve` answers 404, DESIGN.md §4)."""
    version_gates_token_ids: bool
    """The engine's GET /version tells whether it gives token IDs at all: vLLM releases
    before `return_token_ids` (0.10.2) send none (PROTOCOL.md §1)."""
    tokenize_path: str | None
    """Where the engine counts a prompt's tokens (vLLM's and SGLang's `/tokenize`,
    PROTOCOL.md §5), for sizing and for the probes' lengths; None: it has no such route."""
    tokenize_adds_generation_prompt: bool
    """The chat form of the tokenize route takes `add_generation_prompt` and needs it
    to count what a chat completion renders (vLLM); SGLang renders it as for a chat
    completion without it."""
    metrics_vendors: tuple[MetricsVendor, ...]
    """Whose load metrics the engine's /metrics page may carry: a generic server may
    well be a vLLM or an SGLang behind the plain dialect."""
    priority_scheduling: bool = False
    """The engine can be started to schedule by a request's `priority` field, lower
    first (vLLM's `--scheduling-policy priority`)."""
    schedules_by_priority: bool = False
    """This engine does (its configuration says it was started so): each request's class
    rank goes to it there."""
    answers_unstreamed: bool = False
    """The engine refuses some requests when streamed and answers them unstreamed
    (vLLM: `prompt_logprobs`, completions' beam search; PROTOCOL.md §7): a
    non-streaming client's such request goes to it unstreamed (`unstreamed.py`)."""

    @property
    def disaggregates(self) -> bool:
        """The engine takes the prefill/decode handshake (`kv_transfer_params`, PROTOCOL.md
        §4): it may be one half of a disaggregated pair."""
        return "kv_transfer_params" in self.vllm_fields

    @property
    def token_accounting(self) -> TokenAccounting:
        """How the engine has its output counted, as /admin/engines reports it
        (DESIGN.md §3): `token_ids` when it gives validated per-event token IDs on every
        completion route, so every request's output length and per-token timing come
        from IDs; `unavailable` when on some route they do not (SGLang's streamed chat,
        every route of a generic server), and output there is counted from the engine's
        usage or from its events (the seed's `token_accounting: unavailable`)."""
        return "token_ids" if self.token_ids_on == ROUTES else "unavailable"


_NOWHERE: Final[frozenset[Route]] = frozenset()

_TABLE: Final[dict[Dialect, DialectCapabilities]] = {
    "vllm": DialectCapabilities(
        name="vllm",
        token_ids_on=ROUTES,
        sglext_ids_on=_NOWHERE,
        vllm_fields=frozenset(VLLM_ONLY_FIELDS),
        null_usage=False,
        null_ids=True,
        metrics_optional=False,
        version_gates_token_ids=True,
        tokenize_path="/tokenize",
        tokenize_adds_generation_prompt=True,
        metrics_vendors=("vllm",),
        answers_unstreamed=True,
        priority_scheduling=True,
    ),
    "sglang": DialectCapabilities(
        name="sglang",
        token_ids_on=frozenset(("completion",)),
        sglext_ids_on=frozenset(("chat",)),
        vllm_fields=frozenset(("return_token_ids", "kv_transfer_params")),
        null_usage=True,
        null_ids=False,
        metrics_optional=False,
        version_gates_token_ids=False,
        tokenize_path="/tokenize",
        tokenize_adds_generation_prompt=False,
        metrics_vendors=("sglang",),
    ),
    "openai": DialectCapabilities(
        name="openai",
        token_ids_on=_NOWHERE,
        sglext_ids_on=_NOWHERE,
        vllm_fields=frozenset(),
        null_usage=False,
        null_ids=False,
        metrics_optional=True,
        version_gates_token_ids=False,
        tokenize_path=None,
        tokenize_adds_generation_prompt=False,
        metrics_vendors=("vllm", "sglang"),
    ),
}


def capabilities(dialect: Dialect) -> DialectCapabilities:
    """The facts of `dialect`."""
    return _TABLE[dialect]


TOKEN_IDS_SINCE: Final = (0, 10, 2)
"""The vLLM release that brought `return_token_ids` (PROTOCOL.md §1)."""
_RELEASE: Final = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def vllm_supplies_token_ids(version: str) -> bool | None:
    """Whether a vLLM reporting `version` (its GET /version: "0.10.2rc1", "0.9.2+cu126")
    gives token IDs; None when the string is no release (a custom build, a placeholder
    such as "0.0.0-mock"): its requests will tell."""
    match = _RELEASE.match(version)
    if match is None:
        return None
    release = tuple(int(part) for part in match.groups())
    return None if release == (0, 0, 0) else release >= TOKEN_IDS_SINCE


def for_engine(
    dialect: Dialect,
    *,
    supplies_token_ids: bool | None = None,
    schedules_by_priority: bool = False,
) -> DialectCapabilities:
    """One engine's capabilities: its dialect's, less what the engine said it lacks.
    `supplies_token_ids`: what its GET /version said (`version_gates_token_ids`): a vLLM
    older than `return_token_ids` (0.10.2) sends no IDs, and is asked for none and
    served as a generic server is (output counted from usage and events, its
    `token_accounting` unavailable) instead of failing every request's ID check. None
    (not asked, or it cannot tell): the dialect's. `schedules_by_priority`: its
    configuration says it was started with priority scheduling (where its dialect can be)."""
    engine = capabilities(dialect)
    if supplies_token_ids is False and engine.version_gates_token_ids:
        engine = replace(
            engine,
            token_ids_on=_NOWHERE,
            vllm_fields=engine.vllm_fields - {"return_token_ids"},
        )
    if schedules_by_priority and engine.priority_scheduling:
        engine = replace(engine, schedules_by_priority=True)
    return engine
