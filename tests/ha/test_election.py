"""Leader election and self-fencing (`narwhal.ha.election`), sans-IO on a fake clock.

What users depend on: a router admits only while it can prove that etcd keeps its lease,
that is until (the send time of the latest grant or keepalive etcd confirmed) + ttl -
margin; it fences itself at exactly that instant, whether or not anything ticks; a fenced
router first asks whether it still leads; and two routers never admit at the same time.

The examples walk the machine through each transition. The properties drive random
histories through it: one judges every admission by what etcd told the router, whatever
it told; the others run one or two routers against a small model of etcd (a lease expires
`ttl` after etcd processed its grant or latest keepalive and is revoked, deleting the
leader key, at some moment after that; the key is created only if absent).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.ha.election import Action, Campaign, Election, Grant, Pause, Renew, Timing, Watch

TIMING = Timing(ttl_s=10, renew_interval_s=3.0, margin_s=1.0, retry_s=0.25)
TTL = 10.0
VALID_FOR = TTL - TIMING.margin_s  # how long a confirmed send proves the lease: 9 s
LEASE = 101
NEW_LEASE = 102
OTHER_LEASE = 202
REVISION = 7


def just_before(t: float) -> float:
    return math.nextafter(t, -math.inf)


def role(election: Election) -> str:
    return election.role  # read afresh: the machine changes it behind mypy's narrowing


def with_lease(
    granted_at: float = 0.0, answered_at: float | None = None, ttl: float = TTL
) -> Election:
    """A standby that asked for a lease at `granted_at` and was granted LEASE."""
    election = Election(TIMING, granted_at)
    assert election.next_action(granted_at) == Grant(TIMING.ttl_s)
    answered_at = granted_at if answered_at is None else answered_at
    election.granted(LEASE, ttl, granted_at, answered_at)
    return election


def active(ttl: float = TTL) -> Election:
    """A router that won at REVISION at 0, with LEASE granted (for `ttl`) at 0."""
    election = with_lease(ttl=ttl)
    assert election.next_action(0.0) == Campaign(LEASE)
    election.campaigned(True, REVISION, 0.0)
    assert role(election) == "active"
    return election


def renew(
    election: Election,
    sent_at: float,
    answered_at: float | None = None,
    ttl_left: float = TTL,
    holder: tuple[int | None, int | None] = (LEASE, REVISION),
) -> None:
    """Send the renewal due at `sent_at` and answer it: the lease lives `ttl_left` more,
    and the key is `holder`'s (lease, create revision)."""
    assert election.next_action(sent_at) == Renew(LEASE, REVISION)
    answered_at = sent_at if answered_at is None else answered_at
    election.renewed(ttl_left, holder[0], holder[1], sent_at, answered_at)


def fenced() -> Election:
    """A router active since 0 that reached its fence time (9) with no renewal confirmed:
    it has just sent, at 9, the renewal that asks whether the key is still its own."""
    election = active()
    assert election.next_action(VALID_FOR) == Renew(LEASE, REVISION)
    assert role(election) == "fenced"
    return election


def fail_every_call(
    election: Election, start: float, end: float, latency: float
) -> Iterator[float]:
    """Drive the router from `start` to `end` with every etcd call failing after `latency`,
    yielding each moment a failure is reported."""
    now = start
    while now < end:
        action = election.next_action(now)
        if isinstance(action, Pause):
            now = action.until
            continue
        now += latency
        election.failed("timed out", now)
        yield now


# --- the happy path ------------------------------------------------------------------------


def test_a_new_router_is_a_standby_that_asks_for_a_lease() -> None:
    election = Election(TIMING, 0.0)
    assert role(election) == "standby"
    assert not election.admitting(0.0)
    assert election.fence_at is None
    assert election.next_action(0.0) == Grant(10)


def test_a_granted_lease_is_used_to_campaign_at_once() -> None:
    election = with_lease(granted_at=0.0, answered_at=0.5)
    assert election.lease == LEASE
    assert election.next_action(0.5) == Campaign(LEASE)
    assert not election.admitting(0.5)


def test_winning_the_campaign_makes_the_router_active_at_its_revision() -> None:
    election = active()
    assert role(election) == "active"
    assert election.revision == REVISION
    assert election.admitting(0.0)
    assert "revision 7" in election.why


def test_after_winning_the_lease_is_proven_from_the_grant_send_not_its_answer() -> None:
    election = with_lease(granted_at=0.0, answered_at=2.0)
    assert election.next_action(2.0) == Campaign(LEASE)
    election.campaigned(True, REVISION, 3.0)
    assert election.fence_at == 0.0 + VALID_FOR
    assert election.admitting(just_before(VALID_FOR))
    assert not election.admitting(VALID_FOR)


def test_an_active_router_renews_at_once_then_every_renew_interval_from_the_send() -> None:
    election = active()
    assert election.next_action(0.0) == Renew(LEASE, REVISION)
    election.renewed(TTL, LEASE, REVISION, 0.0, 0.5)
    assert election.next_action(0.5) == Pause(3.0)
    assert election.next_action(just_before(3.0)) == Pause(3.0)
    assert election.next_action(3.0) == Renew(LEASE, REVISION)
    election.renewed(TTL, LEASE, REVISION, 3.0, 4.0)  # answered late: still dated from 3
    assert election.next_action(4.0) == Pause(6.0)


