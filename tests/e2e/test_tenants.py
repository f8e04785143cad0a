"""Priority classes and tenants through real processes (a router, `narwhal sim` engines):
X-Narwhal-Priority chosen, clamped and refused with a 400 naming it; each key's tenant;
tenant quotas answered 429 `tenant_quota_exceeded` with Retry-After and counted
`rejected{reason="tenant_quota"}`; the counts by class and tenant; GET /admin/tenants;
a reload that changes a quota live; and a vLLM started with `--scheduling-policy
priority` given each request's class as its `priority`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.conftest import MODEL, chat, fleet_config, metrics_of, send, settle, sim_process
from tests.e2e.test_reload import admin
from tests.metrics_text import series, total
from tests.processes import NarwhalProcess, router_process, write_router_config

KEY_A = "sk-team-a-0123456789"
KEY_B = "sk-team-b-0123456789"
KEY_PLAIN = "sk-plain-0123456789"


def tenant_config(sim: NarwhalProcess, requests_per_min: float = 3) -> dict[str, Any]:
    return fleet_config(
        [("s0", sim, "vllm")],
        serving={
            "api_keys": [
                {"key": KEY_A, "tenant": "team-a"},
                {"key": KEY_B, "tenant": "team-b"},
                KEY_PLAIN,
            ]
        },
        tenants={
            "team-a": {"max_class": "standard", "requests_per_min": requests_per_min},
            "team-b": {"weight": 2, "default_class": "critical"},
        },
    )


@pytest.fixture(scope="module")
def sim() -> Iterator[NarwhalProcess]:
    with sim_process("--time-scale", "0") as process:
        yield process


@pytest.fixture
def router(sim: NarwhalProcess, tmp_path: Path) -> Iterator[NarwhalProcess]:
    with router_process(tenant_config(sim), config_path=tmp_path / "narwhal.yaml") as process:
        yield process


def auth(key: str, priority: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}"}
    if priority is not None:
        headers["X-Narwhal-Priority"] = priority
    return headers


def by_class(values: dict[str, float], name: str, cls: str, tenant: str, **labels: str) -> float:
    return values.get(series(name, **{"class": cls, "tenant": tenant, **labels}), 0.0)


@pytest.mark.parametrize("value", ["gold", "", "critical, standard"])
async def test_an_unknown_or_malformed_class_is_a_400_naming_the_header(
    router: NarwhalProcess, value: str
) -> None:
    reply = await send(router.url, chat(max_tokens=2), auth(KEY_B, value))
    assert reply.status == 400
    error = reply.json()["error"]
    assert error["param"] == "X-Narwhal-Priority"
    assert error["type"] == "invalid_request_error"
    assert "critical, standard, sheddable" in error["message"]
    values = await metrics_of(router.url)
    assert by_class(values, "narwhal_class_outcomes_total", "none", "none", outcome="invalid")


async def test_each_request_is_counted_in_its_class_and_tenant_clamped_to_the_tenants_limit(
    router: NarwhalProcess,
) -> None:
    for key, priority in [(KEY_A, "critical"), (KEY_B, None), (KEY_PLAIN, "sheddable")]:
        reply = await send(router.url, chat(max_tokens=2), auth(key, priority))
        assert reply.status == 200, reply.raw
    values = await settle(router.url, lambda v: total(v, "narwhal_class_offered_total") >= 3)
    # team-a asked for critical and may use standard at most; team-b's default is critical.
    assert by_class(values, "narwhal_class_offered_total", "standard", "team-a") == 1
    assert by_class(values, "narwhal_class_offered_total", "critical", "team-a") == 0
    assert by_class(values, "narwhal_class_offered_total", "critical", "team-b") == 1
    assert by_class(values, "narwhal_class_offered_total", "sheddable", "default") == 1
    for cls, tenant in [("standard", "team-a"), ("critical", "team-b"), ("sheddable", "default")]:
        assert (
            by_class(values, "narwhal_class_outcomes_total", cls, tenant, outcome="completed") == 1
        )
        assert by_class(values, "narwhal_class_ttft_total", cls, tenant, within_budget="true") == 1
    # Offered equals the sum of outcomes, by class and tenant as in total.
    assert (
        total(values, "narwhal_class_offered_total")
        == total(values, "narwhal_class_outcomes_total")
        == values["narwhal_offered_total"]
    )


async def test_a_tenant_past_its_request_quota_gets_429_tenant_quota_exceeded(
    router: NarwhalProcess,
) -> None:
    for _ in range(3):
        assert (await send(router.url, chat(max_tokens=2), auth(KEY_A))).status == 200
    refused = await send(router.url, chat(max_tokens=2), auth(KEY_A))
    assert refused.status == 429
    error = refused.json()["error"]
    assert (error["code"], error["type"]) == ("tenant_quota_exceeded", "rate_limit_error")
    assert "team-a" in error["message"]
    retry_after = int(refused.headers["Retry-After"])
    assert 1 <= retry_after <= 20  # a request back within 20 s at 3 a minute
    # Another tenant is not held back by it.
    assert (await send(router.url, chat(max_tokens=2), auth(KEY_B))).status == 200
    values = await settle(router.url, lambda v: v.get("narwhal_offered_total", 0) >= 5)
    assert values[series("narwhal_rejected_total", reason="tenant_quota")] == 1
    assert values[series("narwhal_outcomes_total", outcome="rejected")] == 1
    assert (
        by_class(
            values, "narwhal_class_refusals_total", "standard", "team-a", reason="tenant_quota"
        )
        == 1
    )

    status, body = await admin(router, "GET", "/admin/tenants")
    assert status == 200
    assert [c["name"] for c in body["classes"]] == ["critical", "standard", "sheddable"]
    rows = {t["name"]: t for t in body["tenants"]}
    assert set(rows) == {"team-a", "team-b", "default"}
    quota = rows["team-a"]["quotas"]["requests_per_min"]
    assert quota["limit"] == 3 and quota["available"] < 1
    assert rows["team-a"]["max_class"] == "standard"
    assert rows["team-b"]["default_class"] == "critical" and rows["team-b"]["weight"] == 2
    assert rows["team-b"]["quotas"] == {"requests_per_min": None, "tokens_per_min": None}
    assert rows["team-b"]["work_tokens_per_s"] > 0
    status, body = await admin(router, "GET", "/admin/engines")
    (engine,) = body["engines"]
    assert engine["scores"]["decode_bound_by_class"] == {
        "critical": 0,
        "standard": 0,
        "sheddable": 0,
    }  # (all ended)


async def test_the_official_client_sees_the_quota_as_a_rate_limit_error(
    router: NarwhalProcess,
) -> None:
    client = openai.AsyncOpenAI(
        base_url=router.url + "/v1",
        api_key=KEY_A,
        max_retries=0,
        default_headers={"X-Narwhal-Priority": "sheddable"},
    )
    async with client:
        for _ in range(3):
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        with pytest.raises(openai.RateLimitError) as info:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
    assert info.value.code == "tenant_quota_exceeded"


async def test_a_reload_changes_a_tenants_quota_live(
    router: NarwhalProcess, sim: NarwhalProcess, tmp_path: Path
) -> None:
    for _ in range(3):
        assert (await send(router.url, chat(max_tokens=2), auth(KEY_A))).status == 200
    assert (await send(router.url, chat(max_tokens=2), auth(KEY_A))).status == 429
    write_router_config(tmp_path / "narwhal.yaml", tenant_config(sim, requests_per_min=600))
    status, body = await admin(router, "POST", "/admin/reload")
    assert status == 200, body
    # The bucket keeps its level (empty) and refills at the new rate: 10 a second, where
    # the old one would give one request in 20 s.
    await asyncio.sleep(0.5)
    replies = [await send(router.url, chat(max_tokens=2), auth(KEY_A)) for _ in range(3)]
    assert [r.status for r in replies] == [200, 200, 200]
    status, body = await admin(router, "GET", "/admin/tenants")
    quota = {t["name"]: t for t in body["tenants"]}["team-a"]["quotas"]["requests_per_min"]
    assert quota["limit"] == 600
    # The classes themselves are restart-only.
    changed = tenant_config(sim)
    changed["admission"]["classes"] = ["gold", "standard"]
    write_router_config(tmp_path / "narwhal.yaml", changed)
    status, body = await admin(router, "POST", "/admin/reload")
    assert status == 400 and any("admission.classes" in p for p in body["problems"])


async def test_a_vllm_with_priority_scheduling_is_sent_each_requests_class(
    tmp_path: Path,
) -> None:
    """The sim, like vLLM, refuses a nonzero `priority` unless started with
    `--scheduling-policy priority`: the router sends it only to an engine configured so."""
    with (
        sim_process("--time-scale", "0", "--scheduling-policy", "priority") as ordered,
        sim_process("--time-scale", "0") as fcfs,
    ):
        config = fleet_config([("p0", ordered, "vllm")])
        config["engines"][0]["scheduling_policy"] = "priority"
        with router_process(config) as router:
            reply = await send(router.url, chat(max_tokens=2), {"X-Narwhal-Priority": "sheddable"})
            assert reply.status == 200, reply.raw
        direct = await send(fcfs.url, chat(max_tokens=2, priority=2))
        assert direct.status == 400 and direct.json()["error"]["param"] == "priority"
        with router_process(fleet_config([("f0", fcfs, "vllm")])) as router:
            reply = await send(router.url, chat(max_tokens=2), {"X-Narwhal-Priority": "sheddable"})
            assert reply.status == 200, reply.raw  # no `priority` sent to it
        # Configured as priority-scheduled when it is not: the class does go, as
        # `priority` 2, and the engine's own 400 says so (critical's 0 it takes).
        misconfigured = fleet_config([("f0", fcfs, "vllm")])
        misconfigured["engines"][0]["scheduling_policy"] = "priority"
        with router_process(misconfigured) as router:
            refused = await send(
                router.url, chat(max_tokens=2), {"X-Narwhal-Priority": "sheddable"}
            )
            assert refused.status == 400, refused.raw
            assert "Got priority 2" in refused.json()["error"]["message"]
            taken = await send(router.url, chat(max_tokens=2), {"X-Narwhal-Priority": "critical"})
            assert taken.status == 200, taken.raw
