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
how many tokens of decode work the engine still has.

Every predictive check reads these, so each request's expected remainder is kept with it
rather than computed per read (computing it walks the learned length histogram: with 64
requests decoding and the remainders recomputed on every start and stop, the book cost
0.4 ms of each check, `scripts/perf/decision.py`). A remainder is computed when its
request starts and when its output is reported (`produced`, in the gate's batches), and
all of them again at most every `refresh_s`, so that they follow what the lengths learn
meanwhile. A read is then O(requests decoding) additions (the KV held, read by every projection, is
a running total: O(1)); memory is one entry per request decoding there.
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
    left: float = 0.0  # expected tokens still to come, as of `produced`

    @property
    def kv(self) -> float:
        """The KV it holds now: its prompt and its output so far."""
        return float(self.prompt_tokens + self.produced)


class DecodeBook:
    def __init__(self, lengths: OutputLengths, *, refresh_s: float = 1.0) -> None:
        self._lengths = lengths
        self._refresh_s = refresh_s
        self._decoding: dict[object, _Decoding] = {}
        self._kv = 0  # the KV tokens of all of them (`kv_tokens`), kept as they change
        self._at = float("-inf")

    def __len__(self) -> int:
        return len(self._decoding)

    @property
    def lengths(self) -> OutputLengths:
        return self._lengths

    def _left(self, d: _Decoding) -> float:
        return self._lengths.remaining(d.route, d.prompt_tokens, d.produced, d.cap)

    def start(
        self, key: object, route: Route, prompt_tokens: int, cap: int | None, produced: int = 0
    ) -> None:
        decoding = _Decoding(route, prompt_tokens, cap, produced)
        decoding.left = self._left(decoding)
        self.stop(key)  # a key started again replaces what it held
        self._decoding[key] = decoding
        self._kv += prompt_tokens + produced

    def produced(self, key: object, tokens: int) -> None:
        """The request has produced `tokens` output tokens so far (reported in batches)."""
        decoding = self._decoding.get(key)
        if decoding is not None and decoding.produced != tokens:
            self._kv += tokens - decoding.produced
            decoding.produced = tokens
            decoding.left = self._left(decoding)

    def stop(self, key: object) -> None:
        decoding = self._decoding.pop(key, None)
        if decoding is not None:
            self._kv -= decoding.prompt_tokens + decoding.produced

    def _refresh(self, now: float) -> None:
        """Every remainder again, by what the lengths have learned, at most every
        `refresh_s`."""
        if now - self._at >= self._refresh_s:
            for decoding in self._decoding.values():
                decoding.left = self._left(decoding)
            self._at = now

    def remaining(self, now: float) -> list[float]:
        """Expected tokens still to come, per request decoding."""
        self._refresh(now)
        return [d.left for d in self._decoding.values()]

    def kv_tokens(self, now: float) -> float:
        """KV tokens the requests decoding here hold now."""
        return float(self._kv)

    def tokens_until_freed(self, kv_needed: float, now: float) -> float | None:
        """Decode tokens (of the request that frees the last of it) until requests
        finishing in order of their remaining work have freed `kv_needed` KV tokens;
        None when all of them together would not."""
        self._refresh(now)
        freed = 0.0
        for left, kv in sorted((d.left, d.kv) for d in self._decoding.values()):
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
