"""The panels of Narwhal's Grafana dashboard, row by row: what each shows and how it
queries. scripts/grafana_dashboard.py turns them into Grafana's JSON model.

Every query selects `job=~"$job", instance=~"$instance"`; engine panels also
`engine=~"$engine"`. Traffic and latency are summed over the selected routers (with high
availability only the active one has traffic). Per-engine gauges are drawn per router,
since each router has its own view of an engine (up, eligible, scrape age), except the
engines' own numbers (running, waiting, KV use, drains), shown once per engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
ROUTERS = 'job=~"$job", instance=~"$instance"'
ENGINES = ROUTERS + ', engine=~"$engine"'
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass
class Panel:
    title: str
    queries: list[Query]
    unit: str = "short"
    description: str = ""
    kind: str = "timeseries"  # timeseries | stat | state-timeline
    width: int = 8
    height: int = 8
    stacked: bool = False
    show_names: bool = False  # stat: the series' legends rather than their values
    minimum: float | None = 0
    maximum: float | None = None
    mappings: list[dict[str, Any]] = field(default_factory=list)
    overrides: list[dict[str, Any]] = field(default_factory=list)
    thresholds: list[tuple[float | None, str]] = field(default_factory=lambda: [(None, "green")])
    threshold_lines: bool = False  # timeseries: draw the thresholds (the alerts' levels)


@dataclass(frozen=True)
class Row:
    title: str
    panels: list[Panel]


def rate(metric: str, selector: str = ROUTERS, by: str = "") -> str:
    aggregation = f"sum by ({by}) " if by else "sum"
    return f"{aggregation}(rate({metric}{{{selector}}}[{RATE}]))"


def quantile(q: float, histogram: str, selector: str = ROUTERS, by: str = "") -> str:
    labels = f"{by}, le" if by else "le"
    return (
        f"histogram_quantile({q}, sum by ({labels}) "
        f"(rate({histogram}_bucket{{{selector}}}[{RATE}])))"
    )


def quantiles(
    histogram: str, selector: str = ROUTERS, by: str = "", qs: tuple[float, ...] = (0.5, 0.99)
) -> list[Query]:
    prefix = f"{{{{{by}}}}} " if by else ""
    return [Query(quantile(q, histogram, selector, by), f"{prefix}p{q * 100:g}") for q in qs]


def color(fixed: str) -> dict[str, Any]:
    return {"id": "color", "value": {"mode": "fixed", "fixedColor": fixed}}


def binary_states(zero: tuple[str, str], one: tuple[str, str]) -> list[dict[str, Any]]:
    """Value mappings for a 0/1 gauge: (text, colour) for each."""
    return [
        {
            "type": "value",
            "options": {
                "0": {"text": zero[0], "color": zero[1], "index": 0},
                "1": {"text": one[0], "color": one[1], "index": 1},
            },
        }
    ]


def engine_max(metric: str) -> str:
    """An engine's own number (scraped from it), once however many routers read it."""
    return f"max by (engine) ({metric}{{{ENGINES}}})"


def outcomes_rate(outcome_matcher: str) -> str:
    return f"sum(rate(narwhal_outcomes_total{{{outcome_matcher}, {ROUTERS}}}[{RATE}]))"


# Both SLOs of the promise allow 1% (deploy/prometheus/narwhal-alerts.yaml): a burn rate
# of 1 spends a 30-day error budget in 30 days. The alerts page at 14.4 over both 1h and
# 5m, and open a ticket at 6 over both 6h and 30m; the panels draw those two levels.
SLO_BUDGET = 0.01
BURN_WINDOWS = ("5m", "30m", "1h", "6h")
BURN_THRESHOLDS: list[tuple[float | None, str]] = [(None, "green"), (6, "orange"), (14.4, "red")]


def burn_rate(metric: str, bad: str, window: str, selector: str = ROUTERS, by: str = "") -> str:
    """The share of `metric`'s increase that matches `bad` over `window`, as a multiple of
    the error budget."""
    aggregation = f"sum by ({by}) " if by else "sum"
    return (
        f"{aggregation}(rate({metric}{{{bad}, {selector}}}[{window}])) / "
        f"{aggregation}(rate({metric}{{{selector}}}[{window}])) / {SLO_BUDGET}"
    )