def test_a_renewal_answered_late_extends_validity_only_from_its_send_time() -> None:
    election = active()
    renew(election, sent_at=0.0)
    renew(election, sent_at=3.0, answered_at=8.0)
    assert election.fence_at == 3.0 + VALID_FOR  # 12, not 8 + 9
    assert election.admitting(just_before(12.0))
    assert not election.admitting(12.0)


def test_fencing_follows_the_ttl_etcd_granted_when_it_exceeds_the_one_asked() -> None:
    election = active(ttl=15.0)
    assert election.fence_at == 14.0
    renew(election, sent_at=2.0, ttl_left=15.0)
    assert election.fence_at == 16.0


def test_a_renewal_is_not_trusted_beyond_the_granted_ttl() -> None:
    election = active()
    renew(election, sent_at=1.0, ttl_left=60.0)
    assert election.fence_at == 1.0 + VALID_FOR


def test_a_renewal_answered_with_a_shorter_ttl_keeps_the_validity_already_proven() -> None:
    election = active()  # proven until 9 by the grant sent at 0
    renew(election, sent_at=1.0, ttl_left=2.0)  # proves only until 1 + 2 - 1 = 2
    assert election.fence_at == VALID_FOR
    assert election.admitting(5.0)


# --- fencing -------------------------------------------------------------------------------


def test_failing_renewals_stop_admission_exactly_at_last_confirmed_send_plus_validity() -> None:
    election = active()
    renew(election, sent_at=0.0)
    renew(election, sent_at=3.0, answered_at=3.5)  # the last one confirmed
    assert election.fence_at == 3.0 + VALID_FOR
    reports = 0
    for now in fail_every_call(election, start=3.5, end=14.0, latency=0.1):
        reports += 1
        if now < 12.0:
            assert role(election) == "active"
            assert election.admitting(now)
            assert election.admitting(just_before(12.0))
            assert not election.admitting(12.0)
        else:
            assert role(election) == "fenced"
            assert not election.admitting(now)
    assert reports > 5


def test_a_renewal_never_answered_stops_admission_exactly_at_the_fence_time() -> None:
    election = active()
    renew(election, sent_at=0.0)
    renew(election, sent_at=3.0, answered_at=3.5)
    assert election.next_action(6.0) == Renew(LEASE, REVISION)  # sent; no answer ever comes
    assert election.fence_at == 12.0
    assert election.admitting(just_before(12.0))
    assert not election.admitting(12.0)  # no tick needed
    assert not election.admitting(1e9)


def test_tick_at_the_fence_time_fences_the_router() -> None:
    election = active()
    election.tick(just_before(VALID_FOR))
    assert role(election) == "active"
    election.tick(VALID_FOR)
    assert role(election) == "fenced"
    assert election.fence_at is None
    assert not election.admitting(VALID_FOR)
    assert "no lease renewal confirmed within 9 s" in election.why


def test_next_action_at_the_fence_time_fences_and_asks_at_once_whether_the_key_is_ours() -> None:
    election = active()
    renew(election, sent_at=0.0)
    assert election.next_action(8.0) == Renew(LEASE, REVISION)
    election.failed("timed out", 8.5)
    assert role(election) == "active"
    assert election.next_action(VALID_FOR) == Renew(LEASE, REVISION)
    assert role(election) == "fenced"


def test_a_failure_reported_after_the_fence_time_fences_the_router() -> None:
    election = active()
    assert election.next_action(0.0) == Renew(LEASE, REVISION)
    election.failed("timed out", 9.5)
    assert role(election) == "fenced"
    assert not election.admitting(9.5)


def test_a_renewal_sent_before_the_fence_and_confirmed_after_it_makes_the_router_active() -> None:
    election = active()
    assert election.next_action(8.5) == Renew(LEASE, REVISION)
    election.tick(VALID_FOR)  # the fence timer fires while the renewal is in flight
    assert role(election) == "fenced"
    election.renewed(TTL, LEASE, REVISION, 8.5, 9.5)
    assert role(election) == "active"
    assert election.fence_at == 8.5 + VALID_FOR
    assert election.admitting(9.5)


def test_a_renewal_confirmed_after_its_own_validity_does_not_make_the_router_admit() -> None:
    election = active()
    assert election.next_action(8.5) == Renew(LEASE, REVISION)
    election.tick(VALID_FOR)
    election.renewed(TTL, LEASE, REVISION, 8.5, 17.5)  # valid until 17.5: over as it arrives
    assert role(election) == "fenced"
    assert not election.admitting(17.5)
    assert election.next_action(17.5) == Renew(LEASE, REVISION)


def test_an_active_router_that_finds_the_key_someone_elses_stops_admitting_at_once() -> None:
    election = active()
    renew(election, sent_at=0.0, answered_at=0.5, holder=(OTHER_LEASE, REVISION + 1))
    assert role(election) == "standby"
    assert election.revision is None
    assert not election.admitting(0.5)
    assert election.fence_at is None


