"""The completion routes' request headers (sans-IO): deadline, media type, content coding."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.errors import InvalidRequest, UnsupportedMediaType
from narwhal.protocol.headers import (
    check_content_encoding,
    check_content_type,
    request_timeout,
)

LIMIT = 600.0


@pytest.mark.parametrize(
    ("values", "seconds"),
    [
        ([], LIMIT),
        (["30"], 30.0),
        (["0.5"], 0.5),
        ([".25"], 0.25),
        (["5."], 5.0),
        ([" 2 "], 2.0),
        (["9000"], LIMIT),  # a client may shorten its deadline, not lengthen it
        (["3", "3"], 3.0),  # the same value twice says the same thing
    ],
)
def test_request_timeout(values: list[str], seconds: float) -> None:
    assert request_timeout(values, LIMIT) == seconds


@pytest.mark.parametrize(
    "value",
    [
        *("abc", "-1", "0", "0.0", "nan", "inf", "-inf", "1e999", "1e3", "", " ", "0x10"),
        *("1_0", "\u0661\u0660", "\udcff", "5, 5", "+5", "5s", "1" * 400),
        *("0\x1f", "5\x0b", "\x1c5", "5\xa0"),  # whitespace to str.strip, not to HTTP
    ],
)
def test_request_timeout_garbage_is_400(value: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        request_timeout([value], LIMIT)
    assert info.value.status == 400
    assert info.value.param == "X-Request-Timeout"
    assert len(info.value.message) < 200


def test_conflicting_request_timeouts_are_400() -> None:
    with pytest.raises(InvalidRequest) as info:
        request_timeout(["5", "abc"], LIMIT)
    assert info.value.param == "X-Request-Timeout"
    assert "more than once" in info.value.message


@settings(max_examples=300, deadline=None)
@given(value=st.text())
def test_any_request_timeout_is_a_deadline_or_a_400(value: str) -> None:
    try:
        seconds = request_timeout([value], LIMIT)
    except InvalidRequest as error:
        assert error.status == 400
    else:
        assert 0 < seconds <= LIMIT


@pytest.mark.parametrize(
    "values",
    [
        [],
        [""],
        ["application/json"],
        ["Application/JSON; charset=utf-8"],
        ["application/vnd.api+json"],
        ["application/json", "application/json"],
    ],
)
def test_json_or_no_content_type_is_read(values: list[str]) -> None:
    check_content_type(values)


@pytest.mark.parametrize(
    "value",
    [
        "text/plain",
        "application/x-www-form-urlencoded",  # curl -d without -H
        "multipart/form-data; boundary=x",
        "application/jsonx",
        "json",
        ";;;==",
        "\udcff",
    ],
)
def test_other_content_types_are_415(value: str) -> None:
    with pytest.raises(UnsupportedMediaType) as info:
        check_content_type([value])
    assert info.value.status == 415
    assert info.value.param == "Content-Type"
    assert info.value.envelope()["error"]["type"] == "invalid_request_error"


def test_conflicting_content_types_are_400() -> None:
    with pytest.raises(InvalidRequest) as info:
        check_content_type(["application/json", "text/plain"])
    assert info.value.status == 400


@pytest.mark.parametrize("values", [[], [""], ["identity"], ["Identity", "identity"]])
def test_an_uncompressed_body_is_read(values: list[str]) -> None:
    check_content_encoding(values)


@pytest.mark.parametrize("values", [["gzip"], ["br"], ["identity, gzip"], ["identity", "zstd"]])
def test_a_compressed_body_is_415_with_accept_encoding(values: list[str]) -> None:
    with pytest.raises(UnsupportedMediaType) as info:
        check_content_encoding(values)
    assert info.value.status == 415
    assert info.value.param == "Content-Encoding"
    assert info.value.headers() == {"Accept-Encoding": "identity"}
