"""The client body decoder (sans-IO): nesting bounded, every fault a 400 naming its field."""

from __future__ import annotations

import json
import sys

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.errors import InvalidRequest
from narwhal.protocol.jsonbody import MAX_NESTING, decode_object, nested_deeper_than


def refuse(raw: bytes) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        decode_object(raw)
    assert info.value.status == 400
    assert info.value.envelope()["error"]["type"] == "invalid_request_error"
    return info.value


def nested(depth: int, kind: str = "[") -> bytes:
    """`depth` levels of arrays or objects, innermost empty (depth >= 1)."""
    if kind == "[":
        return b"[" * depth + b"]" * depth
    return b'{"k":' * (depth - 1) + b"{}" + b"}" * (depth - 1)


@pytest.mark.parametrize("kind", ["[", "{"])
def test_nesting_up_to_the_limit_is_accepted_and_one_more_is_refused(kind: str) -> None:
    # The body object is the first level: a field may nest MAX_NESTING - 1 more.
    fits = b'{"model": "m", "x": ' + nested(MAX_NESTING - 1, kind) + b"}"
    assert decode_object(fits)["model"] == "m"
    error = refuse(b'{"model": "m", "x": ' + nested(MAX_NESTING, kind) + b"}")
    assert error.param == "x"
    assert str(MAX_NESTING) in error.message


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 900, 990, 5_000, 100_000])
def test_deep_bodies_are_refused_naming_the_field_whatever_the_depth(depth: int) -> None:
    """Past about a thousand levels msgspec raises RecursionError (it was a 500); a little
    shallower the body decoded but could not be encoded again for the engine."""
    error = refuse(b'{"model": "m", "messages": [], "guided_json": ' + nested(depth) + b"}")
    assert error.param == "guided_json"


def test_deep_nesting_at_the_top_level_has_no_field() -> None:
    assert refuse(nested(100_000)).param is None
    assert refuse(b"[" * 100_000).param is None  # not even closed


def test_deep_nesting_is_found_behind_a_wide_shallow_part() -> None:
    wide = b"[" + b",".join([b"[[1]]"] * 10_000) + b"]"
    raw = b'{"a": ' + wide + b', "b": {"c": ' + nested(MAX_NESTING) + b"}}"
    assert refuse(raw).param == "b"


def test_nesting_is_told_from_brackets_in_strings() -> None:
    text = json.dumps("[" * 10_000)  # a string of brackets nests nothing
    assert decode_object(b'{"content": ' + text.encode() + b"}")["content"] == "[" * 10_000


def test_recursion_error_cannot_escape_at_any_stack_depth() -> None:
    """Called deep in a stack (as in a handler), a refusal is still an InvalidRequest."""

    def at_depth(n: int) -> InvalidRequest:
        return at_depth(n - 1) if n else refuse(b'{"x": ' + nested(2_000) + b"}")

    assert at_depth(sys.getrecursionlimit() // 2).param == "x"


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"temperature": 1e400}', "temperature"),
        (b'{"model": "m", "top_p": -1e400}', "top_p"),
        (b'{"model": "m", "logit_bias": {"5": 1e999}}', "logit_bias"),
        (b'{"model": "m", "seed": ' + b"9" * 5_000 + b"}", "seed"),  # past int digits limit
    ],
)
def test_a_number_out_of_range_names_its_field(raw: bytes, param: str) -> None:
    error = refuse(raw)
    assert error.param == param
    assert "out of range" in error.message
    assert "$[" not in error.message  # msgspec's path: param says it better


def test_a_large_integer_within_range_decodes_exactly() -> None:
    assert decode_object(b'{"seed": ' + b"9" * 400 + b"}")["seed"] == int("9" * 400)


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"model": "m", "messages": [{"role": "user", "content": "a\xffb"}]}', "messages"),
        (b'{"model": "m", "user": "\xc0\xaf"}', "user"),  # an overlong encoding of "/"
        (b'{"model": "m", "user": "\xed\xa0\x80"}', "user"),  # a surrogate, UTF-8 encoded
    ],
)
def test_invalid_utf8_names_its_field(raw: bytes, param: str) -> None:
    error = refuse(raw)
    assert error.param == param
    assert "UTF-8" in error.message