# --- a fenced router finds its way back ----------------------------------------------------


def test_a_fenced_router_still_holding_the_key_is_active_again_at_the_same_revision() -> None:
    election = fenced()
    election.renewed(TTL, LEASE, REVISION, VALID_FOR, 9.2)
    assert role(election) == "active"
    assert election.revision == REVISION
    assert election.fence_at == VALID_FOR + VALID_FOR
    assert election.admitting(9.2)
    assert election.next_action(9.2) == Pause(VALID_FOR + 3.0)


@pytest.mark.parametrize("answer", ["ttl 0", "lease not found"])
def test_a_fenced_router_whose_lease_is_gone_becomes_standby_and_grants_a_new_lease(
    answer: str,
) -> None:
    election = fenced()
    if answer == "ttl 0":
        election.renewed(0.0, None, None, VALID_FOR, 9.2)
    else:
        election.lease_missing(9.2)
    assert role(election) == "standby"
    assert (election.lease, election.revision) == (None, None)
    assert not election.admitting(9.2)
    assert election.next_action(9.2) == Grant(10)
    election.granted(NEW_LEASE, TTL, 9.2, 9.3)
    assert election.next_action(9.3) == Campaign(NEW_LEASE)


@pytest.mark.parametrize(
    "holder",
    [(OTHER_LEASE, REVISION + 1), (LEASE, REVISION + 1), (None, None)],
    ids=["another lease", "our lease at another revision", "no key"],
)
def test_a_fenced_router_whose_key_is_not_its_own_campaigns_with_its_live_lease(
    holder: tuple[int | None, int | None],
) -> None:
    election = fenced()
    election.renewed(TTL, holder[0], holder[1], VALID_FOR, 9.2)
    assert role(election) == "standby"
    assert (election.lease, election.revision) == (LEASE, None)  # the lease lives
    assert not election.admitting(9.2)
    assert election.next_action(9.2) == Campaign(LEASE)
    election.campaigned(True, 12, 9.3)
    assert (role(election), election.revision) == ("active", 12)
    assert election.fence_at == VALID_FOR + VALID_FOR  # the keepalive proved the lease


def test_a_fenced_router_that_cannot_reach_etcd_stays_fenced_and_backs_off() -> None:
    election = fenced()
    election.failed("refused", 9.1)
    assert role(election) == "fenced"
    retry_at = 9.1 + TIMING.retry_s
    assert election.next_action(9.1) == Pause(retry_at)
    assert election.next_action(retry_at) == Renew(LEASE, REVISION)
    election.failed("refused", retry_at)
    assert election.next_action(retry_at) == Pause(retry_at + 2 * TIMING.retry_s)
    assert not election.admitting(retry_at)


# --- standby -------------------------------------------------------------------------------


def test_a_lost_campaign_watches_the_key_once_then_campaigns_again() -> None:
    election = with_lease()
    assert election.next_action(0.0) == Campaign(LEASE)
    election.campaigned(False, 5, 0.1)
    assert role(election) == "standby"
    assert election.next_action(0.1) == Watch(5, until=0.1 + TIMING.renew_interval_s)
    election.watched(2.0)
    assert election.next_action(2.0) == Campaign(LEASE)
    election.campaigned(False, 6, 2.1)
    assert election.next_action(2.1) == Watch(6, until=2.1 + TIMING.renew_interval_s)
    assert not election.admitting(2.1)


def test_a_standby_whose_lease_validity_passed_while_watching_grants_a_new_one() -> None:
    election = with_lease()
    assert election.next_action(0.0) == Campaign(LEASE)
    election.campaigned(False, 5, 0.1)
    assert isinstance(election.next_action(0.1), Watch)
    election.watched(VALID_FOR)
    assert election.next_action(VALID_FOR) == Grant(10)


@pytest.mark.parametrize("failing", ["grant", "campaign", "watch"])
def test_a_standby_that_cannot_reach_etcd_is_fenced_until_etcd_answers(failing: str) -> None:
    election = Election(TIMING, 0.0)
    assert election.next_action(0.0) == Grant(10)
    if failing != "grant":
        election.granted(LEASE, TTL, 0.0, 0.0)
        assert election.next_action(0.0) == Campaign(LEASE)
    if failing == "watch":
        election.campaigned(False, 5, 0.0)
        assert isinstance(election.next_action(0.0), Watch)
    election.failed("connection refused", 0.1)
    assert role(election) == "fenced"
    assert "connection refused" in election.why
    assert not election.admitting(0.1)
    retry_at = 0.1 + TIMING.retry_s
    assert election.next_action(0.1) == Pause(retry_at)
    retry = election.next_action(retry_at)
    if failing == "grant":
        assert retry == Grant(10)
        election.granted(LEASE, TTL, retry_at, 0.5)
    else:
        assert retry == Campaign(LEASE)
        election.campaigned(False, 5, 0.5)
    assert role(election) == "standby"
    assert not election.admitting(0.5)


