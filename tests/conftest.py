"""Fixtures shared by every test folder."""

from __future__ import annotations

import gc
import socket
from collections.abc import Iterator

import pytest

# Where the real engines' test groups (tests/real) run in the parallel run (scripts/check.py
# keeps the collection's order: --no-loadscope-reorder). Scheduled first, as xdist's
# reordering by size put them, each held a worker idle while the engines installed beside
# the suite (minutes on a fresh machine), and a real vLLM's busy cores slowed the
# end-to-end tests beside it; last, the other workers idled while vLLM's group ran. So they
# come after the end-to-end tests (by then the install is done), vLLM's first, and the other
# workers meanwhile run the fast unit tests of the folders after them.
LATE_GROUPS = ("real-vllm", "real-transformers")


def _late_group(item: pytest.Item) -> int | None:
    group = item.get_closest_marker("xdist_group")
    name = group.args[0] if group is not None and group.args else None
    return LATE_GROUPS.index(name) if name in LATE_GROUPS else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    groups: list[list[pytest.Item]] = [[] for _ in LATE_GROUPS]
    rest: list[pytest.Item] = []
    for item in items:
        group = _late_group(item)
        (rest if group is None else groups[group]).append(item)
    late = [item for group in groups for item in group]
    end_to_end = [i for i, item in enumerate(rest) if item.nodeid.startswith("tests/e2e/")]
    at = end_to_end[-1] + 1 if end_to_end else len(rest)
    items[:] = rest[:at] + late + rest[at:]


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