def burn_rates(metric: str, bad: str) -> list[Query]:
    return [Query(burn_rate(metric, bad, w), w) for w in BURN_WINDOWS]


# ---- The panels --------------------------------------------------------------------------

OVERVIEW = Row(
    "Overview",
    [
        Panel(
            "Router state",
            [Query(f"narwhal_router_state{{{ROUTERS}}} == 1", "{{instance}}: {{state}}", True)],
            kind="stat",
            height=5,
            show_names=True,
            description="Each router's state (narwhal_router_state): active admits traffic; "
            "standby and fenced are high availability's; maintenance, monitoring_degraded and "
            "shutting_down refuse with 503.",
            overrides=[
                {
                    "matcher": {"id": "byRegexp", "options": ".*: active"},
                    "properties": [color("green")],
                },
                {
                    "matcher": {"id": "byRegexp", "options": ".*: standby"},
                    "properties": [color("blue")],
                },
                {
                    "matcher": {
                        "id": "byRegexp",
                        "options": ".*: (fenced|maintenance|monitoring_degraded|shutting_down)",
                    },
                    "properties": [color("red")],
                },
            ],
        ),
        Panel(
            "Offered",
            [Query(rate("narwhal_offered_total"), "offered")],
            unit="reqps",
            kind="stat",
            height=5,
            width=4,
            description="Requests reaching a completion route, per second.",
        ),
        Panel(
            "Failing (upstream + internal errors)",
            [
                Query(
                    outcomes_rate('outcome=~"upstream_error|internal_error"')
                    + " / "
                    + rate("narwhal_offered_total"),
                    "failing",
                )
            ],
            unit="percentunit",
            kind="stat",
            height=5,
            width=4,
            thresholds=[(None, "green"), (0.01, "orange"), (0.05, "red")],
            description="Requests answered 502 upstream_error or 500 internal_error, over "
            "requests offered (the NarwhalHighErrorRatio alert).",
        ),
        Panel(
            "Eligible engines",
            [Query(f"sum by (instance) (narwhal_engine_eligible{{{ROUTERS}}})", "{{instance}}")],
            kind="stat",
            height=5,
            width=4,
            thresholds=[(None, "red"), (1, "green")],
            description="Engines placement may send new work to, per router (0: /ready says "
            "no_engines).",
        ),
        Panel(
            "Version",
            [Query(f"narwhal_build_info{{{ROUTERS}}}", "{{instance}}: {{version}}", True)],
            kind="stat",
            height=5,
            show_names=True,
            width=4,
            description="narwhal_build_info: which version each router runs.",
        ),
    ],
)