def test_failed_calls_back_off_doubling_from_retry_up_to_the_renew_interval() -> None:
    election = Election(TIMING, 0.0)
    failures = list(fail_every_call(election, start=0.0, end=30.0, latency=0.0))
    waits = [later - earlier for earlier, later in itertools.pairwise(failures)]
    assert waits[:7] == [0.25, 0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_an_etcd_answer_resets_the_backoff() -> None:
    election = Election(TIMING, 0.0)
    for _ in fail_every_call(election, start=0.0, end=5.0, latency=0.0):
        pass
    now = 5.0
    while not isinstance(action := election.next_action(now), Grant):
        assert isinstance(action, Pause)
        now = action.until
    election.granted(LEASE, TTL, now, now)
    assert election.next_action(now) == Campaign(LEASE)
    election.failed("timed out", now)
    assert election.next_action(now) == Pause(now + TIMING.retry_s)


def test_a_campaign_with_a_lease_etcd_no_longer_knows_grants_a_new_lease() -> None:
    election = with_lease()
    assert election.next_action(1.0) == Campaign(LEASE)
    election.lease_missing(1.1)
    assert role(election) == "standby"
    assert election.next_action(1.1) == Grant(10)


# --- a late win ----------------------------------------------------------------------------


def test_a_campaign_won_after_the_lease_validity_passed_is_fenced_then_renews() -> None:
    election = with_lease()
    assert election.next_action(8.5) == Campaign(LEASE)
    election.campaigned(True, REVISION, VALID_FOR)  # answered exactly at the validity's end
    assert role(election) == "fenced"
    assert election.revision == REVISION
    assert not election.admitting(VALID_FOR)
    assert election.fence_at is None
    assert election.next_action(VALID_FOR) == Renew(LEASE, REVISION)
    election.renewed(TTL, LEASE, REVISION, VALID_FOR, 9.1)
    assert role(election) == "active"
    assert election.fence_at == VALID_FOR + VALID_FOR


def test_a_campaign_won_just_before_the_validity_ends_is_active_until_it_ends() -> None:
    election = with_lease()
    assert election.next_action(8.5) == Campaign(LEASE)
    election.campaigned(True, REVISION, just_before(VALID_FOR))
    assert role(election) == "active"
    assert election.fence_at == VALID_FOR


# --- resigning -----------------------------------------------------------------------------


def lost_campaign() -> Election:
    election = with_lease()
    assert election.next_action(0.0) == Campaign(LEASE)
    election.campaigned(False, 5, 0.0)
    return election


RESIGNING: dict[str, tuple[Callable[[], Election], int | None]] = {
    "active": (active, LEASE),
    "fenced": (fenced, LEASE),
    "standby with a lease": (lost_campaign, LEASE),
    "standby without a lease": (lambda: Election(TIMING, 0.0), None),
}


@pytest.mark.parametrize("state", list(RESIGNING))
def test_resigning_returns_the_lease_and_stops_for_good(state: str) -> None:
    make, lease = RESIGNING[state]
    election = make()
    assert election.resign() == lease
    assert (election.lease, election.revision, election.fence_at) == (None, None, None)
    assert role(election) != "active"
    for now in (0.0, 1.0, VALID_FOR, 100.0, 1e9):
        assert election.next_action(now) == Pause(math.inf)
        assert not election.admitting(now)
    assert election.resign() is None


def test_a_resigned_router_never_admits_again_even_if_a_late_answer_arrives() -> None:
    election = fenced()  # its renewal, sent at 9, is in flight
    election.resign()
    election.renewed(TTL, None, None, VALID_FOR, 9.1)  # the key is gone: the lease was revoked
    assert not election.admitting(9.1)
    assert role(election) != "active"


# --- the timing's checks -------------------------------------------------------------------


@pytest.mark.parametrize(
    "timing",
    [
        pytest.param(Timing(0, 0.1, 0.1, 0.1), id="ttl below 1 s"),
        pytest.param(Timing(10, 3.0, 10.0, 0.25), id="margin equal to the ttl"),
        pytest.param(Timing(10, 3.0, 11.0, 0.25), id="margin above the ttl"),
        pytest.param(Timing(10, 3.0, 0.0, 0.25), id="no margin"),
        pytest.param(Timing(10, 3.0, -1.0, 0.25), id="negative margin"),
        pytest.param(Timing(10, 9.0, 1.0, 0.25), id="renewals due at the fence time"),
        pytest.param(Timing(10, 9.5, 1.0, 0.25), id="renewals due after the fence time"),
        pytest.param(Timing(10, 0.0, 1.0, 0.25), id="no renew interval"),
        pytest.param(Timing(10, 3.0, 1.0, 0.0), id="no retry delay"),
    ],
)
def test_timings_that_cannot_be_safe_are_refused(timing: Timing) -> None:
    with pytest.raises(ValueError):
        timing.check()
    with pytest.raises(ValueError):
        Election(timing, 0.0)


def test_tight_but_sensible_timings_are_accepted() -> None:
    TIMING.check()
    Timing(ttl_s=1, renew_interval_s=0.4, margin_s=0.5, retry_s=0.01).check()


# --- properties: random histories ----------------------------------------------------------

T = TypeVar("T")
HISTORY = 1000  # the most bytes of decisions in one history
SPECIAL_DELAYS = [0.0, 0.001, 0.1, 0.25, 1.0, 3.0, 9.0, 12.0]


class OutOfChoices(Exception):
    """The history's bytes are spent: it ends here."""


class Choices:
    """The decisions of one random history, decoded from bytes hypothesis draws at once.

    One draw per history keeps hundreds of long histories fast, and hypothesis still
    shrinks them: fewer bytes, and smaller ones, which pick the first option of a choice
    and make the rare events (`chance`) not happen.
    """

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def byte(self) -> int:
        if self._at >= len(self._data):
            raise OutOfChoices
        self._at += 1
        return self._data[self._at - 1]

    def pick(self, options: Sequence[T]) -> T:
        return options[self.byte() % len(options)]

    def chance(self, in_256: int) -> bool:
        return self.byte() >= 256 - in_256

    def delay(self, scale: float) -> float:
        """0 to 12 s (times `scale`), mostly short, often one that matters: none, the
        renew interval, the ttl less the margin."""
        b = self.byte()
        if b < 64:
            return scale * SPECIAL_DELAYS[b % len(SPECIAL_DELAYS)]
        fraction = (((b - 64) << 8) | self.byte()) / (192 << 8)
        return scale * 12.0 * fraction**3


def later(choices: Choices, now: float, boundaries: Iterable[float | None], scale: float) -> float:
    """A moment after `now`: after a random delay, or exactly at (or just before) one of
    the `boundaries` ahead, where fencing and expiry decide."""
    ahead = sorted({b for b in boundaries if b is not None and now < b < math.inf})
    if ahead and choices.chance(48):
        boundary = choices.pick(ahead)
        return choices.pick([boundary, max(now, just_before(boundary))])
    return now + choices.delay(scale)


# --- what one router was told, whatever it was ---------------------------------------------


@dataclass
class Told:
    """What etcd told one router, by which to judge its admissions."""

    # lease -> (send time, ttl) of each grant or keepalive etcd answered with the lease alive
    alive: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    granted_ttl: dict[int, float] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)  # leases etcd said it no longer has
    key: tuple[int | None, int | None] | None = None  # (lease, create revision), last heard


