"""Prometheus's own tool on deploy/: the rules load (`promtool check rules`, lint
included), the alerts fire when they should (`promtool test rules` on
narwhal-alerts.test.yaml), and every dashboard query is PromQL Prometheus accepts."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.deploy_files import RULES, RULES_TEST, Expression, dashboard_expressions


def promtool_run(promtool: str, *args: str | Path, cwd: Path | None = None) -> str:
    """promtool's output; an AssertionError carrying it when promtool says no."""
    result = subprocess.run(
        [promtool, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def check_rules(promtool: str, path: Path) -> str:
    return promtool_run(promtool, "check", "rules", "--lint=all", "--lint-fatal", path)


def as_recording_rules(expressions: list[Expression], path: Path) -> None:
    """A rules file recording each expression, so that promtool parses them all."""
    rules = [{"record": f"dashboard:query_{n}", "expr": e.expr} for n, e in enumerate(expressions)]
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))


def test_the_rules_pass_promtool_check(promtool: str) -> None:
    output = check_rules(promtool, RULES)
    assert re.search(r"SUCCESS: \d+ rules found", output), output


def test_the_alerts_fire_as_their_unit_tests_expect(promtool: str) -> None:
    output = promtool_run(promtool, "test", "rules", RULES_TEST.name, cwd=RULES_TEST.parent)
    assert "SUCCESS" in output, output


def test_every_dashboard_query_is_valid_promql(promtool: str, tmp_path: Path) -> None:
    expressions = dashboard_expressions()
    path = tmp_path / "dashboard.yaml"
    as_recording_rules(expressions, path)
    output = check_rules(promtool, path)
    assert f"SUCCESS: {len(expressions)} rules found" in output, output


def test_promtool_refuses_a_query_that_is_not_promql(promtool: str, tmp_path: Path) -> None:
    # The check above can fail: the same path with one broken query does.
    path = tmp_path / "broken.yaml"
    as_recording_rules([Expression("test", "sum by (engine (narwhal_engine_up)")], path)
    with pytest.raises(AssertionError, match="parse error"):
        check_rules(promtool, path)