TTFT_MISSED = 'within_budget="false"'
KNOWN_CLASS = ROUTERS + ', class!="none"'
KNOWN_TENANT = ROUTERS + ', tenant!="none"'
PROMISE = Row(
    "The promise: SLO burn rates",
    [
        Panel(
            "TTFT budget: burn rate",
            burn_rates("narwhal_class_ttft_total", TTFT_MISSED),
            width=12,
            thresholds=BURN_THRESHOLDS,
            threshold_lines=True,
            description="Admitted requests whose first token missed admission.ttft_target_s, "
            "as a multiple of the 1% the SLO allows (99% within the budget), over each "
            "alert window. NarwhalTTFTBudgetBurnFast pages at 14.4 over both 1h and 5m, "
            "NarwhalTTFTBudgetBurnSlow opens a ticket at 6 over both 6h and 30m.",
        ),
        Panel(
            "Projection bound: burn rate",
            burn_rates("narwhal_ttft_bound_total", 'outcome="exceeded"'),
            width=12,
            thresholds=BURN_THRESHOLDS,
            threshold_lines=True,
            description="First tokens that came after the bound predictive admission held "
            "their projection to, as a multiple of the 1% the SLO allows, over each alert "
            "window (NarwhalProjectionBoundBurnFast, NarwhalProjectionBoundBurnSlow). "
            "Burning here and on the TTFT budget: the engines are slower than projected.",
        ),
        Panel(
            "TTFT budget burn rate by class (1h)",
            [
                Query(
                    burn_rate("narwhal_class_ttft_total", TTFT_MISSED, "1h", KNOWN_CLASS, "class"),
                    "{{class}}",
                )
            ],
            thresholds=BURN_THRESHOLDS,
            threshold_lines=True,
            description="The page's long window, by priority class: every admitted request "
            "is promised the same budget, whatever its class.",
        ),
        Panel(
            "TTFT budget burn rate by tenant (1h)",
            [
                Query(
                    burn_rate(
                        "narwhal_class_ttft_total", TTFT_MISSED, "1h", KNOWN_TENANT, "tenant"
                    ),
                    "{{tenant}}",
                )
            ],
            thresholds=BURN_THRESHOLDS,
            threshold_lines=True,
            description="The page's long window, by tenant: whose admitted requests miss.",
        ),
        Panel(
            "Healthy engines without a profile",
            [
                Query(
                    f"sum by (instance) ((narwhal_engine_profiled{{{ENGINES}}} == bool 0) "
                    f"* on (job, instance, engine) narwhal_engine_up{{{ENGINES}}})",
                    "{{instance}}",
                )
            ],
            thresholds=[(None, "green"), (1, "orange")],
            threshold_lines=True,
            description="Engines that pass their health checks but have no profile, per "
            "router: predictive admission places nothing on them (NarwhalEngineUnprofiled "
            "after 10 minutes). The Profiled panel below says which.",
        ),
        Panel(
            "Refused share by reason (predictive, 429)",
            [
                Query(
                    rate("narwhal_refused_total", by="reason")
                    + " / on () group_left "
                    + rate("narwhal_offered_total"),
                    "{{reason}}",
                )
            ],
            unit="percentunit",
            stacked=True,
            thresholds=[(None, "green"), (0.01, "orange")],
            description="Refusals over requests offered. prompt: the prompt alone is over "
            "the budget, which no capacity helps (NarwhalPromptsOverBudget over 1% for an "
            "hour); projected: the fleet is short for the load (NarwhalRefusalsSustained).",
        ),
        Panel(
            "Refused share by class and reason (429)",
            [
                Query(
                    rate("narwhal_class_refusals_total", KNOWN_CLASS, "class, reason")
                    + " / on (class) group_left "
                    + rate("narwhal_class_offered_total", KNOWN_CLASS, "class"),
                    "{{class}} {{reason}}",
                )
            ],
            unit="percentunit",
            description="Each class's 429s (capacity, quota and predictive) over its "
            "offered requests: the lower classes are refused first. The highest class over "
            "1% is NarwhalHighestClassRefused.",
        ),
        Panel(
            "Refused share by tenant and reason (429)",
            [
                Query(
                    rate("narwhal_class_refusals_total", KNOWN_TENANT, "tenant, reason")
                    + " / on (tenant) group_left "
                    + rate("narwhal_class_offered_total", KNOWN_TENANT, "tenant"),
                    "{{tenant}} {{reason}}",
                )
            ],
            unit="percentunit",
            description="Each tenant's 429s over its offered requests: tenant_quota is its "
            "own requests_per_min or tokens_per_min; projected, a tenant over its fair "
            "share under overload; prompt, its prompts alone over the budget.",
        ),
    ],
)

TRAFFIC = Row(
    "Traffic and outcomes",
    [
        Panel(
            "Offered and completed",
            [
                Query(rate("narwhal_offered_total"), "offered"),
                Query(outcomes_rate('outcome="completed"'), "completed"),
                Query(rate("narwhal_unsized_offered_total"), "unsized (body ended early)"),
            ],
            unit="reqps",
            description="Requests offered (narwhal_offered_total) and those completed.",
        ),
        Panel(
            "Outcomes",
            [Query(rate("narwhal_outcomes_total", by="outcome"), "{{outcome}}")],
            unit="reqps",
            stacked=True,
            description="Every offered request's terminal outcome (narwhal_outcomes_total), "
            "stacked: it adds up to the offered rate.",
        ),
        Panel(
            "Tokens",
            [
                Query(rate("narwhal_prompt_tokens_total", by="route"), "prompt {{route}}"),
                Query(rate("narwhal_completion_tokens_total", by="route"), "completion {{route}}"),
            ],
            unit="short",
            description="Prompt and completion tokens per second of the answers clients got, "
            "by route.",
        ),
        Panel(
            "Served latency (completed requests)",
            quantiles(
                "narwhal_request_duration_seconds",
                'completed="true", ' + ROUTERS,
                by="route",
                qs=(0.5, 0.9, 0.99),
            ),
            unit="s",
            width=12,
            description="Arrival to the end of the response of requests whose outcome is "
            "completed (narwhal_request_duration_seconds), by route.",
        ),
        Panel(
            "Time to any other outcome",
            quantiles(
                "narwhal_request_duration_seconds", 'completed="false", ' + ROUTERS, by="route"
            ),
            unit="s",
            width=12,
            description="How long requests that did not complete (refused, failed, expired, "
            "client gone) took to end.",
        ),
    ],
)