def assert_admits_only_what_it_was_told(election: Election, told: Told, now: float) -> None:
    if role(election) == "active":
        assert election.fence_at is not None
        assert election.admitting(now) == (now < election.fence_at)
    if not election.admitting(now):
        return
    lease, margin = election.lease, TIMING.margin_s
    assert lease is not None and lease not in told.gone
    assert told.key == (lease, election.revision), "admits though the key was not its own"
    assert any(now < s + ttl - margin for s, ttl in told.alive.get(lease, [])), (
        f"admits at {now} with no confirmed send since {now - VALID_FOR}"
    )


RENEWAL_ANSWERS = [
    "ours",
    "failed",
    "ours",
    "ttl 0",
    "ours, shorter ttl",
    "lease missing",
    "another's",
    "recreated",
    "absent",
]


def answer_as_etcd_might(
    choices: Choices,
    election: Election,
    action: Grant | Campaign | Renew | Watch,
    sent_at: float,
    now: float,
    told: Told,
    ids: Iterator[int],
) -> None:
    """Answer `action` with anything the driver can report: success, failure, the lease
    gone (ttl 0 or not found), the key someone else's, a ttl of 0 or above the one asked."""
    if isinstance(action, Watch):
        if choices.chance(64):
            election.failed("watch broke", now)
        else:
            election.watched(now)
        return
    if isinstance(action, Grant):
        if choices.chance(64):
            election.failed("timed out", now)
            return
        lease = next(ids)
        ttl = float(choices.pick([action.ttl_s, action.ttl_s + 5, 1, 0]))
        told.alive[lease] = [(sent_at, ttl)]
        told.granted_ttl[lease] = ttl
        election.granted(lease, ttl, sent_at, now)
        return
    if isinstance(action, Campaign):
        gone = action.lease in told.gone
        outcome = choices.pick(
            ["lease missing", "failed"] if gone else ["won", "lost", "failed", "lease missing"]
        )
        if outcome in ("won", "lost"):
            revision = next(ids)
            told.key = (action.lease if outcome == "won" else OTHER_LEASE, revision)
            election.campaigned(outcome == "won", revision, now)
        elif outcome == "lease missing":
            told.gone.add(action.lease)
            election.lease_missing(now)
        else:
            election.failed("timed out", now)
        return
    ttl = told.granted_ttl[action.lease]
    gone = action.lease in told.gone or ttl <= 0
    outcome = choices.pick(["failed", "ttl 0", "lease missing"] if gone else RENEWAL_ANSWERS)
    if outcome == "ttl 0":
        told.gone.add(action.lease)
        election.renewed(0.0, None, None, sent_at, now)
    elif outcome == "lease missing":
        told.gone.add(action.lease)
        election.lease_missing(now)
    elif outcome == "failed":
        election.failed("timed out", now)
    else:
        holder: tuple[int | None, int | None] = {
            "ours": (action.lease, action.revision),
            "ours, shorter ttl": (action.lease, action.revision),
            "another's": (OTHER_LEASE, next(ids)),
            "recreated": (action.lease, next(ids)),
            "absent": (None, None),
        }[outcome]
        ttl_left = ttl / 2 if outcome == "ours, shorter ttl" else ttl
        told.alive[action.lease].append((sent_at, ttl_left))
        told.key = holder
        election.renewed(ttl_left, *holder, sent_at, now)


