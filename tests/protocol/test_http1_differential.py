"""Narwhal's response parser against h11 on generated responses, valid and broken.

The generator is `tests/protocol/http1_responses.py`; the comparison and the list of
allowed divergences, each with its RFC reason, are in
`tests/protocol/http1_differential.py`. `scripts/fuzz/http1_differential.py` runs the
same property for minutes.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from tests.protocol.http1_differential import (
    ALLOWED,
    Allowed,
    Divergence,
    Refused,
    check,
    h11_verdict,
    narwhal_verdict,
)
from tests.protocol.http1_responses import Case, responses


@settings(max_examples=300, deadline=None)
@given(case=responses())
def test_narwhal_agrees_with_h11_or_the_divergence_is_listed(case: Case) -> None:
    """Same verdict, same status, headers and body, whatever the split points; or a
    divergence `ALLOWED` lists. Narwhal raises nothing but `HTTPProtocolError`."""
    check(case)


@pytest.mark.parametrize("allowed", ALLOWED, ids=[a.feature for a in ALLOWED])
def test_each_allowed_divergence_is_real(allowed: Allowed) -> None:
    """Its example makes the two disagree as the entry says, and only the entry excuses
    it: no entry stays in the list after h11 or Narwhal stopped differing so."""
    case = Case(allowed.example, b"POST", frozenset({allowed.feature}), ())
    assert check(case) == f"allowed: {allowed.feature}"
    with pytest.raises(Divergence):
        check(Case(allowed.example, b"POST", frozenset(), ()))


def test_h11_is_as_strict_as_the_comparison_needs() -> None:
    """The reason for `h11>=0.16` in the dev extra: older versions skipped any two bytes
    after a chunk's data, so the comparison would call Narwhal's refusal a divergence."""
    message = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXX0\r\n\r\n"
    assert "malformed chunk footer" in str(h11_verdict([message], b"POST"))
    assert isinstance(narwhal_verdict([message]), Refused)
