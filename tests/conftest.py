"""Fixtures shared by every test folder."""

from __future__ import annotations

import gc
import socket
from collections.abc import Iterator

import pytest

# The real engines' test groups (tests/real), run last in the parallel run (scripts/check.py
# keeps this order: --no-loadscope-reorder): scheduled first, as xdist's reordering by size
# put them, each held a worker idle while the engines installed beside the suite (minutes on
# a fresh machine); last, the engines are installed by the time a worker reaches them, and
# a real vLLM's two busy cores no longer slow the timing-bound tests beside it. vLLM's
# group, the longer, comes first of the two.
LAST_GROUPS = ("real-vllm", "real-transformers")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        group = item.get_closest_marker("xdist_group")
        name = group.args[0] if group is not None and group.args else None
        return 1 + LAST_GROUPS.index(name) if name in LAST_GROUPS else 0

    items.sort(key=rank)  # stable: every other test keeps its place


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port with nothing listening on it (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield port


@pytest.fixture
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector off for the test: what is freed then was freed by
    reference counting, so nothing of it waited on a cycle."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
