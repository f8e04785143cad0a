"""Fixtures shared by every test folder."""

from __future__ import annotations

import gc
import socket
from collections.abc import Iterator

import pytest


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