REFUSALS = Row(
    "Refusals and rejections",
    [
        Panel(
            "Refused by reason (predictive, 429)",
            [Query(rate("narwhal_refused_total", by="reason"), "{{reason}}")],
            unit="reqps",
            stacked=True,
            description="prompt: the prompt alone exceeds the TTFT budget; projected: the "
            "projected TTFT does.",
        ),
        Panel(
            "Rejected by reason (capacity, 429)",
            [Query(rate("narwhal_rejected_total", by="reason"), "{{reason}}")],
            unit="reqps",
            stacked=True,
            description="queue: the admission queue is full; retention: the router holds "
            "serving.max_retained requests.",
        ),
        Panel(
            "Expired by stage (504) and unavailable (503)",
            [
                Query(rate("narwhal_expired_total", by="stage"), "expired {{stage}}"),
                Query(outcomes_rate('outcome="unavailable"'), "unavailable"),
                Query(rate("narwhal_invalid_requests_total"), "invalid (4xx)"),
            ],
            unit="reqps",
            description="Deadlines by where they struck, 503s (no placement or the router not "
            "admitting) and malformed requests.",
        ),
        Panel(
            "Refusal latency",
            quantiles("narwhal_refusal_latency_seconds"),
            unit="s",
            description="Arrival to the 429 of predictive refusals.",
        ),
        Panel(
            "TTFT prediction error",
            quantiles("narwhal_ttft_prediction_error_ratio", qs=(0.5, 0.9, 0.99)),
            unit="percentunit",
            description="|measured - expected| / measured TTFT of admitted requests "
            "(predictive admission).",
        ),
        Panel(
            "TTFT projection factor",
            [
                Query(
                    f"narwhal_ttft_projection_factor{{{ROUTERS}}}",
                    "{{instance}} q{{quantile}}",
                )
            ],
            minimum=None,
            description="Measured over projected TTFT: 0.5 corrects the projection, 0.99 is the "
            "margin admission applies.",
        ),
    ],
)

LATENCY = Row(
    "Latency per engine",
    [
        Panel(
            "TTFT",
            quantiles("narwhal_ttft_seconds", ENGINES, by="engine"),
            unit="s",
            width=12,
            description="Time to first token by engine (in a disaggregated pair, the decode "
            "engine's, prefill included).",
        ),
        Panel(
            "TPOT",
            quantiles("narwhal_tpot_seconds", ENGINES, by="engine"),
            unit="s",
            width=12,
            description="Time per output token after the first, by engine.",
        ),
        Panel(
            "Prefill (disaggregated pairs)",
            quantiles("narwhal_prefill_seconds", ENGINES, by="engine"),
            unit="s",
            width=12,
            description="Sending a request to its prefill engine to that engine's answer, by "
            "prefill engine (only with role: prefill engines).",
        ),
        Panel(
            "Output tokens by engine",
            [Query(rate("narwhal_output_tokens_total", ENGINES, by="engine"), "{{engine}}")],
            unit="short",
            width=12,
            description="Output tokens relayed per second, by engine.",
        ),
    ],
)

