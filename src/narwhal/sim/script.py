"""What one request will generate: every token id, what each token's event says, how it ends.

A `Script` is built in full when the request arrives, deterministically from the sim's
seed, the request's `seed` and the prompt ids; the engine's step loop only decides
*when* each token comes out. Text always decodes from the ids: plain tokens are drawn
from a fixed list of single-token word pieces, and scripted parts (tool calls,
refusals ...) are the tokenizer's encoding of the raw text the model would have
written.

`parts[i]` says what token i adds to its event. `None` means a parser is holding the
token back (the `</think>` marker, tool-call JSON around the arguments): vLLM 0.13+
still sends such a token as an empty delta carrying its id when ids or logprobs were
asked, and the emitter does the same.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Final, Literal

import msgspec

from narwhal.protocol.dialects import Dialect
from narwhal.protocol.tokenizer import EOS_ID, THINK_END_ID, TOOL_CALL_END_ID, TOOL_CALL_START_ID
from narwhal.protocol.tokenizer import SimTokenizer as _Tokenizer
from narwhal.sim.scenarios import Scenarios

TOKENIZER: Final = _Tokenizer()

_WORDS: Final = (
    "the", "of", "and", "to", "in", "is", "it", "that", "for", "was", "on", "are", "as", "with",
    "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but",
    "not", "what", "all", "were", "we", "when", "your", "can", "said", "there", "use", "an",
    "each", "which", "she", "do", "how", "their", "if", "will", "up", "other", "about", "out",
    "many", "then", "them", "these", "so", "some", "her", "would", "make", "like", "him",
    "into", "time", "has", "look", "two", "more", "write", "go", "see", "way", "could", "no",
    "my", "than", "first", "water", "been", "call", "who", "oil", "its", "now", "find", "long",
    "down", "day", "did", "get", "come", "made", "may", "part", "over", "new", "sound", "take",
    "only", "little", "work", "know", "place", "year", "live", "me", "back", "give", "most",
    "very", "after", "thing", "our", "just", "name", "good", "man", "think", "say", "great",
    "where", "help", "much", "mean", "old", "any", "same", "tell", "boy", "turn", "why", "ask",
    "went", "men", "read", "need", "land", "here", "home", "us", "move", "try", "kind", "hand",
    "house", "again", "point", "page", "small", "end", "put", "model", "token", "cache",
    "batch", "queue", "engine", "prefill", "decode", "stream",
)  # fmt: skip


def _single_token_pieces() -> tuple[int, ...]:
    pieces = [" " + word for word in _WORDS] + [",", ".", " a", " I"]
    ids = [TOKENIZER.encode(piece) for piece in pieces]
    return tuple(piece[0] for piece in ids if len(piece) == 1)


WORD_IDS: Final = _single_token_pieces()
_CITIES: Final = ("Paris", "Berlin", "Tokyo", "Lima", "Oslo", "Nairobi", "Toronto", "Hanoi")
_DEFAULT_TOOLS: Final = ("get_weather", "get_time")
_REFUSAL: Final = " I'm sorry, but I can't help with that request."


@dataclass(frozen=True, slots=True)
class Text:
    channel: Literal["content", "reasoning", "refusal"]
    text: str


@dataclass(frozen=True, slots=True)
class ToolStart:
    index: int
    call_id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolArgs:
    index: int
    text: str


@dataclass(frozen=True, slots=True)
class ToolWhole:
    """A whole call in one delta, as `transformers serve` sends them."""

    index: int
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class FunctionName:
    name: str


@dataclass(frozen=True, slots=True)
class FunctionArgs:
    text: str


@dataclass(frozen=True, slots=True)
class Audio:
    transcript: str


@dataclass(frozen=True, slots=True)
class Annotated:
    """Content text that also carries a url_citation annotation."""

    text: str


Part = Text | ToolStart | ToolArgs | ToolWhole | FunctionName | FunctionArgs | Audio | Annotated

_EOS_PART: Final = Text("content", "")


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    prompt_ids: list[int]
    chat: bool
    max_tokens: int
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int | None = None  # None: logprobs off; else alternatives per token
    tool_names: tuple[str, ...] = ()
    tool_id_style: Dialect = "vllm"
    request_id: str = ""


@dataclass(slots=True)
class Script:
    ids: list[int]
    parts: list[Part | None]
    finish_reason: str
    stop_reason: str | int | None  # vLLM: the stop string, or None for EOS / length
    matched_stop: str | int | None  # SGLang: the stop string, the EOS id, or None
    logprobs: list[TokenLogprob] | None
    id_fault: tuple[str, int] | None = None  # (scenario, token index)
    error_at: int | None = None
    disconnect_at: int | None = None
    stall_at: int | None = None
    stall_s: float = 0.0


def derive_seed(sim_seed: int, request_seed: int | None, prompt_ids: list[int]) -> int:
    """A stable 64-bit seed: the same inputs give the same output in every process."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(f"{sim_seed}:{request_seed}:".encode())
    digest.update(msgspec.json.encode(prompt_ids))
    return int.from_bytes(digest.digest(), "big")


