"""W3C Trace Context (`traceparent`, `tracestate`): read from a client, sent to engines.

A client's trace context goes to the engines that serve its request (vLLM records its
OpenTelemetry spans under it) only when it is valid, so an engine never sees a header
the router did not check:

    traceparent = version "-" trace-id "-" parent-id "-" trace-flags
                  2, 32, 16 and 2 lowercase hex digits; version ff is invalid, and an
                  all-zero trace-id or parent-id is too

Version 00 is exactly those 55 characters. A later version may append fields after a
"-", so only its first 55 characters are read (Trace Context §3.2.4, "Versioning of
traceparent"). A traceparent sent twice is invalid (two field lines cannot be read as
one), and without a valid traceparent the tracestate is not read at all (§3.3).

tracestate is a list of at most 32 `key=value` members; one sent over several field
lines is joined with "," (§3.3.1.1). An invalid tracestate is dropped whole and the
traceparent kept, which the specification allows and which never forwards a member the
router could not vouch for.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

_TRACEPARENT = re.compile(
    r"(?P<version>[0-9a-f]{2})-(?P<trace_id>[0-9a-f]{32})-(?P<parent_id>[0-9a-f]{16})"
    r"-(?P<flags>[0-9a-f]{2})"
)
_VERSION_00_LENGTH = 55
_KEY = r"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
# Printable ASCII but "," and "=", spaces allowed only inside (not at the end).
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER = re.compile(rf"(?P<key>{_KEY})={_VALUE}")
_MAX_MEMBERS = 32
_OWS = " \t"


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A checked trace context, as it goes on the wire to an engine."""

    traceparent: str
    tracestate: str | None = None

    @property
    def trace_id(self) -> str:
        return self.traceparent[3:35]

    @property
    def parent_id(self) -> str:
        return self.traceparent[36:52]

    @property
    def flags(self) -> int:
        return int(self.traceparent[53:55], 16)


def trace_context(
    traceparent: Sequence[str], tracestate: Sequence[str] = ()
) -> TraceContext | None:
    """The client's trace context from every value of its two headers, or None when it
    sent no traceparent or an invalid one."""
    if len(traceparent) != 1:
        return None
    parent = traceparent[0].strip(_OWS)
    if not valid_traceparent(parent):
        return None
    state = ",".join(tracestate)
    return TraceContext(parent, state if state and valid_tracestate(state) else None)


def valid_traceparent(value: str) -> bool:
    match = _TRACEPARENT.match(value)
    if match is None:
        return False
    version = match["version"]
    if version == "ff":
        return False
    if version == "00":
        if len(value) != _VERSION_00_LENGTH:
            return False
    elif len(value) > _VERSION_00_LENGTH and value[_VERSION_00_LENGTH] != "-":
        return False
    return match["trace_id"] != "0" * 32 and match["parent_id"] != "0" * 16


def valid_tracestate(value: str) -> bool:
    """At most 32 well-formed members, no key twice; empty members (",,") are allowed."""
    keys: set[str] = set()
    for member in value.split(","):
        member = member.strip(_OWS)
        if not member:
            continue
        match = _MEMBER.fullmatch(member)
        if match is None or match["key"] in keys:
            return False
        keys.add(match["key"])
    return 0 < len(keys) <= _MAX_MEMBERS


def traceparent_of(trace_id: int, span_id: int, flags: int) -> str:
    """A version-00 traceparent for a span the router started itself."""
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"
