"""A bounded least-recently-used map from a prompt's digest to its token count.

Keys are fixed-size digests, never prompt text, so memory is bounded by the entry count
alone: 4096 entries of a 16-byte key and an int are a few hundred kilobytes.
"""

from __future__ import annotations

from collections import OrderedDict


class CountCache:
    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._capacity = capacity
        self._entries: OrderedDict[bytes, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> int | None:
        count = self._entries.get(key)
        if count is not None:
            self._entries.move_to_end(key)
        return count

    def put(self, key: bytes, count: int) -> None:
        if self._capacity == 0:
            return
        self._entries[key] = count
        self._entries.move_to_end(key)
        if len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
