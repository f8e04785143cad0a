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
    } <= names


def test_names_are_unique_and_recordings_follow_the_naming_convention() -> None:
    groups = [g["name"] for g in load_rules()["groups"]]
    assert len(set(groups)) == len(groups)
    alert_names = [a["alert"] for a in alerts()]
    assert len(set(alert_names)) == len(alert_names)
    for rule in rules():
        if "record" in rule:  # level:metric:operations
            assert re.fullmatch(r"[a-z_]+:narwhal_[a-z_]+:[a-z0-9_]+", rule["record"]), rule