ENGINE_HEALTH = Row(
    "Engines: health and eligibility",
    [
        Panel(
            "Up",
            [Query(f"narwhal_engine_up{{{ENGINES}}}", "{{engine}} @ {{instance}}")],
            kind="state-timeline",
            width=12,
            mappings=binary_states(("down", "red"), ("up", "green")),
            description="1 when the engine's last health checks passed (narwhal_engine_up).",
        ),
        Panel(
            "Eligible for placement",
            [Query(f"narwhal_engine_eligible{{{ENGINES}}}", "{{engine}} @ {{instance}}")],
            kind="state-timeline",
            width=12,
            mappings=binary_states(("out", "orange"), ("eligible", "green")),
            description="Healthy, serving the model, profiled (predictive), not drained, not "
            "in maintenance. Out but neither drained nor in maintenance: down or unprofiled.",
        ),
        Panel(
            "Drained and in maintenance",
            [
                Query(engine_max("narwhal_engine_drained") + " == 1", "{{engine}} drained"),
                Query(
                    engine_max("narwhal_engine_in_maintenance") + " == 1", "{{engine}} maintenance"
                ),
            ],
            kind="state-timeline",
            width=12,
            mappings=[{"type": "value", "options": {"1": {"text": "yes", "color": "blue"}}}],
            description="Engines an operator took out: POST /admin/engines/NAME/drain, "
            "POST /admin/maintenance.",
        ),
        Panel(
            "Scrape age",
            [Query(f"narwhal_engine_scrape_age_seconds{{{ENGINES}}}", "{{engine}} @ {{instance}}")],
            unit="s",
            width=12,
            description="Seconds since each engine's /metrics was last read; past "
            "fleet.stale_after_s the engine leaves placement.",
        ),
        Panel(
            "Probe failures",
            [
                Query(
                    rate("narwhal_engine_probe_failures_total", ENGINES, by="engine, probe"),
                    "{{engine}} {{probe}}",
                )
            ],
            unit="ops",
            description="Failed /health and /metrics probes per second.",
        ),
        Panel(
            "Engine failures",
            [
                Query(
                    rate("narwhal_engine_failures_total", ENGINES, by="engine, stage"),
                    "{{engine}} {{stage}}",
                )
            ],
            unit="ops",
            description="Attempts an engine failed: before_headers may be retried elsewhere, "
            "after_headers end the stream.",
        ),
        Panel(
            "Profiled",
            [Query(f"narwhal_engine_profiled{{{ENGINES}}}", "{{engine}} @ {{instance}}")],
            kind="state-timeline",
            mappings=binary_states(("unprofiled", "orange"), ("profiled", "green")),
            description="Predictive admission places only on profiled engines.",
        ),
    ],
)

ENGINE_LOAD = Row(
    "Engines: load and models",
    [
        Panel(
            "Running and waiting (engine's own)",
            [
                Query(engine_max("narwhal_engine_running"), "{{engine}} running"),
                Query(engine_max("narwhal_engine_waiting"), "{{engine}} waiting"),
            ],
            description="From each engine's last good /metrics scrape (the highest any router "
            "read).",
        ),
        Panel(
            "KV cache in use",
            [Query(engine_max("narwhal_engine_kv_usage"), "{{engine}}")],
            unit="percentunit",
            maximum=1,
            description="Fraction of each engine's KV cache in use (last good scrape; the "
            "highest any router read).",
        ),
        Panel(
            "Requests Narwhal has on each engine",
            [Query(f"narwhal_engine_requests{{{ENGINES}}}", "{{engine}} {{phase}} @ {{instance}}")],
            description="prefill: placed, prefill not done there; decode: past the first token.",
        ),
        Panel(
            "Backlog",
            [Query(f"narwhal_engine_backlog_seconds{{{ENGINES}}}", "{{engine}} @ {{instance}}")],
            unit="s",
            description="Prefill work Narwhal has placed on each engine, ahead of a new request "
            "(predictive).",
        ),
        Panel(
            "TPOT predicted and observed",
            [
                Query(
                    f"narwhal_engine_tpot_predicted_seconds{{{ENGINES}}}", "{{engine}} predicted"
                ),
                Query(f"narwhal_engine_tpot_observed_seconds{{{ENGINES}}}", "{{engine}} observed"),
            ],
            unit="s",
            description="What each engine's model predicts for one more request, beside what "
            "requests there saw.",
        ),
        Panel(
            "Drift from profile",
            [Query(f"narwhal_engine_drift{{{ENGINES}}}", "{{engine}} {{quantity}}")],
            minimum=None,
            description="Mean log(observed / profile) of prefill time and TPOT; > 0 is slower. "
            "Past the threshold the engine is re-profiled.",
        ),
        Panel(
            "Profiling runs and re-profiles",
            [
                Query(
                    f"sum by (engine) (increase(narwhal_engine_profile_attempts_total"
                    f"{{{ENGINES}}}[{RATE}]))",
                    "{{engine}} profiling runs",
                ),
                Query(
                    f"sum by (engine) (increase(narwhal_engine_reprofiles_total"
                    f"{{{ENGINES}}}[{RATE}]))",
                    "{{engine}} re-profiles after drift",
                ),
            ],
            width=24,
            description="Profiling runs started and re-profiles caused by drift.",
        ),
    ],
)

