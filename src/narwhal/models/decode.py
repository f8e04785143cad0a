"""Decode correction (sans-IO): the decode work still ahead on one engine, corrected by
what each decoding request has produced so far.

A request's expected output at placement is a prediction (`OutputLengths.predict`);
once it decodes, the tokens it has produced say more: it still has
`OutputLengths.remaining(produced)` to go, the expectation over the lengths longer than
what it has produced, never less than one token while under its cap. A request past its
predicted length is therefore not assumed to end at once, and one that stopped early
is not counted after it has.

The engine's book answers, for a new request that will decode `horizon` tokens there:
how many others will, on average, be decoding beside it (each counts for the share of
the horizon it is expected to last), which is the batch its TPOT is projected at; and
how many tokens of decode work the engine still has. Reading each request's progress
is O(requests decoding), so the answers are refreshed at most every `refresh_s` and
read from the cache between; memory is one entry per request decoding there.
"""

from __future__ import annotations

from dataclasses import dataclass

from narwhal.models.lengths import OutputLengths
from narwhal.protocol.requests import Route


@dataclass(slots=True)
class _Decoding:
    route: Route
    prompt_tokens: int
    cap: int | None
    produced: int = 0  # output tokens so far, as last reported (`DecodeBook.produced`)


class DecodeBook:
    def __init__(self, lengths: OutputLengths, *, refresh_s: float = 0.05) -> None:
        self._lengths = lengths
        self._refresh_s = refresh_s
        self._decoding: dict[object, _Decoding] = {}
        self._at = float("-inf")
        self._remaining: list[float] = []  # expected tokens still to come, per request
        self._kv: list[float] = []  # the KV each holds now (prompt and output so far)

    def __len__(self) -> int:
        return len(self._decoding)

    @property
    def lengths(self) -> OutputLengths:
        return self._lengths

    def start(
        self, key: object, route: Route, prompt_tokens: int, cap: int | None, produced: int = 0
    ) -> None:
        self._decoding[key] = _Decoding(route, prompt_tokens, cap, produced)
        self._at = float("-inf")

    def produced(self, key: object, tokens: int) -> None:
        """The request has produced `tokens` output tokens so far (reported in batches:
        read at the next refresh)."""
        decoding = self._decoding.get(key)
        if decoding is not None:
            decoding.produced = tokens

    def stop(self, key: object) -> None:
        if self._decoding.pop(key, None) is not None:
            self._at = float("-inf")

    def remaining(self, now: float) -> list[float]:
        """Expected tokens still to come, per request decoding (refreshed lazily)."""
        if now - self._at >= self._refresh_s:
            lengths = self._lengths
            remaining = []
            kv = []
            for d in self._decoding.values():
                produced = d.produced
                remaining.append(lengths.remaining(d.route, d.prompt_tokens, produced, d.cap))
                kv.append(float(d.prompt_tokens + produced))
            self._remaining, self._kv = remaining, kv
            self._at = now
        return self._remaining

    def kv_tokens(self, now: float) -> float:
        """KV tokens the requests decoding here hold now."""
        self.remaining(now)
        return sum(self._kv)

    def tokens_until_freed(self, kv_needed: float, now: float) -> float | None:
        """Decode tokens (of the request that frees the last of it) until requests
        finishing in order of their remaining work have freed `kv_needed` KV tokens;
        None when all of them together would not."""
        remaining = self.remaining(now)
        freed = 0.0
        for left, kv in sorted(zip(remaining, self._kv, strict=True)):
            freed += kv + left  # it grows by what it still produces, then lets it all go
            if freed >= kv_needed:
                return left
        return None

    def expected_batch(self, horizon: float, now: float) -> float:
        """Requests decoding beside a new one over its next `horizon` tokens, each
        counted for the share of the horizon it is expected to last."""
        if horizon <= 0:
            return float(len(self._decoding))
        return sum(min(1.0, left / horizon) for left in self.remaining(now))

    def work(self, now: float) -> float:
        """Decode tokens still expected of the requests decoding here."""
        return sum(self.remaining(now))
