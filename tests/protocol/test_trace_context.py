"""W3C Trace Context: what the router passes on to engines, and what it drops."""

from __future__ import annotations

import pytest

from narwhal.protocol.trace_context import (
    TraceContext,
    trace_context,
    traceparent_of,
    valid_traceparent,
    valid_tracestate,
)

VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_valid_traceparent_and_tracestate_are_kept_as_sent() -> None:
    context = trace_context([VALID], ["congo=t61rcWkgMzE, rojo=00f067aa0ba902b7"])
    assert context == TraceContext(VALID, "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7")
    assert context.trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert context.parent_id == "b7ad6b7169203331"
    assert context.flags == 1


@pytest.mark.parametrize(
    "value",
    [
        VALID.upper().replace("X", "x"),  # hex digits are lowercase only
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # trace-id all zeros
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # parent-id all zeros
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # version ff
        VALID + "-extra",  # version 00 has exactly four fields
        VALID[:-1],  # flags are two digits
        "00-0af7651916cd43dd8448eb211c80319-cb7ad6b7169203331-01",  # misplaced dash
        "0-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00_0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331_01",
        "",
        "not a traceparent",
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01x",  # later version: "-" next
    ],
)
def test_an_invalid_traceparent_is_dropped(value: str) -> None:
    assert not valid_traceparent(value)
    assert trace_context([value], ["rojo=00f067aa0ba902b7"]) is None


def test_a_later_version_is_read_by_its_first_fields() -> None:
    later = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-comes-next"
    assert valid_traceparent(later)
    assert valid_traceparent(later[:55])


def test_two_traceparent_lines_are_invalid_and_none_is_nothing() -> None:
    assert trace_context([VALID, VALID]) is None
    assert trace_context([]) is None


def test_surrounding_whitespace_is_not_part_of_the_value() -> None:
    context = trace_context([f" {VALID}\t"])
    assert context is not None and context.traceparent == VALID


def test_tracestate_lines_are_joined_in_order() -> None:
    context = trace_context([VALID], ["a=1", "b=2,c=3"])
    assert context is not None and context.tracestate == "a=1,b=2,c=3"


@pytest.mark.parametrize(
    "value",
    [
        "Congo=1",  # keys are lowercase
        "a=1,a=2",  # a key once
        "a=",  # a value has at least one character
        "a=1\t2",  # printable characters and spaces only
        "a=b=c",
        "a=1;b=2",
        "a=" + "x" * 257,
        ",".join(f"k{i}=v" for i in range(33)),  # at most 32 members
        " , ",
        "a=\u00e9",
    ],
)
def test_an_invalid_tracestate_is_dropped_and_the_traceparent_kept(value: str) -> None:
    assert not valid_tracestate(value)
    assert trace_context([VALID], [value]) == TraceContext(VALID, None)


@pytest.mark.parametrize(
    "value",
    [
        "rojo=00f067aa0ba902b7",
        "tenant@vendor=value with spaces inside",
        "a=1,,b=2",  # empty members are allowed
        ",".join(f"k{i}=v" for i in range(32)),
        "x-y_z*/=!",
    ],
)
def test_a_valid_tracestate(value: str) -> None:
    assert valid_tracestate(value)


def test_the_routers_own_traceparent_is_version_00() -> None:
    value = traceparent_of(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, 1)
    assert value == VALID
    assert traceparent_of(1, 2, 0) == "00-00000000000000000000000000000001-0000000000000002-00"