@settings(max_examples=300, deadline=None)
@given(history=st.binary(min_size=HISTORY // 2, max_size=HISTORY))
def test_a_router_admits_only_while_a_confirmed_send_proves_its_lease(history: bytes) -> None:
    """Whatever etcd answers, and however late: an admitting router holds a lease that etcd
    confirmed alive at a send less than ttl - margin ago, under a key last seen its own.
    (A keepalive that found the key someone else's still proves the lease, which a
    campaign won with it then relies on.)"""
    choices = Choices(history)
    now = 0.0
    election = Election(TIMING, now)
    told = Told()
    ids = itertools.count(1000)

    def check() -> None:
        assert_admits_only_what_it_was_told(election, told, now)

    with contextlib.suppress(OutOfChoices):
        while True:
            now = later(choices, now, [election.fence_at], scale=1.0)
            check()
            if choices.chance(4):
                lease = election.lease
                assert election.resign() == lease
            action = election.next_action(now)
            check()
            if isinstance(action, Pause):
                now = later(choices, now, [action.until, election.fence_at], scale=1.0)
                continue
            sent_at = now
            now = later(choices, now, [election.fence_at], scale=1.0)  # the answer's latency
            check()
            if choices.chance(64):  # the fence timer fires while the call is in flight
                election.tick(now)
                check()
            answer_as_etcd_might(choices, election, action, sent_at, now, told, ids)
            check()
    check()


# --- one or two routers against a model of etcd --------------------------------------------


@dataclass
class EtcdLease:
    ttl: int
    expires_at: float
    revoked: bool = False


@dataclass(frozen=True)
class Holder:
    lease: int
    revision: int  # the key's create revision


class FakeEtcd:
    """etcd as the election relies on it, on the same clock as the routers: a lease expires
    `ttl` after etcd processed its grant or latest keepalive and lives until it is revoked,
    however late after that; revoking deletes the key it carries; the key is created only
    if absent."""

    def __init__(self, min_ttl: int) -> None:
        self.min_ttl = min_ttl
        self.leases: dict[int, EtcdLease] = {}
        self.key: Holder | None = None
        self.revision = 1
        self._ids = itertools.count(1000)

    def alive(self, lease: int) -> bool:
        held = self.leases.get(lease)
        return held is not None and not held.revoked

    def grant(self, ttl: int, now: float) -> tuple[int, int]:
        lease, ttl = next(self._ids), max(ttl, self.min_ttl)
        self.leases[lease] = EtcdLease(ttl, now + ttl)
        return lease, ttl

    def keepalive(self, lease: int, now: float) -> int:
        if not self.alive(lease):
            return 0
        held = self.leases[lease]
        held.expires_at = now + held.ttl
        return held.ttl

    def create_if_absent(self, lease: int) -> tuple[bool, Holder | None, int] | None:
        """(won, the key after the transaction, the store's revision); None: no such lease."""
        if self.key is not None:
            return False, self.key, self.revision
        if not self.alive(lease):
            return None
        self.revision += 1
        self.key = Holder(lease, self.revision)
        return True, self.key, self.revision

    def revoke(self, lease: int) -> None:
        if self.alive(lease):
            self.leases[lease].revoked = True
            if self.key is not None and self.key.lease == lease:
                self.key = None
                self.revision += 1

    def expired(self, now: float) -> list[int]:
        return [n for n, held in self.leases.items() if not held.revoked and held.expires_at <= now]


@dataclass
class Call:
    """An etcd call in flight: the requests etcd has yet to process, and what it answered."""

    action: Action | None  # None: the revoke sent on resigning
    sent_at: float
    requests: list[tuple[str, int]]
    granted: tuple[int, int] | None = None
    campaign: tuple[bool, Holder | None, int] | None = None
    ttl_left: int = 0
    holder: Holder | None = None

    @classmethod
    def of(cls, action: Grant | Campaign | Renew | Watch, now: float) -> Call:
        if isinstance(action, Grant):
            return cls(action, now, [("grant", action.ttl_s)])
        if isinstance(action, Campaign):
            return cls(action, now, [("txn", action.lease)])
        if isinstance(action, Renew):
            return cls(action, now, [("keepalive", action.lease)])
        return cls(action, now, [("watch", 0)])

    def process(self, etcd: FakeEtcd, now: float) -> None:
        """etcd processes the next request, at `now`."""
        request, arg = self.requests.pop(0)
        if request == "grant":
            self.granted = etcd.grant(arg, now)
        elif request == "txn":
            self.campaign = etcd.create_if_absent(arg)
        elif request == "keepalive":
            self.ttl_left = etcd.keepalive(arg, now)
            if self.ttl_left > 0:  # the driver reads the key after a live keepalive
                self.requests.append(("get", arg))
        elif request == "get":
            self.holder = etcd.key
        elif request == "revoke":
            etcd.revoke(arg)


@dataclass
class Router:
    election: Election
    call: Call | None = None
    resigned: bool = False
    cut_off: bool = False  # its requests do not reach etcd (they time out)
    paused_until: float | None = None
    # lease -> (send time, ttl) of its grant and of each keepalive etcd answered with the
    # lease alive and the key still ours
    confirmed: dict[int, list[tuple[float, float]]] = field(default_factory=dict)


def report(choices: Choices, router: Router, call: Call, now: float) -> None:
    """Report an answered call to the election as the driver (`ha/leadership.py`) does."""
    election, action = router.election, call.action
    if isinstance(action, Grant):
        assert call.granted is not None
        lease, ttl = call.granted
        router.confirmed.setdefault(lease, []).append((call.sent_at, float(ttl)))
        election.granted(lease, float(ttl), call.sent_at, now)
    elif isinstance(action, Campaign):
        if call.campaign is None:
            election.lease_missing(now)
            return
        won, holder, revision = call.campaign
        if won or (holder is not None and holder.lease == action.lease):
            assert holder is not None  # (ours already: an earlier answer was lost)
            election.campaigned(True, holder.revision, now)
        else:
            election.campaigned(False, holder.revision if holder else revision, now)
    elif isinstance(action, Renew):
        if call.ttl_left <= 0:
            if choices.pick(["ttl 0", "not found"]) == "not found":
                election.lease_missing(now)
            else:
                election.renewed(0.0, None, None, call.sent_at, now)
            return
        holder = call.holder
        if holder == Holder(action.lease, action.revision):
            router.confirmed[action.lease].append((call.sent_at, float(call.ttl_left)))
        election.renewed(
            float(call.ttl_left),
            None if holder is None else holder.lease,
            None if holder is None else holder.revision,
            call.sent_at,
            now,
        )
    elif isinstance(action, Watch):
        election.watched(now)


def step(choices: Choices, router: Router, etcd: FakeEtcd, lost: list[Call], now: float) -> None:
    """Move one router's driver on: ask for an action, have etcd process a request, or hear
    the answer. Any call may time out (every one, while the router is cut off from etcd),
    and a request that timed out may still reach etcd later (through `lost`)."""
    election, call = router.election, router.call
    if router.resigned:
        assert election.next_action(now) == Pause(math.inf)
        return
    if call is None:
        action = election.next_action(now)
        if isinstance(action, Pause):
            router.paused_until = action.until
        else:
            router.call = Call.of(action, now)
        return
    if call.requests and not router.cut_off and not choices.chance(48):
        call.process(etcd, now)
        return
    router.call = None
    if call.requests:  # timed out before etcd answered this request
        if choices.chance(128):
            lost.append(call)
        election.failed("timed out", now)
    elif choices.chance(32):  # etcd answered; the answer was lost
        election.failed("connection reset", now)
    else:
        report(choices, router, call, now)


def resign(choices: Choices, router: Router, etcd: FakeEtcd, lost: list[Call], now: float) -> None:
    """Shut the router down as the driver does: cancel its call, resign, revoke the lease."""
    if router.resigned:
        return
    if router.call is not None and router.call.requests and choices.chance(128):
        lost.append(router.call)
    router.call, router.resigned = None, True
    lease = router.election.resign()
    if lease is not None:
        revoke = Call(None, now, [("revoke", lease)])
        fate = choices.pick(["processed", "processed later", "lost"])
        if fate == "processed":
            revoke.process(etcd, now)
        elif fate == "processed later":
            lost.append(revoke)


def assert_safe(fleet: list[Router], etcd: FakeEtcd, margin: float, now: float) -> None:
    admitting = [router for router in fleet if router.election.admitting(now)]
    assert len(admitting) <= 1, f"two routers admit at {now}"
    for router in admitting:
        election = router.election
        lease, revision = election.lease, election.revision
        assert lease is not None and revision is not None
        proofs = router.confirmed.get(lease, [])
        assert any(now < s + ttl - margin for s, ttl in proofs), (
            f"admits at {now} with no confirmed send of lease {lease} proving it: {proofs}"
        )
        # And as etcd has it: the key is ours, under a lease that lives past now + margin.
        assert etcd.key == Holder(lease, revision)
        held = etcd.leases[lease]
        assert not held.revoked
        assert now < held.expires_at - margin


TIMINGS = [TIMING, Timing(ttl_s=3, renew_interval_s=1.0, margin_s=0.5, retry_s=0.1)]
EVENTS = {
    "router": 64,
    "time": 32,
    "sweep": 12,
    "lost request": 8,
    "fence timer": 8,
    "cut off": 2,
    "reconnect": 4,
    "crash": 2,
}


def simulate(history: bytes, routers: int, intruder: bool) -> None:
    """Run `routers` routers against one etcd through the history's moves, checking safety
    after each. Routers may be cut off from etcd, crash (and restart as a new router, the
    old one's lease left to expire) or resign; an intruder, if any, grabs the key whenever
    it is free and never renews its lease."""
    choices = Choices(history)  # (at least the three bytes read here, from the strategy)
    timing = choices.pick(TIMINGS)
    etcd = FakeEtcd(min_ttl=timing.ttl_s + choices.pick([0, 2]))  # grants what is asked, or more
    weights = EVENTS | {"intruder": 6 * intruder, "resign": choices.pick([0, 0, 0, 1])}
    events = [event for event, weight in weights.items() for _ in range(weight)]
    now = 0.0
    fleet = [Router(Election(timing, now)) for _ in range(routers)]
    lost: list[Call] = []
    with contextlib.suppress(OutOfChoices):
        while True:
            event = choices.pick(events)
            index = choices.pick(range(routers)) if routers > 1 else 0
            router = fleet[index]
            if event == "time":
                boundaries: list[float | None] = [r.election.fence_at for r in fleet]
                boundaries += [r.paused_until for r in fleet]
                for held in etcd.leases.values():
                    boundaries += [held.expires_at, held.expires_at - timing.margin_s]
                now = later(choices, now, boundaries, scale=timing.ttl_s / 10)
            elif event == "router":
                step(choices, router, etcd, lost, now)
            elif event == "sweep" and (expired := etcd.expired(now)):
                etcd.revoke(choices.pick(expired))  # at its expiry, or however late
            elif event == "lost request" and lost:
                late = lost[0]
                late.process(etcd, now)
                if not late.requests:
                    lost.pop(0)
            elif event == "fence timer":
                router.election.tick(now)
            elif event in ("cut off", "reconnect"):
                router.cut_off = event == "cut off"
            elif event == "crash" and not router.resigned:
                if router.call is not None and router.call.requests and choices.chance(128):
                    lost.append(router.call)
                fleet[index] = Router(Election(timing, now))
            elif event == "intruder" and etcd.key is None:
                lease, _ = etcd.grant(choices.pick(range(1, 2 * timing.ttl_s)), now)
                etcd.create_if_absent(lease)
            elif event == "resign":
                resign(choices, router, etcd, lost, now)
            assert_safe(fleet, etcd, timing.margin_s, now)


@settings(max_examples=300, deadline=None)
@given(history=st.binary(min_size=HISTORY // 2, max_size=HISTORY))
def test_a_router_against_etcd_admits_only_while_its_lease_provably_lives(history: bytes) -> None:
    """One router, with another client grabbing the key whenever it is free."""
    simulate(history, routers=1, intruder=True)


@settings(max_examples=300, deadline=None)
@given(history=st.binary(min_size=HISTORY // 2, max_size=HISTORY))
def test_two_routers_never_admit_at_the_same_instant(history: bytes) -> None:
    simulate(history, routers=2, intruder=False)


def test_a_standby_takes_over_only_after_the_silent_leader_stopped_admitting() -> None:
    """The leader's renewals stop reaching etcd; its lease expires at etcd 10 s after the
    last keepalive etcd processed, and only then can the standby's campaign win."""
    etcd = FakeEtcd(min_ttl=10)
    leader, standby = active(), Election(TIMING, 0.0)
    etcd.leases[LEASE] = EtcdLease(10, expires_at=10.0)
    etcd.key = Holder(LEASE, REVISION)
    assert standby.next_action(0.0) == Grant(10)
    lease, ttl = etcd.grant(10, 0.0)
    standby.granted(lease, float(ttl), 0.0, 0.0)
    assert standby.next_action(0.0) == Campaign(lease)
    result = etcd.create_if_absent(lease)
    assert result is not None and not result[0]
    standby.campaigned(False, REVISION, 0.0)
    assert standby.next_action(0.0) == Watch(REVISION, until=3.0)
    assert leader.next_action(0.0) == Renew(LEASE, REVISION)  # never reaches etcd
    assert leader.admitting(just_before(VALID_FOR))
    assert not leader.admitting(VALID_FOR)
    etcd.revoke(LEASE)  # at 10, when etcd expires the leader's lease
    standby.watched(10.0)
    assert standby.next_action(10.0) == Grant(10)  # its own lease's proof ended at 9
    lease, ttl = etcd.grant(10, 10.0)
    standby.granted(lease, float(ttl), 10.0, 10.0)
    assert standby.next_action(10.0) == Campaign(lease)
    result = etcd.create_if_absent(lease)
    assert result is not None and result[0]
    standby.campaigned(True, etcd.revision, 10.0)
    assert standby.admitting(10.0)
    assert not leader.admitting(10.0)
    leader.failed("timed out", 9.5)  # the renewal sent at 0 times out
    assert role(leader) == "fenced"
    assert leader.next_action(10.0) == Renew(LEASE, REVISION)
    leader.renewed(float(etcd.keepalive(LEASE, 10.0)), None, None, 10.0, 10.1)
    assert role(leader) == "standby"