ADMISSION = Row(
    "Admission queue and slots",
    [
        Panel(
            "Admission queue",
            [Query(f"narwhal_admission_queue_depth{{{ROUTERS}}}", "{{instance}}")],
            description="Requests waiting for a prefill slot (admission.queue_limit bounds it).",
        ),
        Panel(
            "Slots in use",
            [
                Query(f"narwhal_prefill_slots_in_use{{{ROUTERS}}}", "prefill {{instance}}"),
                Query(f"narwhal_decode_slots_in_use{{{ROUTERS}}}", "decode {{instance}}"),
            ],
            description="Requests between dispatch and first token (prefill) and between first "
            "token and last event (decode); admission.phase_concurrency bounds them.",
        ),
        Panel(
            "Retained requests",
            [Query(f"narwhal_retained_requests{{{ROUTERS}}}", "{{instance}}")],
            description="Requests the router holds (serving.max_retained bounds it).",
        ),
        Panel(
            "Admission wait",
            quantiles("narwhal_admission_wait_seconds", qs=(0.5, 0.9, 0.99)),
            unit="s",
            width=24,
            description="Admission to a prefill slot (zero when one was free).",
        ),
    ],
)

PREFIX = Row(
    "Prefix cache (fleet.policy: cache_aware)",
    [
        Panel(
            "Hit ratio: predicted and the engine's",
            [
                Query(f"narwhal_prefix_predicted_hit_ratio{{{ENGINES}}}", "{{engine}} predicted"),
                Query(f"narwhal_prefix_engine_hit_ratio{{{ENGINES}}}", "{{engine}} engine"),
            ],
            unit="percentunit",
            maximum=1,
            description="Prompt tokens Narwhal predicted cached over those placed, beside the "
            "engine's own prefix-cache counters, over the same recent window. Far apart: the "
            "index has drifted (it is reset).",
        ),
        Panel(
            "Index fill",
            [
                Query(
                    f"narwhal_prefix_index_blocks{{{ENGINES}}} / "
                    f"narwhal_prefix_index_capacity_blocks{{{ENGINES}}}",
                    "{{engine}} @ {{instance}}",
                )
            ],
            unit="percentunit",
            maximum=1,
            description="Blocks each engine's index holds over what it may hold.",
        ),
        Panel(
            "Predicted cached share",
            [
                Query(
                    rate("narwhal_prefix_predicted_hit_tokens_total", ENGINES, by="engine")
                    + " / "
                    + rate("narwhal_prefix_placed_prompt_tokens_total", ENGINES, by="engine"),
                    "{{engine}}",
                ),
            ],
            unit="percentunit",
            maximum=1,
            width=4,
            description="Prompt tokens placed on each engine that Narwhal predicted cached, "
            "over the dashboard's interval.",
        ),
        Panel(
            "Index resets",
            [
                Query(
                    f"sum by (engine) (increase(narwhal_prefix_index_resets_total"
                    f"{{{ENGINES}}}[{RATE}]))",
                    "{{engine}}",
                ),
            ],
            width=4,
            description="Indexes forgotten: the engine restarted, or its own counters "
            "disagreed with the index for too long.",
        ),
    ],
)

