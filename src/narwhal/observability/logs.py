"""Where the router's log goes and how it reads (`logging.format`, `narwhal serve --log-format`).

Every line goes to stderr, through the standard library's logging:

- text: `2024-05-01 12:00:00,123 INFO narwhal.dispatch: message`, as always;
- json: one JSON object a line, for a log pipeline:
  `{"ts": "2024-05-01T12:00:00.123456Z", "level": "INFO", "logger": "narwhal.dispatch",
  "message": "..."}`, with `exc` holding the traceback of a logged exception.

A `StructuredMessage` (the access line, `api/access_log.py`) is one record either way: its
`str()` is the text line's message, and in JSON its fields are the object's own keys
beside a short `message`.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

import msgspec

from narwhal.config import LoggingConfig


class StructuredMessage:
    """A log message with fields of its own, logged as the record's msg (no args)."""

    __slots__ = ()
    message = ""  # the JSON line's message

    def fields(self) -> dict[str, Any]:
        raise NotImplementedError


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Whatever a caller logs as an argument must not make the line unwritable.
_encoder = msgspec.json.Encoder(enc_hook=str)


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        # The date and time of day change once a second, not once a line.
        self._second: tuple[int, str] = (-1, "")

    def format(self, record: logging.LogRecord) -> str:
        msg = record.msg
        created = record.created
        seconds = int(created)
        second, text = self._second
        if second != seconds:
            text = _second(seconds)
            self._second = (seconds, text)
        entry: dict[str, Any] = {
            "ts": f"{text}.{int((created - seconds) * 1_000_000):06d}Z",
            "level": record.levelname,
            "logger": record.name,
        }
        if isinstance(msg, StructuredMessage) and not record.args:
            entry["message"] = msg.message
            entry.update(msg.fields())
        else:
            entry["message"] = record.getMessage()
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return _encoder.encode(entry).decode()


def rfc3339(created: float) -> str:
    """A time in UTC, to the microsecond: 2024-05-01T12:00:00.123456Z."""
    seconds = int(created)
    return _second(seconds) + f".{int((created - seconds) * 1_000_000):06d}Z"


def _second(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


class _Announced(StructuredMessage):
    __slots__ = ("_fields", "message")

    def __init__(self, message: str, fields: dict[str, Any]) -> None:
        self.message = message
        self._fields = fields

    def fields(self) -> dict[str, Any]:
        return self._fields


def announcement(message: str, log_format: str, *, level: int = logging.INFO, **fields: Any) -> str:
    """A line the process writes outside its logs (`narwhal listening on URL` on stdout, a
    configuration error on stderr before logging is set up), in the log's format: under
    `--log-format json` every line the process writes is a JSON object, the log's own
    shape (`JsonFormatter`), with the message's parts as fields of their own (`url`), so a
    collector reading container logs never meets a line it cannot parse."""
    if log_format != "json":
        return message
    record = logging.LogRecord(
        "narwhal", level, __file__, 0, _Announced(message, fields), None, None
    )
    return JsonFormatter().format(record)


def configure_logging(config: LoggingConfig, stream: TextIO | None = None) -> None:
    """Send every log record at `config.level` and above to `stream` (stderr) in
    `config.format`, replacing whatever handlers the root logger had."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    formatter = JsonFormatter() if config.format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    logging.basicConfig(level=config.level.upper(), handlers=[handler], force=True)
