"""Tenants (sans-IO): whose a request is, what share it is owed, and its rate limits.

A tenant is declared under `tenants:` (so metric labels stay bounded) and named by the
client keys that belong to it (`serving.api_keys: [{key_env: ..., tenant: team-a}]`); a
key that names none, and every request when there are no client keys, is the `default`
tenant's. Each tenant has

- a weight: its fair share, against the other active tenants', of the work admitted (in
  tokens: prompt and expected output), which the admission queue's weighted fair
  queueing keeps within a class (`queue.py`), and the predictive check under overload:
  a tenant over its share is admitted within less of the budget, and one within it
  while another is over within more (`standing`; `PriorityClasses.standing_rank`), so
  the tenant that floods is refused first;
- a highest class and a default class (`classes.py`);
- optional rate limits, each a token bucket that holds a minute's worth and refills
  continuously: `requests_per_min` is taken one a request as it is offered (a valid
  request, before sizing), `tokens_per_min` takes a request's prompt tokens once it is
  sized and its output tokens as it ends (so the bucket may go below zero, and the
  tenant then waits for the refill). A request that finds its bucket short is answered
  429 `tenant_quota_exceeded` with `Retry-After` the time the bucket takes to hold
  enough again, and counted `rejected{reason="tenant_quota"}`.

A reload (`reconfigure`) changes weights, classes and limits live: a bucket keeps its
level, cut to the new capacity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from narwhal.admission.classes import PriorityClasses
from narwhal.config import DEFAULT_TENANT, TenantConfig
from narwhal.errors import TenantQuotaExceeded
from narwhal.models.rate import DecayingRate

Standing = Literal["over", "owed", "even"]
# A tenant's share of the work admitted is measured over about this long.
SHARE_TAU_S: Final = 10.0
# Over its fair share: past its weight's share of the active tenants' by this factor.
SHARE_SLACK: Final = 1.1
# Active: admitted more than this part of every tenant's work, over SHARE_TAU_S.
ACTIVE_SHARE: Final = 0.01


class TokenBucket:
    """Holds up to `per_min` (a minute's worth), refilled at `per_min / 60` a second."""

    __slots__ = ("_at", "_level", "capacity", "rate")

    def __init__(self, per_min: float, now: float) -> None:
        self.capacity = per_min
        self.rate = per_min / 60.0
        self._level = per_min
        self._at = now

    def level(self, now: float) -> float:
        elapsed = max(0.0, now - self._at)
        return min(self.capacity, self._level + elapsed * self.rate)

    def take(self, amount: float, now: float, *, need: float | None = None) -> float:
        """Take `amount` when the bucket holds `need` (default: `amount`, at most its
        capacity); 0.0 when it did, else the seconds until it would."""
        level = self.level(now)
        wanted = min(amount if need is None else need, self.capacity)
        if level < wanted:
            return (wanted - level) / self.rate
        self._level, self._at = level - amount, now
        return 0.0

    def charge(self, amount: float, now: float) -> None:
        """Take `amount` whatever the bucket holds (output already produced)."""
        self._level, self._at = self.level(now) - amount, now

    def resize(self, per_min: float, now: float) -> None:
        level = self.level(now)
        self.capacity, self.rate = per_min, per_min / 60.0
        self._level, self._at = min(level, per_min), now


@dataclass(slots=True)
class Tenant:
    name: str
    weight: float
    highest: int  # the highest rank its requests may run at
    default: int  # their rank without the header
    requests: TokenBucket | None = None
    tokens: TokenBucket | None = None
    work: DecayingRate = field(default_factory=lambda: DecayingRate(tau_s=SHARE_TAU_S))


class Tenants:
    def __init__(
        self, tenants: Mapping[str, TenantConfig], classes: PriorityClasses, now: float
    ) -> None:
        self.classes = classes
        self._tenants: dict[str, Tenant] = {}
        self.reconfigure(tenants, classes, now)

    def reconfigure(
        self, tenants: Mapping[str, TenantConfig], classes: PriorityClasses, now: float
    ) -> None:
        """Serve by these declarations from now on (a reload); a tenant no longer
        declared is forgotten, its requests in flight run on."""
        self.classes = classes
        declared = dict(tenants)
        declared.setdefault(DEFAULT_TENANT, TenantConfig())
        kept = {}
        for name, config in declared.items():
            tenant = self._tenants.get(name)
            if tenant is None:
                tenant = Tenant(name, config.weight, 0, 0)
            self._configure(tenant, config, now)
            kept[name] = tenant
        self._tenants = kept

    def _configure(self, tenant: Tenant, config: TenantConfig, now: float) -> None:
        classes = self.classes
        tenant.weight = config.weight
        tenant.highest = 0 if config.max_class is None else classes.rank(config.max_class)
        default = (
            classes.default if config.default_class is None else classes.rank(config.default_class)
        )
        tenant.default = max(default, tenant.highest)
        tenant.requests = _bucket(tenant.requests, config.requests_per_min, now)
        tenant.tokens = _bucket(tenant.tokens, config.tokens_per_min, now)

    @property
    def names(self) -> Iterable[str]:
        return self._tenants.keys()

    def get(self, name: str) -> Tenant:
        """The tenant of that name (the default one for a name no longer declared: a key
        of a tenant a reload removed stops working with the key, not before)."""
        return self._tenants.get(name) or self._tenants[DEFAULT_TENANT]

    def resolve(self, name: str) -> str:
        """The name of the tenant `name` is served as (see `get`)."""
        return self.get(name).name

    def weight(self, name: str) -> float:
        return self.get(name).weight

    def class_name(self, rank: int) -> str:
        return self.classes.names[rank]

    def rank(self, name: str, header: Sequence[str]) -> int:
        """The rank a request of tenant `name` runs at, given its X-Narwhal-Priority values."""
        tenant = self.get(name)
        return self.classes.choose(header, default=tenant.default, highest=tenant.highest)

    def offer(self, name: str, now: float) -> None:
        """A request of the tenant's, before sizing: its request quota, or 429."""
        tenant = self.get(name)
        bucket = tenant.requests
        if bucket is None:
            return
        wait = bucket.take(1.0, now)
        if wait:
            raise _exceeded(tenant.name, f"{bucket.capacity:g} requests", wait)

    def sized(self, name: str, tokens: int, now: float) -> None:
        """Its prompt is sized: its token quota (the prompt's tokens), or 429."""
        tenant = self.get(name)
        bucket = tenant.tokens
        if bucket is None:
            return
        wait = bucket.take(float(tokens), now)
        if wait:
            raise _exceeded(tenant.name, f"{bucket.capacity:g} tokens", wait)

    def produced(self, name: str, tokens: int, now: float) -> None:
        """Output tokens a request of the tenant's produced (its token quota)."""
        tenant = self.get(name)
        if tenant.tokens is not None and tokens > 0:
            tenant.tokens.charge(float(tokens), now)

    def admitted(self, name: str, work: float, now: float) -> None:
        """A request of the tenant's was admitted with this much work (tokens)."""
        self.get(name).work.add(work, now)

    def standing(self, name: str, now: float) -> Standing:
        """Where the tenant stands against its fair share of the work admitted lately:
        `over` it (with at least one other tenant active: alone, all of it is its share),
        `owed` (within it, while another tenant is over its own), or `even` (no tenant
        over its share)."""
        rates = {t.name: t.work.value(now) for t in self._tenants.values()}
        total = sum(rates.values())
        if total <= 0:
            return "even"
        active = [t for t in self._tenants.values() if rates[t.name] > ACTIVE_SHARE * total]
        if len(active) < 2:
            return "even"
        weights = sum(t.weight for t in active)
        over = {t.name for t in active if rates[t.name] > SHARE_SLACK * t.weight / weights * total}
        tenant = self.get(name)
        if tenant.name in over:
            return "over"
        return "owed" if over else "even"

    def report(self, now: float, queued: Mapping[str, Mapping[str, int]]) -> list[dict[str, Any]]:
        """Each tenant as `GET /admin/tenants` shows it; `queued`: by tenant, its queued
        requests by class name."""
        names = self.classes.names
        total = sum(t.work.value(now) for t in self._tenants.values())
        weights = sum(t.weight for t in self._tenants.values())
        rows = []
        for tenant in self._tenants.values():
            work = tenant.work.value(now)
            rows.append(
                {
                    "name": tenant.name,
                    "weight": tenant.weight,
                    "fair_share": round(tenant.weight / weights, 4),
                    "max_class": names[tenant.highest],
                    "default_class": names[tenant.default],
                    "work_tokens_per_s": round(work, 3),
                    "share": round(work / total, 4) if total > 0 else None,
                    "queued": dict(queued.get(tenant.name, {})),
                    "quotas": {
                        "requests_per_min": _quota(tenant.requests, now),
                        "tokens_per_min": _quota(tenant.tokens, now),
                    },
                }
            )
        return rows


def _bucket(bucket: TokenBucket | None, per_min: float | None, now: float) -> TokenBucket | None:
    if per_min is None:
        return None
    if bucket is None:
        return TokenBucket(per_min, now)
    bucket.resize(per_min, now)
    return bucket


def _quota(bucket: TokenBucket | None, now: float) -> dict[str, float] | None:
    if bucket is None:
        return None
    level = bucket.level(now)
    return {
        "limit": bucket.capacity,
        "available": round(level, 3),
        "full_in_s": round((bucket.capacity - level) / bucket.rate, 3),
    }


def _exceeded(tenant: str, limit: str, wait_s: float) -> TenantQuotaExceeded:
    retry_after = max(1, math.ceil(wait_s))
    return TenantQuotaExceeded(
        f"Tenant {tenant} is over its limit of {limit} a minute; retry in {retry_after} s.",
        retry_after=retry_after,
    )
