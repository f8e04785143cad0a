"""Probe prompts of a wanted length in the engine's own tokens (I/O side).

A probe's length is what the engine counts, not what Narwhal's default tokenizer (the
simulator's) makes of the text: a real model's tokenizer can count the same words two
or three times over, and a probe sized in the wrong tokens can exceed the engine's
`max_model_len` (vLLM answers 400) or measure another length than the fit assumes.

How a text is counted, best first (`ProbeCounter`):
- the engine's own tokenizer, through its tokenize endpoint (vLLM, SGLang: POST
  /tokenize with the completion form, which counts what a completion's prompt counts);
- the configured `tokenizer:` (a tokenizer.json), when the engine has no such endpoint;
- neither: an estimate (`ProbeText.estimate`), one token per word at first (true of the
  simulator's tokenizer and of common BPE vocabularies for these words), corrected by
  what the engine itself counted for the probes before (`usage.prompt_tokens`).

`ProbeText.build` counts a text, lengthens or shortens it by the tokens per word it
measured, and counts again, at most `MAX_ROUNDS` times; it never returns a text counted
over the wanted length. The words come in a random order, so that no two probes share a
prefix an engine could have cached.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable
from typing import Final

import aiohttp
import msgspec

from narwhal.config import FleetConfig
from narwhal.engines.answers import AnswerTooLarge, read_bounded
from narwhal.engines.client import EngineClient
from narwhal.engines.session import HttpSession
from narwhal.models.profile import ProfileError
from narwhal.protocol.dialects import DialectCapabilities
from narwhal.sizing.remote import answer_count

MAX_ROUNDS: Final = 4  # tokenize round trips per probe text
# A count comes in milliseconds from an engine that is not swamped; one that takes longer
# is sized by estimate for the rest of the run (checked against its usage), so that a slow
# tokenize endpoint cannot hold profiling for minutes.
TOKENIZE_TIMEOUT_S: Final = 1.0
# `fleet.max_probe_answer_bytes`' default: a probe text's /tokenize answer lists its
# tokens, some bytes each, and probes may be long (`fleet.probe_prompt_tokens`).
DEFAULT_MAX_ANSWER_BYTES: Final = FleetConfig().max_probe_answer_bytes
_PREFIX: Final = "Narwhal profile"
# One token each in the simulator's tokenizer and in common BPE vocabularies.
_WORDS: Final = (
    " time", " year", " way", " day", " man", " thing", " world", " life", " hand",
    " part", " child", " eye", " woman", " place", " work", " week", " case", " point",
    " group", " fact",
)  # fmt: skip
# Before anything was counted: the prefix and a BOS, about.
_OVERHEAD: Final = 5.0
# The share of a target an estimated (uncounted) text aims at, before and after the
# engine has counted one: an estimate may be off, the engine's limit is not.
_UNCOUNTED_SHARE: Final = 0.8
_CALIBRATED_SHARE: Final = 0.95

_CHAT_TEMPLATE_TOKENS: Final = 4

Count = Callable[[str], Awaitable[int | None]]


class ProbeText:
    """The texts of one profiling run on one engine, and what it learned of its tokens."""

    def __init__(self, count: Count | None, rng: random.Random) -> None:
        """`count` gives a text's token count by the engine's tokenizer, or None when it
        cannot tell (the run estimates from then on); no `count`: every text estimated."""
        self._count = count
        self._rng = rng
        self.per_word = 1.0
        self.overhead = _OVERHEAD
        self._calibrated = False  # per_word measured (a count, or the engine's usage)
        self._usage: dict[int, int] = {}  # words -> the engine's count, from its usage
        self.round_trips = 0

    @property
    def counted(self) -> bool:
        """Whether texts are counted (not estimated)."""
        return self._count is not None

    async def build(self, target: int) -> tuple[str, int]:
        """A text of at most `target` tokens and as near it as the counts allow, with the
        count it was sized by (an estimate when nothing counts)."""
        words = self._rng.choices(_WORDS, k=2 * target + 16)
        if self._count is None:
            return self.estimate(words, target)
        n = self._words_for(target)
        best: tuple[int, int] | None = None  # (words, count) of the longest text that fits
        tried: dict[int, int] = {}
        for round_ in range(2 * MAX_ROUNDS):
            if round_ >= MAX_ROUNDS and best is not None:
                break  # the usual rounds are spent, and a text fits
            n = max(0, min(len(words), n))
            counted = await self._count(_text(words, n))
            self.round_trips += 1
            if counted is None:
                self._count = None  # the counter failed: estimate, as it said
                return self.estimate(words, target)
            tried[n] = counted
            self._learn_from(tried)
            if counted <= target and (best is None or counted > best[1]):
                best = (n, counted)
            if counted == target:
                break
            if counted > target:
                # Down by at least what the excess needs at the tokens a word takes (a
                # word less may take one token off or several: never step short of it).
                step = -max(1, math.ceil((counted - target) / self.per_word))
            else:
                step = max(1, round((target - counted) / self.per_word))
            n = n + step
            if n in tried:
                break
        if best is None:
            raise ProfileError(
                f"could not make a probe prompt of at most {target} tokens: the shortest "
                f"counted {min(tried.values())}"
            )
        return _text(words, best[0]), best[1]

    def estimate(self, words: list[str], target: int) -> tuple[str, int]:
        """Sized by the tokens per word learned so far (`learn`), aiming below the target:
        at 80% of it before anything was counted, at 95% after (no count: the engine's
        limit must hold all the same)."""
        share = _CALIBRATED_SHARE if self._calibrated else _UNCOUNTED_SHARE
        aim = max(1, int(share * target))
        n = max(0, min(len(words), self._words_for(aim)))
        return _text(words, n), round(self.overhead + n * self.per_word)

    def learn(self, text: str, engine_count: int) -> None:
        """The engine counted `engine_count` prompt tokens for `text` (its usage): the
        estimate's tokens per word follow it."""
        n = text.count(" ") - _PREFIX.count(" ")
        if n < 0 or engine_count <= 0:
            return
        self._usage[n] = engine_count
        self._learn_from(self._usage)

    def _words_for(self, target: int) -> int:
        return round((target - self.overhead) / self.per_word)

    def _learn_from(self, tried: dict[int, int]) -> None:
        """Tokens per word and the fixed part (prefix, BOS, a chat template), from counts
        of texts of several lengths: the line through the shortest and the longest."""
        points = sorted(tried.items())
        if len(points) >= 2:
            (n0, c0), (n1, c1) = points[0], points[-1]
            if n1 > n0 and c1 > c0:
                self.per_word = (c1 - c0) / (n1 - n0)
                self.overhead = c0 - self.per_word * n0
                self._calibrated = True
                return
        n, counted = points[-1]
        if n > 0:
            self.per_word = max(0.05, (counted - self.overhead) / n)
            self._calibrated = True


