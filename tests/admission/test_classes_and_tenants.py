"""Priority classes and tenants, sans-IO: the header's class clamped to the tenant's,
the budget's share by class, reserved slots, and each tenant's token buckets (refill,
Retry-After, output charged after the fact, limits changed live)."""

from __future__ import annotations

import pytest

from narwhal.admission.classes import HEADER, PriorityClasses
from narwhal.admission.tenants import Tenants, TokenBucket
from narwhal.config import DEFAULT_TENANT, AdmissionConfig, TenantConfig
from narwhal.errors import InvalidRequest, TenantQuotaExceeded

CLASSES = PriorityClasses.from_config(AdmissionConfig(reserved_prefill={"critical": 4}))


def test_the_default_classes_are_critical_standard_sheddable_and_standard_is_the_default() -> None:
    assert CLASSES.names == ("critical", "standard", "sheddable")
    assert CLASSES.names[CLASSES.default] == "standard"
    custom = PriorityClasses.from_config(AdmissionConfig(classes=("gold", "bronze")))
    assert custom.names[custom.default] == "bronze"  # no standard: the lowest


@pytest.mark.parametrize(
    ("values", "highest", "rank"),
    [
        ([], 0, 1),  # no header: the default
        (["critical"], 0, 0),
        (["  Sheddable "], 0, 2),  # case and spaces aside
        (["critical"], 1, 1),  # clamped to what the tenant may use
        ([], 2, 2),  # a default above the tenant's highest is clamped too
    ],
)
def test_a_request_runs_in_the_class_it_asks_for_within_its_tenants_limit(
    values: list[str], highest: int, rank: int
) -> None:
    assert CLASSES.choose(values, default=1, highest=highest) == rank


@pytest.mark.parametrize("values", [["gold"], [""], ["critical", "critical"], ["0"]])
def test_an_unknown_class_or_a_malformed_header_is_a_400_naming_the_header(
    values: list[str],
) -> None:
    with pytest.raises(InvalidRequest) as info:
        CLASSES.choose(values, default=1, highest=0)
    assert info.value.status == 400 and info.value.param == HEADER == "X-Narwhal-Priority"


def test_each_lower_class_gets_a_smaller_share_of_the_budget_and_no_reserved_slot() -> None:
    assert [CLASSES.share(r) for r in range(3)] == pytest.approx([1.0, 0.75, 0.5625])
    assert [CLASSES.reserved_prefill(r) for r in range(3)] == [4, 0, 0]


def test_a_bucket_holds_a_minutes_worth_and_refills_continuously() -> None:
    bucket = TokenBucket(60, now=0.0)  # one a second
    for _ in range(60):
        assert bucket.take(1, now=0.0) == 0.0
    assert bucket.take(1, now=0.0) == pytest.approx(1.0)  # the next one in a second
    assert bucket.take(1, now=0.5) == pytest.approx(0.5)
    assert bucket.take(1, now=1.0) == 0.0
    assert bucket.level(1000.0) == 60  # never past its capacity


def test_output_charged_after_the_fact_may_take_the_bucket_below_zero() -> None:
    bucket = TokenBucket(600, now=0.0)  # 10 a second
    bucket.charge(700, now=0.0)
    assert bucket.level(0.0) == -100
    # Until it is back to what the next request needs (min(need, capacity)).
    assert bucket.take(50, now=0.0) == pytest.approx(15.0)


def tenants(**configs: TenantConfig) -> Tenants:
    return Tenants(configs, CLASSES, now=0.0)


def test_the_default_tenant_exists_undeclared_and_an_unknown_name_falls_back_to_it() -> None:
    registry = tenants(team_a=TenantConfig(weight=2))
    assert set(registry.names) == {"team_a", DEFAULT_TENANT}
    assert registry.resolve("gone") == DEFAULT_TENANT
    assert registry.rank("team_a", []) == 1 and registry.class_name(2) == "sheddable"
    assert registry.weight("team_a") == 2


def test_a_tenant_over_its_request_rate_gets_429_tenant_quota_exceeded_with_retry_after() -> None:
    registry = tenants(a=TenantConfig(requests_per_min=2))
    registry.offer("a", 0.0)
    registry.offer("a", 0.0)
    with pytest.raises(TenantQuotaExceeded) as info:
        registry.offer("a", 0.0)
    error = info.value
    assert (error.status, error.code, error.reason, error.outcome) == (
        429,
        "tenant_quota_exceeded",
        "tenant_quota",
        "rejected",
    )
    assert error.headers() == {"Retry-After": "30"}  # one request back in 30 s
    assert "Tenant a" in error.message and "2 requests a minute" in error.message
    registry.offer(DEFAULT_TENANT, 0.0)  # another tenant is not limited


def test_a_tenants_tokens_are_its_prompts_as_sized_and_its_output_as_produced() -> None:
    registry = tenants(a=TenantConfig(tokens_per_min=1200))  # 20 a second
    registry.sized("a", 1000, 0.0)
    registry.produced("a", 300, 0.0)
    with pytest.raises(TenantQuotaExceeded) as info:
        registry.sized("a", 200, 0.0)  # -100 held, 200 needed: 300 short, 15 s
    assert info.value.retry_after == 15
    registry.sized("a", 200, 15.0)


def test_a_reload_changes_weights_classes_and_limits_and_keeps_bucket_levels() -> None:
    registry = tenants(a=TenantConfig(requests_per_min=10))
    a = registry.get("a")
    for _ in range(8):
        registry.offer("a", 0.0)
    registry.reconfigure(
        {"a": TenantConfig(weight=3, requests_per_min=5, max_class="standard")}, CLASSES, 0.0
    )
    assert registry.get("a") is a and a.weight == 3 and a.highest == 1
    assert a.requests is not None and a.requests.level(0.0) == 2  # not refilled by a reload
    report = {row["name"]: row for row in registry.report(0.0, {"a": {"standard": 2}})}
    assert report["a"]["quotas"]["requests_per_min"] == {
        "limit": 5,
        "available": 2,
        "full_in_s": 36.0,
    }
    assert report["a"]["queued"] == {"standard": 2}
    assert report["a"]["fair_share"] == 0.75 and report["default"]["quotas"] == {
        "requests_per_min": None,
        "tokens_per_min": None,
    }


def test_a_tenant_is_over_its_share_only_past_its_weights_part_of_the_active_tenants() -> None:
    registry = tenants(a=TenantConfig(weight=1), b=TenantConfig(weight=3))
    registry.admitted("a", 1000, 0.0)
    assert registry.standing("a", 0.0) == "even"  # alone: everything is its share
    registry.admitted("b", 2000, 0.0)
    # a has a third of the work against a fair quarter; b two thirds against three.
    assert registry.standing("a", 0.0) == "over"
    assert registry.standing("b", 0.0) == "owed"
    registry.admitted("b", 2000, 0.0)
    assert registry.standing("a", 0.0) == "even"  # a fifth now: within a quarter


def test_a_tenants_standing_moves_its_classes_ranks_for_the_budget() -> None:
    ranks = [[CLASSES.standing_rank(r, s) for r in range(3)] for s in ("even", "owed", "over")]
    assert ranks == [[0, 1, 2], [0, 0.5, 1], [0, 4, 5]]