class _Builder:
    def __init__(self, request: GenerationRequest, scenarios: Scenarios, rng: random.Random):
        self.request = request
        self.scenarios = scenarios
        self.rng = rng
        self.ids: list[int] = []
        self.parts: list[Part | None] = []

    def words(self, count: int, channel: Literal["content", "reasoning"]) -> None:
        for token_id in self.rng.choices(WORD_IDS, k=count):
            self.ids.append(token_id)
            self.parts.append(Text(channel, TOKENIZER.token_text(token_id)))

    def segment(self, ids: list[int], part: Part | None) -> None:
        """Tokens the parser holds until the last one, which carries `part`."""
        if not ids:
            return
        self.ids += ids
        self.parts += [None] * (len(ids) - 1)
        self.parts.append(part)

    def text_tokens(self, text: str, channel: Literal["content", "refusal"]) -> None:
        for token_id in TOKENIZER.encode(text):
            self.ids.append(token_id)
            self.parts.append(Text(channel, TOKENIZER.token_text(token_id)))

    def eos(self, part: Part | None = _EOS_PART) -> None:
        self.ids.append(EOS_ID)
        self.parts.append(part)

    def call_id(self, index: int) -> str:
        style = self.request.tool_id_style
        if style == "openai":
            return f"{self.request.request_id}_tool_call_{index}"
        bits = self.rng.getrandbits(128)
        return f"call_{bits:032x}"[:29] if style == "sglang" else f"chatcmpl-tool-{bits:032x}"

    def arguments(self) -> str:
        city = self.rng.choice(_CITIES)
        unit = self.rng.choice(("celsius", "fahrenheit"))
        return msgspec.json.encode({"city": city, "unit": unit}).decode()


