"""deploy/prometheus/narwhal-alerts.yaml: the alerts an operator of a Narwhal fleet is
paged by, each with a duration, a severity and text that says what to do."""

from __future__ import annotations

import re

from tests.deploy.deploy_files import alerts, load_rules, rules


def test_every_alert_has_a_duration_a_severity_and_what_to_do() -> None:
    for alert in alerts():
        name = alert["alert"]
        assert re.fullmatch(r"\d+[smh]", alert["for"]), name
        assert alert["labels"]["severity"] in ("critical", "warning"), name
        annotations = alert["annotations"]
        assert annotations["summary"].strip(), name
        # A description long enough to say what happened and what to look at.
        assert len(annotations["description"].split()) >= 25, name


def test_the_alerts_cover_what_fails_in_a_fleet() -> None:
    names = {a["alert"] for a in alerts()}
    assert {
        "NarwhalHighErrorRatio",  # upstream_error + internal_error over offered
        "NarwhalInternalErrors",
        "NarwhalRefusalsSustained",
        "NarwhalNoEligibleEngines",
        "NarwhalMonitoringDegraded",
        "NarwhalRouterFenced",
        "NarwhalRouterStateFlapping",
        "NarwhalLeadershipFlapping",
        "NarwhalEngineDown",
        "NarwhalEventLoopLagHigh",
        "NarwhalHighestClassRefused",  # the priority classes' promise
        "NarwhalClassAttainmentLow",
        "NarwhalTTFTBudgetBurnFast",  # the promise's SLOs, by burn rate
        "NarwhalTTFTBudgetBurnSlow",
        "NarwhalProjectionBoundBurnFast",
        "NarwhalProjectionBoundBurnSlow",
        "NarwhalPromptsOverBudget",  # refusals no capacity answers
        "NarwhalEngineUnprofiled",
    } <= names


def test_names_are_unique_and_recordings_follow_the_naming_convention() -> None:
    groups = [g["name"] for g in load_rules()["groups"]]
    assert len(set(groups)) == len(groups)
    alert_names = [a["alert"] for a in alerts()]
    assert len(set(alert_names)) == len(alert_names)
    for rule in rules():
        if "record" in rule:  # level:metric:operations
            assert re.fullmatch(r"[a-z_]+:narwhal_[a-z_]+:[a-z0-9_]+", rule["record"]), rule


# The SRE workbook's pairs: (long window, short window) -> (burn rate, severity). A burn
# over both windows at one rate, on one SLI, against the 1% budget of both SLOs.
BURN_WINDOWS = {("1h", "5m"): (14.4, "critical"), ("6h", "30m"): (6.0, "warning")}
_BURN = re.compile(r"(job:narwhal_\w+):rate(\d+[mh]) > \(([\d.]+) \* 0\.01\)")


def test_burn_rate_alerts_pair_a_long_and_a_short_window_at_one_rate() -> None:
    burns = [a for a in alerts() if "Burn" in a["alert"]]
    assert len(burns) == 4
    for alert in burns:
        name = alert["alert"]
        (sli, long, rate), (short_sli, short, short_rate) = _BURN.findall(alert["expr"])
        assert sli == short_sli and rate == short_rate, name
        assert (float(rate), alert["labels"]["severity"]) == BURN_WINDOWS[long, short], name