PROCESS = Row(
    "Router process",
    [
        Panel(
            "CPU",
            [Query(f"rate(process_cpu_seconds_total{{{ROUTERS}}}[{RATE}])", "{{instance}}")],
            unit="percentunit",
            description="CPU of each router process (1 = one core: all an event loop gets).",
        ),
        Panel(
            "Resident memory",
            [Query(f"process_resident_memory_bytes{{{ROUTERS}}}", "{{instance}}")],
            unit="bytes",
        ),
        Panel(
            "File descriptors",
            [
                Query(f"process_open_fds{{{ROUTERS}}}", "open {{instance}}"),
                Query(f"process_max_fds{{{ROUTERS}}}", "max {{instance}}"),
            ],
            description="Open descriptors track client and engine connections.",
        ),
        Panel(
            "Event-loop lag",
            [
                Query(
                    quantile(0.5, "narwhal_event_loop_lag_seconds", by="instance"),
                    "{{instance}} p50",
                ),
                Query(
                    quantile(0.99, "narwhal_event_loop_lag_seconds", by="instance"),
                    "{{instance}} p99",
                ),
            ],
            unit="s",
            description="How late the event loop ran a callback due every 0.1 s: a blocked "
            "loop delays every stream at once.",
        ),
        Panel(
            "Event-loop tasks",
            [Query(f"narwhal_event_loop_tasks{{{ROUTERS}}}", "{{instance}}")],
            description="asyncio tasks alive (requests, streams, monitors); steady growth is a "
            "leak.",
        ),
        Panel(
            "Leadership revision",
            [Query(f"narwhal_router_leadership_revision{{{ROUTERS}}}", "{{instance}}")],
            description="The etcd revision at which each router won leadership (its fencing "
            "token); 0 while it does not hold it or without high availability. A step is a "
            "handover.",
        ),
        Panel(
            "Router state over time",
            [Query(f"narwhal_router_state{{{ROUTERS}}} == 1", "{{instance}} {{state}}")],
            kind="state-timeline",
            width=24,
            height=6,
            mappings=[{"type": "value", "options": {"1": {"text": "current", "color": "blue"}}}],
            description="Which state each router was in, when (narwhal_router_state).",
        ),
    ],
)

WITHIN_BUDGET = ROUTERS + ', within_budget="true"'
CLASSES = Row(
    "Priority classes and tenants",
    [
        Panel(
            "Offered by class",
            [Query(rate("narwhal_class_offered_total", by="class"), "{{class}}")],
            unit="reqps",
            stacked=True,
            description="X-Narwhal-Priority's class, clamped to the tenant's max_class (none: "
            "ended before it was known).",
        ),
        Panel(
            "Refused by class and reason (429)",
            [
                Query(
                    rate("narwhal_class_refusals_total", by="class, reason"),
                    "{{class}} {{reason}}",
                )
            ],
            unit="reqps",
            stacked=True,
            description="Every 429 by the request's class: the lower classes are refused "
            "first (projected), a tenant's quota as tenant_quota.",
        ),
        Panel(
            "TTFT attainment by class",
            [
                Query(
                    rate("narwhal_class_ttft_total", WITHIN_BUDGET, "class")
                    + " / "
                    + rate("narwhal_class_ttft_total", by="class"),
                    "{{class}}",
                )
            ],
            unit="percentunit",
            maximum=1,
            description="Completed requests whose first token came within admission.ttft_target_s.",
        ),
        Panel(
            "Offered by tenant",
            [Query(rate("narwhal_class_offered_total", by="tenant"), "{{tenant}}")],
            unit="reqps",
            stacked=True,
            description="By the tenant of each request's client key (default: keys that name "
            "none, or no client keys).",
        ),
        Panel(
            "Refused by tenant and reason (429)",
            [
                Query(
                    rate("narwhal_class_refusals_total", by="tenant, reason"),
                    "{{tenant}} {{reason}}",
                )
            ],
            unit="reqps",
            stacked=True,
            description="A tenant over its fair share is refused first under overload "
            "(projected); tenant_quota: its requests_per_min or tokens_per_min.",
        ),
        Panel(
            "Goodput by tenant",
            [
                Query(
                    rate("narwhal_class_ttft_total", WITHIN_BUDGET, "tenant"),
                    "{{tenant}}",
                )
            ],
            unit="reqps",
            stacked=True,
            description="Completed requests a second whose first token came within the budget.",
        ),
    ],
)

ROWS = [OVERVIEW, PROMISE, TRAFFIC, REFUSALS, CLASSES, LATENCY, ENGINE_HEALTH, ENGINE_LOAD,
        ADMISSION, PREFIX, PROCESS]  # fmt: skip