def _fragments(text: str) -> list[str]:
    """Argument text cut in three, the way a streaming tool parser releases it."""
    third = max(1, len(text) // 3)
    return [text[:third], text[third : 2 * third], text[2 * third :]]


def _natural_length(scenarios: Scenarios, rng: random.Random, mean: float) -> int:
    if "len" in scenarios:
        return max(1, int(scenarios.number("len", 1)))
    return max(1, round(rng.gammavariate(2.0, mean / 2.0)))


def _tool_calls(b: _Builder) -> str:
    names = b.request.tool_names or _DEFAULT_TOOLS
    whole = b.request.tool_id_style == "openai"
    for index in range(2):
        name = names[index % len(names)]
        call_id = b.call_id(index)
        args = b.arguments()
        opening = [TOOL_CALL_START_ID, *TOKENIZER.encode(f'\n{{"name": "{name}", "arguments": ')]
        closing = [*TOKENIZER.encode("}\n"), TOOL_CALL_END_ID]
        last = index == 1
        if whole:
            b.segment(
                opening + TOKENIZER.encode(args) + closing, ToolWhole(index, call_id, name, args)
            )
            continue
        b.segment(opening, ToolStart(index, call_id, name))
        fragments = _fragments(args)
        for fragment in fragments[:-1]:
            b.segment(TOKENIZER.encode(fragment), ToolArgs(index, fragment))
        if last:
            # vLLM sends the last unstreamed argument text on the finishing chunk.
            b.segment(
                TOKENIZER.encode(fragments[-1]) + closing + [EOS_ID], ToolArgs(index, fragments[-1])
            )
        else:
            b.segment(TOKENIZER.encode(fragments[-1]), ToolArgs(index, fragments[-1]))
            b.segment(closing, None)
    if whole:
        b.eos()
    return "tool_calls"


def _function_call(b: _Builder) -> str:
    name = (b.request.tool_names or _DEFAULT_TOOLS)[0]
    b.segment(TOKENIZER.encode(f'{{"name": "{name}", '), FunctionName(name))
    for fragment in _fragments(b.arguments()):
        b.segment(TOKENIZER.encode(fragment), FunctionArgs(fragment))
    b.segment(TOKENIZER.encode("}"), None)
    b.eos()
    return "function_call"


def build_script(
    request: GenerationRequest, scenarios: Scenarios, *, sim_seed: int, output_len_mean: float
) -> Script:
    rng = random.Random(derive_seed(sim_seed, request.seed, request.prompt_ids))
    b = _Builder(request, scenarios, rng)
    cap = request.max_tokens
    natural = _natural_length(scenarios, rng, output_len_mean)
    for fault in ("error_midstream", "disconnect_midstream"):
        position = scenarios.position(fault, 3)
        if position is not None:
            natural = max(natural, position + 2)
    runs_to_cap = request.ignore_eos or "long" in scenarios
    chat = request.chat

    if "reasoning" in scenarios:
        b.words(max(2, min(natural, cap) // 3), "reasoning")
        b.segment([THINK_END_ID], None)
    if chat and "tool_calls" in scenarios:
        finish = _tool_calls(b)
    elif chat and "function_call" in scenarios:
        finish = _function_call(b)
    elif chat and "refusal" in scenarios:
        b.text_tokens(_REFUSAL, "refusal")
        b.eos()
        finish = "stop"
    else:
        remaining = cap - len(b.ids) + 1 if runs_to_cap else natural - len(b.ids) - 1
        b.words(max(0, min(remaining, cap + 1 - len(b.ids))), "content")
        if not runs_to_cap:
            b.eos()
        finish = "stop"
    _decorate(b, scenarios, chat)

    stop_reason: str | int | None = None
    matched_stop: str | int | None = EOS_ID if b.ids and b.ids[-1] == EOS_ID else None
    if len(b.ids) > cap:
        del b.ids[cap:], b.parts[cap:]
        finish, matched_stop = "length", None
    if request.stop and finish in ("stop", "length"):
        hit = _apply_stop(b, request.stop)
        if hit is not None:
            finish, stop_reason, matched_stop = "stop", hit, hit
    script = Script(b.ids, b.parts, finish, stop_reason, matched_stop, None)
    if request.top_logprobs is not None:
        script.logprobs = _logprobs(script.ids, request.top_logprobs, rng)
    _place_faults(script, scenarios)
    return script


def _decorate(b: _Builder, scenarios: Scenarios, chat: bool) -> None:
    """Turn one plain content token into an audio / annotated part."""
    for name, make in (("audio_delta", Audio), ("annotations", Annotated)):
        if name not in scenarios:
            continue
        for i, part in enumerate(b.parts):
            if isinstance(part, Text) and part.channel == "content" and part.text:
                b.parts[i] = make(part.text) if chat or make is Annotated else part
                break


def _apply_stop(b: _Builder, stops: tuple[str, ...]) -> str | None:
    """Cut at the first stop string, and hold back text the way vLLM's detokenizer does.

    While generating, vLLM keeps the last `max(len(stop)) - 1` characters unsent (they
    might start a stop string); the last token's event releases whatever remains. Ids of
    tokens whose text is held still go out, with an empty text.
    """
    hold = max(len(stop) for stop in stops) - 1
    text = ""
    ends: list[int] = []  # length of the content text after each token
    hit: str | None = None
    cut_at = 0
    for i, part in enumerate(b.parts):
        if isinstance(part, Text) and part.channel == "content":
            start = max(0, len(text) - hold)  # a new match must end inside the new text
            text += part.text
            found = [(pos, stop) for stop in stops if (pos := text.find(stop, start)) >= 0]
            ends.append(len(text))
            if found:
                cut_at, hit = min(found)
                del b.ids[i + 1 :], b.parts[i + 1 :]
                break
        else:
            ends.append(len(text))
    if hit is None:
        cut_at = len(text)
    sent = 0
    last = len(b.parts) - 1
    for i, part in enumerate(b.parts):
        if not (isinstance(part, Text) and part.channel == "content"):
            continue
        visible = cut_at if i == last else min(cut_at, max(0, ends[i] - hold))
        b.parts[i] = Text("content", text[sent:visible]) if visible > sent else Text("content", "")
        sent = max(sent, visible)
    return hit


def _logprobs(ids: list[int], top: int, rng: random.Random) -> list[TokenLogprob]:
    out: list[TokenLogprob] = []
    for token_id in ids:
        token = TOKENIZER.token_text(token_id)
        logprob = -round(rng.expovariate(4.0), 4)
        alternatives = [(token, logprob)]
        if top > 1:
            # Distinct tokens, so a completions top_logprobs dict keeps all of them.
            others = [t for t in rng.sample(WORD_IDS, top) if t != token_id][: top - 1]
            for rank, other in enumerate(others, 1):
                lower = round(logprob - rank * (0.5 + rng.random()), 4)
                alternatives.append((TOKENIZER.token_text(other), lower))
        out.append(TokenLogprob(token, logprob, tuple(alternatives[:top])))
    return out


def _place_faults(script: Script, scenarios: Scenarios) -> None:
    if not scenarios:
        return
    last = max(0, len(script.ids) - 1)
    if (kind := scenarios.id_fault) is not None:
        script.id_fault = (kind, min(1, last))
    if (at := scenarios.position("error_midstream", 3)) is not None:
        script.error_at = min(at, last)
    if (at := scenarios.position("disconnect_midstream", 3)) is not None:
        script.disconnect_at = min(at, last)
    if "stall" in scenarios:
        script.stall_at = min(2, last)
        script.stall_s = scenarios.number("stall", 0)
