"""The tokenize cache: bounded, least recently used out first."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.protocol.requests import parse_request
from narwhal.sizing.cache import CountCache
from narwhal.sizing.remote import make_query


def test_holds_at_most_its_capacity_and_drops_the_least_recently_used() -> None:
    cache = CountCache(3)
    for i, key in enumerate((b"a", b"b", b"c")):
        cache.put(key, i)
    assert cache.get(b"a") == 0  # a is now the most recently used
    cache.put(b"d", 3)
    assert len(cache) == 3
    assert cache.get(b"b") is None  # the least recently used went
    assert [cache.get(k) for k in (b"a", b"c", b"d")] == [0, 2, 3]


def test_putting_a_known_key_refreshes_it_without_growing() -> None:
    cache = CountCache(2)
    cache.put(b"a", 1)
    cache.put(b"b", 2)
    cache.put(b"a", 5)
    cache.put(b"c", 3)
    assert len(cache) == 2
    assert cache.get(b"a") == 5
    assert cache.get(b"b") is None


def test_capacity_zero_stores_nothing() -> None:
    cache = CountCache(0)
    cache.put(b"a", 1)
    assert len(cache) == 0
    assert cache.get(b"a") is None
    with pytest.raises(ValueError):
        CountCache(-1)


def _query_key(route: str, body: dict[str, Any]) -> bytes | None:
    raw = json.dumps({"model": "m", **body}).encode()
    query = make_query(parse_request(raw, route, model="m"))  # type: ignore[arg-type]
    return None if query is None else query.key


def test_keys_are_fixed_size_digests_of_route_and_prompt_content() -> None:
    chat = _query_key("chat", {"messages": [{"role": "user", "content": "hi"}]})
    assert chat is not None and len(chat) == 16
    # Fields that do not change the prompt do not change the key.
    assert chat == _query_key(
        "chat", {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.5}
    )
    # The route is part of it, and so is every field that changes the rendered prompt.
    assert _query_key("completion", {"prompt": "hi"}) != _query_key("completion", {"prompt": "ho"})
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    with_tools = _query_key(
        "chat", {"messages": [{"role": "user", "content": "hi"}], "tools": tools}
    )
    assert with_tools not in (None, chat)


def test_keys_keep_the_clients_key_order() -> None:
    """Decided: no canonical key order. Chat templates render tool schemas with their keys in
    the order given (tojson keeps it), so two orders can be two token counts; a miss costs
    one call, a wrong hit a wrong count."""
    a = {"type": "object", "properties": {"x": {"type": "string"}}}
    b = {"properties": {"x": {"type": "string"}}, "type": "object"}
    key_a, key_b = (
        _query_key(
            "chat",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": p}}],
            },
        )
        for p in (a, b)
    )
    assert key_a != key_b
