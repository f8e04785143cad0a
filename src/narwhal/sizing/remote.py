"""Prompt token counts from an engine's own tokenizer, through its tokenize endpoint.

Where each dialect has one, and what it is sent:

- vllm: `POST /tokenize`, `{"model", "prompt"}` for a completion, or the chat form
  `{"model", "messages", "add_generation_prompt": true, "tools"?}`, which renders the chat
  template as a chat completion does; the answer is `{"count", "max_model_len", "tokens"}`
  [PROTOCOL.md §5.2; vllm-project/vllm vllm/entrypoints/serve/tokenize/protocol.py,
  `TokenizeChatRequest`, which has `tools` and `chat_template_kwargs`].
- sglang: `POST /tokenize` (also `/v1/tokenize`), the same completion form, and for chat
  `{"model", "messages", "tools"?}` without `add_generation_prompt`: left out, the messages
  are rendered as for a chat completion; given, SGLang renders them another way and refuses
  it for models without a Jinja template. The answer has the same `count`
  [sglang 0.5.15 and 0.5.23 wheels: srt/entrypoints/openai/protocol.py `TokenizeRequest`,
  serving_tokenize.py, srt/entrypoints/http_server.py]. SGLang before 0.5.15 was not read;
  one that knows no `messages` answers chat forms with an error, counted and fallen back.
- openai: none (`transformers serve` and llama.cpp's OpenAI routes have no such endpoint).

What is never sent: a prompt given as token IDs (counted here, exactly), a completion batch
of more than one text, and chat messages with parts other than text (an image would make
the engine fetch and process it just to count it).

Every call is bounded: at most `max_in_flight` at once (past that the caller falls back at
once rather than queue behind a busy engine), `timeout_s` each, answers of at most 1 MiB
(read a socket read at a time, given up and the connection closed as soon as one passes
it: `engines/answers.py`), of which only `count` is decoded (the `tokens` list is skipped,
not built).
How long the calls take (answered or timed out) is followed (`latency_s`), so a caller
that can wait only so long knows when waiting is in vain.
An engine that answers 404 or 405 has no endpoint: it is not asked again for
`recheck_after_s`. Any failure is counted by kind and gives None; nothing here raises into
the request path except cancellation.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple

import aiohttp
import msgspec

from narwhal.engines.answers import AnswerTooLarge, read_bounded
from narwhal.engines.session import HttpSession
from narwhal.protocol.dialects import DialectCapabilities
from narwhal.protocol.requests import CompletionRequest, Route
from narwhal.protocol.usage import MAX_TOKEN_COUNT
from narwhal.sizing.cache import CountCache
from narwhal.sizing.local import token_id_count

log = logging.getLogger(__name__)

# Fields of a chat request that change the rendered prompt and that both dialects' chat
# tokenize forms accept; copied when the client sent them.
_TEMPLATE_FIELDS: Final = ("tools", "chat_template_kwargs", "continue_final_message")
_MAX_ANSWER_BYTES: Final = 1 << 20
_ABSENT_STATUSES: Final = frozenset({404, 405})
_HEADERS: Final = {"Content-Type": "application/json"}
# Each call's weight in `latency_s`: it follows an engine that slows down within a few calls.
_LATENCY_WEIGHT: Final = 0.3

FailureKind = Literal[
    "busy", "absent", "timeout", "unreachable", "status", "too_large", "bad_answer", "error"
]
FAILURE_KINDS: Final[tuple[FailureKind, ...]] = (
    "busy",  # max_in_flight calls already out
    "absent",  # 404/405: no tokenize endpoint
    "timeout",
    "unreachable",  # connection refused, reset, or any other transport error
    "status",  # any other status than 200
    "too_large",  # an answer over 1 MiB
    "bad_answer",  # not JSON, or a count that is not an int from 0 to 2**31 - 1
    "error",  # a bug here; logged
)


class TokenizeCandidate(NamedTuple):
    """An engine that may be asked: its configured name, base URL and capabilities (its
    tokenize route, if any, and the chat form's fields), and the Authorization header its
    requests carry (its api_key; vLLM leaves /tokenize open, SGLang guards it)."""

    name: str
    base_url: str
    capabilities: DialectCapabilities
    authorization: str | None = None


@dataclass(frozen=True, slots=True)
class TokenizeQuery:
    """What to ask about one request, made once: the cache key and the dialect-free body."""

    key: bytes
    route: Route
    model: str
    content: dict[str, Any]  # {"prompt": text} or {"messages": [...], template fields}
    fixed: int  # tokens counted here: the token-ID prompts beside a batch's one text


def make_query(request: CompletionRequest) -> TokenizeQuery | None:
    """The query for a request, or None when its prompt is not to be sent (see above)."""
    body = request.body
    fixed = 0
    content: dict[str, Any]
    if request.route == "chat":
        messages = body["messages"]
        if not all(_text_only(m.get("content")) for m in messages):
            return None
        content = {"messages": messages}
        # add_generation_prompt is vLLM's; `_body` leaves it out for SGLang.
        for field in (*_TEMPLATE_FIELDS, "add_generation_prompt"):
            value = body.get(field)
            if value is not None:
                content[field] = value
    else:
        prompt = body["prompt"]
        if isinstance(prompt, list):
            texts = [p for p in prompt if isinstance(p, str)]
            if len(texts) != 1:
                return None
            fixed = sum(len(p) for p in prompt if isinstance(p, list))
            prompt = texts[0]
        content = {"prompt": prompt}
    # Keys keep the client's order: a tool schema is rendered with its keys in the order
    # given, so two requests that differ only in key order may differ in token count.
    digest = hashlib.blake2b(msgspec.json.encode((request.route, content)), digest_size=16)
    return TokenizeQuery(digest.digest(), request.route, request.model, content, fixed)


def _text_only(content: object) -> bool:
    # parse_request has checked the shape: None, a string, or a list of typed parts.
    if isinstance(content, list):
        return all(part.get("type") == "text" for part in content)
    return True


def _body(query: TokenizeQuery, engine: DialectCapabilities) -> bytes:
    payload: dict[str, Any] = {"model": query.model, **query.content}
    if query.route == "chat":
        if engine.tokenize_adds_generation_prompt:
            payload.setdefault("add_generation_prompt", True)
        else:
            # SGLang: left out, the messages are rendered as for a chat completion.
            payload.pop("add_generation_prompt", None)
    return msgspec.json.encode(payload)


class EngineTokenizer:
    def __init__(
        self,
        session: HttpSession,
        candidates: Callable[[], Iterable[TokenizeCandidate]],
        *,
        timeout_s: float = 0.25,
        max_in_flight: int = 32,
        cache_size: int = 4096,
        recheck_after_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._session = session
        self._candidates = candidates
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._max_in_flight = max_in_flight
        self._cache = CountCache(cache_size)
        self._recheck_after_s = recheck_after_s
        self._clock = clock
        # Exponentially weighted seconds per call that reached an engine; None until one did.
        self.latency_s: float | None = None
        # engine name -> when to ask it again; one entry per engine ever marked, at most.
        self._absent_until: dict[str, float] = {}
        self._turn = itertools.count()
        self.in_flight = 0
        self.answered = 0  # counts the engines gave
        self.cache_hits = 0
        self.no_engine = 0  # queries with no engine to ask
        self.failures: collections.Counter[FailureKind] = collections.Counter()

    async def count(self, request: CompletionRequest) -> int | None:
        """The prompt's token count by an engine's tokenizer (cached), or None to fall back.
        A prompt of token IDs is counted here and never sent."""
        exact = token_id_count(request)
        if exact is not None:
            return exact
        query = make_query(request)
        if query is None:
            return None
        hit = self.cached(query)
        return hit if hit is not None else await self.fetch(query)

    def cached(self, query: TokenizeQuery) -> int | None:
        count = self._cache.get(query.key)
        if count is None:
            return None
        self.cache_hits += 1
        return query.fixed + count

    async def fetch(self, query: TokenizeQuery) -> int | None:
        """Ask one engine, now or never: None when none can answer in time."""
        if self.in_flight >= self._max_in_flight:
            self.failures["busy"] += 1
            return None
        self.in_flight += 1
        try:
            engine = self._pick()
            if engine is None:
                self.no_engine += 1
                return None
            started = self._clock()
            count = await self._ask(engine, query)
            self._took(self._clock() - started)
        except Exception:
            log.exception("tokenize call failed unexpectedly")
            self.failures["error"] += 1
            return None
        finally:
            self.in_flight -= 1
        if count is None:
            return None
        self.answered += 1
        self._cache.put(query.key, count)
        return query.fixed + count

    def _took(self, seconds: float) -> None:
        last = self.latency_s
        self.latency_s = seconds if last is None else last + _LATENCY_WEIGHT * (seconds - last)

    def stats(self) -> dict[str, int]:
        stats = {
            "answered": self.answered,
            "cache_hits": self.cache_hits,
            "cache_entries": len(self._cache),
            "no_engine": self.no_engine,
            "in_flight": self.in_flight,
        }
        stats.update({f"failed_{kind}": self.failures[kind] for kind in FAILURE_KINDS})
        return stats

    def _pick(self) -> TokenizeCandidate | None:
        """Round robin over the candidates that have an endpoint (as far as is known)."""
        now = self._clock()
        eligible = [
            c
            for c in self._candidates()
            if c.capabilities.tokenize_path is not None
            and self._absent_until.get(c.name, now) <= now
        ]
        if not eligible:
            return None
        return eligible[next(self._turn) % len(eligible)]

    async def _ask(self, engine: TokenizeCandidate, query: TokenizeQuery) -> int | None:
        path = engine.capabilities.tokenize_path
        if path is None:
            return None
        url = engine.base_url + path
        try:
            async with self._session.post(
                url,
                data=_body(query, engine.capabilities),
                headers=_HEADERS
                if engine.authorization is None
                else {**_HEADERS, "Authorization": engine.authorization},
                timeout=self._timeout,
                raise_for_status=False,
            ) as response:
                if response.status in _ABSENT_STATUSES:
                    self._mark_absent(engine, response.status)
                    return None
                if response.status != 200:
                    self.failures["status"] += 1
                    return None
                raw = await read_bounded(response, _MAX_ANSWER_BYTES)
        except AnswerTooLarge:
            self.failures["too_large"] += 1
            return None
        except TimeoutError:
            self.failures["timeout"] += 1
            return None
        except (aiohttp.ClientError, OSError):
            self.failures["unreachable"] += 1
            return None
        count = answer_count(raw)
        if count is None:
            self.failures["bad_answer"] += 1
        return count

    def _mark_absent(self, engine: TokenizeCandidate, status: int) -> None:
        self.failures["absent"] += 1
        # Said once per engine; the recheck every recheck_after_s would repeat it for ever.
        level = logging.DEBUG if engine.name in self._absent_until else logging.INFO
        self._absent_until[engine.name] = self._clock() + self._recheck_after_s
        log.log(
            level,
            "engine %s answered %d to %s: prompts are sized without it, asked again every %.0f s",
            engine.name,
            status,
            engine.capabilities.tokenize_path,
            self._recheck_after_s,
        )


class _Answer(msgspec.Struct, gc=False):
    count: int  # bool is no int to msgspec


def answer_count(raw: bytes) -> int | None:
    """A tokenize answer's `count` (an int from 0 to MAX_TOKEN_COUNT), or None when it has
    none. JSON integers have no size: a count of 400 digits is an engine fault, not a
    prompt to refuse as too long."""
    try:
        count = msgspec.json.decode(raw, type=_Answer).count
    except (msgspec.DecodeError, RecursionError):  # (ValidationError is a DecodeError)
        return None
    return count if 0 <= count <= MAX_TOKEN_COUNT else None