def _text(words: list[str], n: int) -> str:
    return _PREFIX + "".join(words[:n])


class ProbeCounter:
    """Counts a completion prompt's tokens by an engine's tokenize endpoint, else by a
    configured tokenizer; None when neither can (the probes then estimate)."""

    def __init__(
        self,
        session: HttpSession | None,
        local: Callable[[str], int] | None,
        *,
        model: str,
        timeout_s: float = TOKENIZE_TIMEOUT_S,
        max_answer_bytes: Callable[[], int] = lambda: DEFAULT_MAX_ANSWER_BYTES,
        learned: Callable[[str, int], None] | None = None,
    ) -> None:
        """`learned(text, count)`: told each engine count of a probe text (prompt sizing
        learns the engine's tokens from it before any client's request)."""
        self._session = session
        self._learned = learned
        self._local = local
        self._model = model
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        # fleet.max_probe_answer_bytes, read at each call (a reload applies to the next).
        self._max_answer_bytes = max_answer_bytes

    def for_engine(
        self, client: EngineClient, engine: DialectCapabilities, *, completion: bool
    ) -> Count | None:
        """How this engine's probe texts are counted (None: estimated). Chat probes
        (engines without token IDs on completions) are counted by the local tokenizer only:
        the tokenize endpoints that render a chat template are the IDs' dialects'."""
        path = engine.tokenize_path
        session = self._session
        local = self._local
        if completion and path is not None and session is not None:
            url = client.engine.url.rstrip("/") + path
            auth = client.engine.authorization
            headers = {"Content-Type": "application/json"}
            if auth is not None:
                headers["Authorization"] = auth
            # Asked once a run: an engine without the endpoint is not asked again.
            absent = False

            async def by_engine(text: str) -> int | None:
                nonlocal absent
                if not absent:
                    count = await self._tokenize(session, url, headers, text)
                    if count is not None:
                        if self._learned is not None:
                            self._learned(text, count)
                        return count
                    absent = True
                return None if local is None else local(text)

            return by_engine
        if local is None:
            return None
        # A chat probe is one user message: its text and the template's tokens around it
        # (the allowance local sizing makes per message).
        extra = 0 if completion else _CHAT_TEMPLATE_TOKENS

        async def by_tokenizer(text: str) -> int | None:
            return local(text) + extra

        return by_tokenizer

    async def _tokenize(
        self, session: HttpSession, url: str, headers: dict[str, str], text: str
    ) -> int | None:
        body = msgspec.json.encode({"model": self._model, "prompt": text})
        try:
            async with session.post(
                url, data=body, headers=headers, timeout=self._timeout
            ) as response:
                if response.status != 200:
                    return None
                raw = await read_bounded(response, self._max_answer_bytes())
        except (aiohttp.ClientError, TimeoutError, AnswerTooLarge, OSError):
            return None
        count = answer_count(raw)
        return count if count is not None and count > 0 else None
