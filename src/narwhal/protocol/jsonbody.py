"""Decoding a client's JSON body (sans-IO): one object, nested at most MAX_NESTING levels,
and every fault an InvalidRequest that says what is wrong and, where it can be told, under
which top-level field (`param`).

Why a nesting limit: msgspec decodes (and encodes) in C but recurses once per level, under
Python's recursion limit. A body nested about a thousand levels deep makes it raise
RecursionError, and one a little shallower decodes here but fails when the body is encoded
again for the engine, deeper in the stack. Both were 500s. Past MAX_NESTING levels a body is
refused with a 400 instead; 128 is serde_json's default limit (the parsers behind many
engines and proxies refuse deeper bodies anyway), and far deeper than any tool schema or
guided-decoding grammar seen in practice.

Finding the field costs a second look at the bytes; it is done only for a body that is
already refused, so a valid body is decoded exactly once.

The same limit serves engine answers (`engines/client.py`). `nested_deeper_than` tells it
from the bytes alone, before any decoding, for small bodies (an error answer) whose depth
must be known before msgspec recurses into them: catching RecursionError alone is no
guard, since how deep msgspec gets depends on how deep in the stack it is called, and a
value that decoded may still fail when it is encoded again, deeper. `nested_past` tells
it from a decoded value, for large ones (a non-streaming answer), where it is cheaper
than a second look at the bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import accumulate, chain, compress, repeat
from operator import is_
from typing import Any

import msgspec

from narwhal.errors import InvalidRequest

MAX_NESTING = 128
"""The deepest nesting of arrays and objects accepted, the body object itself counted."""

_decoder = msgspec.json.Decoder()
_fields_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])

# The structural tokens of a JSON text: strings (whole, escapes included) and the six
# punctuation bytes. Numbers and literals are skipped; they never change the nesting.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:,]', re.DOTALL)
# A \u escape of a UTF-16 surrogate that is not half of a pair (RFC 8259 §7 allows the
# escape; msgspec refuses it, and no engine could take the string as UTF-8). The leading
# group skips escaped backslashes, so `\\ud800` (a backslash, then "ud800") does not count.
_LONE_SURROGATE = re.compile(
    rb"(?:^|[^\\])(?:\\\\)*"
    rb"(\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)
# msgspec's " - at `$[...]`" suffix: no help once the field is named.
_MSGSPEC_PATH = re.compile(r" - at `\$[^`]*`$")
_CONTAINERS = frozenset((list, dict))  # what msgspec decodes arrays and objects to
_OPEN = frozenset(b"[{")
_CLOSE = frozenset(b"]}")
_QUOTE, _COLON, _COMMA, _BRACE = (ord(c) for c in '":,{')
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [1 if b in _OPEN else -1 if b in _CLOSE else 0 for b in range(256)]


def decode_object(raw: bytes) -> dict[str, Any]:
    """The body as a dict; InvalidRequest if it is not JSON, not an object, or too deep."""
    try:
        body = _decoder.decode(raw)
    except msgspec.DecodeError as error:
        raise _diagnose(raw, error) from None
    except RecursionError:
        raise _too_deep(_field_nested_past(raw, MAX_NESTING)) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    # Nesting deeper than the limit needs more opening brackets than the limit: most bodies
    # have far fewer, and are not walked at all.
    if raw.count(b"[") + raw.count(b"{") > MAX_NESTING:
        for name, value in body.items():
            if nested_past(value, MAX_NESTING - 1):
                raise _too_deep(name)
    return body


def nested_deeper_than(raw: bytes, limit: int = MAX_NESTING) -> bool:
    """Whether the JSON text `raw` nests arrays and objects more than `limit` levels deep,
    told from its bytes without decoding them.

    Strings go first (a bracket in one is text); what is left is reduced to its brackets,
    whose running sum is the depth. All of it is C-level (a regex, `bytes.translate`,
    `accumulate`): about 2 ms for 64 KiB. A text that is not JSON gets some depth all the
    same; the decoder refuses it after."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > limit