@pytest.mark.parametrize(
    ("raw", "param", "escape"),
    [
        (
            rb'{"model": "m", "messages": [{"role": "user", "content": "\ud800"}]}',
            "messages",
            "ud800",
        ),
        (rb'{"model": "m", "user": "x\uDBFFy"}', "user", "uDBFF"),
        (rb'{"model": "m", "user": "\udc00"}', "user", "udc00"),  # a low half alone
        (rb'{"model": "m", "user": "\ud800\ud800"}', "user", "ud800"),  # two high halves
        (rb'{"\ud800": 1}', None, "ud800"),  # in a key: no field to name
    ],
)
def test_a_lone_surrogate_escape_is_refused_by_name(
    raw: bytes, param: str | None, escape: str
) -> None:
    """msgspec's own word for this was "Input data was truncated"."""
    error = refuse(raw)
    assert error.param == param
    assert escape in error.message and "surrogate" in error.message


def test_surrogate_pairs_and_escaped_backslashes_are_not_lone_surrogates() -> None:
    body = decode_object(rb'{"a": "\ud83d\ude00", "b": "\\ud800", "c": "\\\ud83d\ude00"}')
    assert body == {"a": "\U0001f600", "b": "\\ud800", "c": "\\\U0001f600"}


@pytest.mark.parametrize(
    "raw", [b"", b"   ", b"{", b'{"a": 1,}', b'{"a" 1}', b"\xef\xbb\xbf{}", b"{} {}", b"nul"]
)
def test_malformed_json_is_refused_without_a_field(raw: bytes) -> None:
    error = refuse(raw)
    assert error.param is None
    assert error.message.startswith("Invalid JSON body")


@pytest.mark.parametrize("raw", [b"[]", b"1", b'"s"', b"null", b"[1e400]"])
def test_only_an_object_is_a_body(raw: bytes) -> None:
    refuse(raw)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=5), children, max_size=5)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(value=st.dictionaries(st.text(max_size=5), json_values, max_size=5))
def test_any_object_within_the_limit_decodes_to_itself(value: dict[str, object]) -> None:
    assert decode_object(msgspec.json.encode(value)) == value


def _mutations(raw: bytes) -> st.SearchStrategy[bytes]:
    cut = st.integers(0, len(raw))
    return st.one_of(
        cut.map(lambda i: raw[:i]),  # truncated
        st.tuples(cut, st.binary(min_size=1, max_size=8)).map(
            lambda t: raw[: t[0]] + t[1] + raw[t[0] :]  # bytes inserted
        ),
        st.tuples(cut, st.sampled_from([b"\\ud800", b"\xff", b"[" * 3000, b"1e999", b"\\"])).map(
            lambda t: raw[: t[0]] + t[1] + raw[t[0] :]
        ),
    )


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_bytes_give_an_object_or_an_invalid_request(data: st.DataObject) -> None:
    """Never RecursionError, ValueError or anything else: a dict or a 400."""
    value = data.draw(st.dictionaries(st.text(max_size=5), json_values, max_size=4))
    raw = data.draw(_mutations(msgspec.json.encode(value)) | st.binary(max_size=64))
    try:
        body = decode_object(raw)
    except InvalidRequest as error:
        assert error.status == 400
        assert error.param is None or isinstance(error.param, str)
        assert len(error.message) < 400
    else:
        assert isinstance(body, dict)


# --- depth from the bytes alone (engine error bodies) --------------------------------------


def depth_of(value: object) -> int:
    """The nesting of a decoded value, arrays and objects counted (the reference)."""
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


@pytest.mark.parametrize("kind", ["[", "{"])
def test_nested_deeper_than_tells_the_limit_from_the_bytes(kind: str) -> None:
    assert not nested_deeper_than(nested(MAX_NESTING, kind))
    assert nested_deeper_than(nested(MAX_NESTING + 1, kind))
    # Far past what msgspec could decode, and unclosed: told without decoding.
    assert nested_deeper_than(b"[" * 2000)
    assert nested_deeper_than(b'{"error":' * 1000)


def test_nested_deeper_than_skips_brackets_in_strings() -> None:
    raw = b'{"message": "' + b"[{" * 500 + b'\\", "x": "\\"[["}'
    assert not nested_deeper_than(raw, 2)
    assert nested_deeper_than(b'{"a": "]]]]", "b": [[[]]]}', 3)


@settings(max_examples=300, deadline=None)
@given(value=json_values, limit=st.integers(0, 6))
def test_nested_deeper_than_agrees_with_the_decoded_depth(value: object, limit: int) -> None:
    raw = msgspec.json.encode(value)
    assert nested_deeper_than(raw, limit) == (depth_of(value) > limit)
