"""Log lines as a log pipeline reads them: JSON parsed back, and the access line in both
formats."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from narwhal.api.access_log import AccessEntry, AccessLog
from narwhal.config import LoggingConfig
from narwhal.observability.logs import JsonFormatter, configure_logging, rfc3339

RFC3339_UTC = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")


def entry(**changes: object) -> AccessEntry:
    fields: dict[str, object] = {
        "request_id": "client-1-abc",
        "route": "chat",
        "stream": True,
        "status": 200,
        "outcome": "completed",
        "engines": ("p0", "d0"),
        "prompt_tokens": 12,
        "completion_tokens": 8,
        "ttft_s": 0.0123456789,
        "duration_s": 0.25,
    }
    fields.update(changes)
    return AccessEntry(**fields)  # type: ignore[arg-type]


@pytest.fixture
def logged() -> Iterator[io.StringIO]:
    """The root logger's output, as `narwhal serve --log-format json` configures it."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    out = io.StringIO()
    configure_logging(LoggingConfig(format="json"), stream=out)
    try:
        yield out
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_json_line_is_parsed_back(logged: io.StringIO) -> None:
    logging.getLogger("narwhal.dispatch").warning("request %s: engine %s failed", "r1", "d0")
    (line,) = lines(logged)
    assert set(line) == {"ts", "level", "logger", "message"}
    assert line["level"] == "WARNING" and line["logger"] == "narwhal.dispatch"
    assert line["message"] == "request r1: engine d0 failed"
    assert isinstance(line["ts"], str) and RFC3339_UTC.fullmatch(line["ts"])
    when = datetime.fromisoformat(line["ts"].replace("Z", "+00:00"))
    assert abs((datetime.now(UTC) - when).total_seconds()) < 60


def test_an_exception_is_one_field_of_one_line(logged: io.StringIO) -> None:
    try:
        raise ValueError("broken\non two lines")
    except ValueError:
        logging.getLogger("narwhal").exception("it failed")
    (line,) = lines(logged)
    assert line["message"] == "it failed"
    exc = line["exc"]
    assert isinstance(exc, str) and exc.startswith("Traceback") and "ValueError" in exc


def test_the_access_line_in_json_has_its_fields(logged: io.StringIO) -> None:
    AccessLog(True).write(entry())
    (line,) = lines(logged)
    assert line["logger"] == "narwhal.access" and line["level"] == "INFO"
    assert line["message"] == "completion request"
    assert {k: v for k, v in line.items() if k not in ("ts", "level", "logger", "message")} == {
        "request_id": "client-1-abc",
        "route": "chat",
        "stream": True,
        "status": 200,
        "outcome": "completed",
        "engines": ["p0", "d0"],
        "prompt_tokens": 12,
        "completion_tokens": 8,
        "ttft_s": 0.012346,
        "duration_s": 0.25,
        "upstream_timeout": None,
        "tenant": None,
        "class": None,
    }


def test_unknowns_are_null_in_json(logged: io.StringIO) -> None:
    AccessLog(True).write(
        entry(status=None, outcome="client_gone", engines=(), prompt_tokens=None,
              completion_tokens=None, ttft_s=None)
    )  # fmt: skip
    (line,) = lines(logged)
    assert line["status"] is None and line["engines"] == [] and line["ttft_s"] is None


def test_the_access_line_in_text_is_key_value_pairs() -> None:
    assert str(entry()) == (
        "request_id=client-1-abc route=chat stream=true status=200 outcome=completed "
        "engines=p0,d0 prompt_tokens=12 completion_tokens=8 ttft_s=0.012346 duration_s=0.250000 "
        "upstream_timeout=- tenant=- class=-"
    )
    unknown = entry(status=None, engines=(), prompt_tokens=None, completion_tokens=None,
                    ttft_s=None, stream=False)  # fmt: skip
    assert str(unknown) == (
        "request_id=client-1-abc route=chat stream=false status=- outcome=completed "
        "engines=- prompt_tokens=- completion_tokens=- ttft_s=- duration_s=0.250000 "
        "upstream_timeout=- tenant=- class=-"
    )
    timed_out = entry(upstream_timeout="first_event", tenant="team-a", priority_class="critical")
    assert str(timed_out).endswith(" upstream_timeout=first_event tenant=team-a class=critical")


def test_the_access_log_off_or_above_info_writes_nothing(logged: io.StringIO) -> None:
    assert not AccessLog(False).enabled
    access = logging.getLogger("narwhal.access")
    access.setLevel(logging.WARNING)
    try:
        assert not AccessLog(True).enabled
    finally:
        access.setLevel(logging.NOTSET)
    assert AccessLog(True).enabled


def test_rfc3339_is_utc() -> None:
    assert rfc3339(0.5) == "1970-01-01T00:00:00.500000Z"
    assert rfc3339(1714564800.123456) == "2024-05-01T12:00:00.123456Z"


def test_json_timestamps_follow_the_records_across_seconds() -> None:
    formatter = JsonFormatter()
    shown = []
    for created in (1714564800.123456, 1714564800.9, 1714564801.5, 1714564800.25):
        record = logging.LogRecord("narwhal", logging.INFO, __file__, 1, "m", None, None)
        record.created = created
        shown.append(json.loads(formatter.format(record))["ts"])
    assert shown == [
        "2024-05-01T12:00:00.123456Z",
        "2024-05-01T12:00:00.900000Z",
        "2024-05-01T12:00:01.500000Z",
        "2024-05-01T12:00:00.250000Z",
    ]