def nested_past(value: object, limit: int = MAX_NESTING) -> bool:
    """Whether `value` holds arrays or objects more than `limit` levels deep (itself counted).

    Level by level, never recursively, stopping at the first level past the limit. Each
    level is one pass of C-level iterators (map, compress, chain) over the containers and
    their items, so even a megabyte of small arrays is walked in tens of milliseconds.
    """
    level: list[Any] = [value] if type(value) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        kinds = list(map(type, level))
        lists = compress(level, map(is_, kinds, repeat(list)))
        dicts = compress(level, map(is_, kinds, repeat(dict)))
        values = chain.from_iterable(map(dict.values, dicts))
        items = list(chain(chain.from_iterable(lists), values))
        level = list(compress(items, map(_CONTAINERS.__contains__, map(type, items))))
    return False


def _too_deep(field: str | None) -> InvalidRequest:
    where = "The request body" if field is None else f"'{field}'"
    return InvalidRequest(
        f"{where} is nested more than {MAX_NESTING} levels deep (arrays and objects).",
        param=field,
    )


def _diagnose(raw: bytes, error: msgspec.DecodeError) -> InvalidRequest:
    """The clearest refusal for a body msgspec would not decode."""
    surrogate = _LONE_SURROGATE.search(raw)
    if surrogate is not None:
        offset = surrogate.start(1)
        escape = surrogate.group(1).decode("ascii")
        field = _field_at(raw, offset)
        where = "the request body" if field is None else f"'{field}'"
        return InvalidRequest(
            f"Invalid JSON in {where}: the escape \\{escape[1:]} at byte {offset} is half of a "
            "UTF-16 surrogate pair; strings must be valid Unicode.",
            param=field,
        )
    # The body may be a well-formed object with one bad value (a number out of range,
    # invalid UTF-8 in a string): say which.
    try:
        fields = _fields_decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return InvalidRequest(f"Invalid JSON body: {error}")
    for name, value in fields.items():
        try:
            _decoder.decode(value)
        except msgspec.DecodeError as field_error:
            detail = _MSGSPEC_PATH.sub("", str(field_error))  # param names the field
            return InvalidRequest(f"Invalid JSON in '{name}': {detail}.", param=name)
        except RecursionError:
            return _too_deep(name)
    return InvalidRequest(f"Invalid JSON body: {error}")


def _field_nested_past(raw: bytes, limit: int) -> str | None:
    """The top-level field in which nesting first passes `limit`, if it can be told."""
    for _, depth, field in _structure(raw):
        if depth > limit:
            return field
    return None


def _field_at(raw: bytes, offset: int) -> str | None:
    """The top-level field whose value holds byte `offset`, if it can be told."""
    field = None
    for start, _, field_here in _structure(raw):
        if start > offset:
            break
        field = field_here
    return field


def _structure(raw: bytes) -> Iterator[tuple[int, int, str | None]]:
    """(offset, depth after it, top-level field being read) for each structural token.

    The field is known from the colon after a key of the top-level object to the comma
    (or closing brace) that ends its value; None elsewhere, and for a top level that is
    not an object.
    """
    depth = 0
    top_object = False
    key: bytes | None = None
    field: str | None = None
    for match in _TOKEN.finditer(raw):
        start = match.start()
        byte = raw[start]
        if byte == _QUOTE:
            if depth == 1 and field is None:
                key = match.group()
        elif byte in _OPEN:
            if depth == 0:
                top_object = byte == _BRACE
            depth += 1
        elif byte in _CLOSE:
            depth -= 1
            if depth == 0:
                field = None
        elif depth == 1 and top_object:
            if byte == _COLON:
                field = _key_text(key)
            elif byte == _COMMA:
                field, key = None, None
        yield start, depth, field


def _key_text(key: bytes | None) -> str | None:
    if key is None:
        return None
    try:
        text = _decoder.decode(key)
    except msgspec.DecodeError:
        return None
    return text if isinstance(text, str) else None
