"""The series selectors of a PromQL expression: which metrics it reads, with which label
matchers, inside which functions. Enough of PromQL to check a dashboard and alert rules
against a router's /metrics, not a parser: it tokenizes and tracks parentheses.

    selectors('sum by (engine) (rate(narwhal_ttft_seconds_count{engine="d0"}[5m]))')
    == [Selector("narwhal_ttft_seconds_count", (("engine", "=", "d0"),), ("sum", "rate"))]

What is not a metric name: a function or aggregation (any identifier followed by `(`),
a keyword (`and`, `or`, `unless`, `bool`, `offset`, `inf`, `nan`, ...), the label lists
of `by`, `without`, `on`, `ignoring`, `group_left` and `group_right`, label names inside
`{}`, strings, numbers and durations (`5m`, `1h30m`, and everything between `[` and
`]`). A selector without a metric name (`{__name__=~"..."}`) and Grafana variables left
unsubstituted are refused, so that a check built on this never passes by not seeing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Identifiers followed by a parenthesised label list rather than an expression.
_LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_KEYWORDS = _LABEL_LIST_KEYWORDS | frozenset(
    {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}
)

_TOKEN = re.compile(
    r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<duration>(?:\d+(?:ms|[smhdwy]))+)
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>==|!=|=~|!~|>=|<=|[-+*/%^<>=@,])
  | (?P<open>[({\[])
  | (?P<close>[)}\]])
    """,
    re.VERBOSE,
)


class PromQLError(ValueError):
    """The expression is outside what this reader understands (or is not PromQL)."""


Matcher = tuple[str, str, str]  # (label, operator, value): ("outcome", "=~", "a|b")


@dataclass(frozen=True, slots=True)
class Selector:
    name: str
    matchers: tuple[Matcher, ...]
    functions: tuple[str, ...]  # enclosing function calls, outermost first


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str
    text: str


def tokens(expr: str) -> list[_Token]:
    out: list[_Token] = []
    position = 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None:
            raise PromQLError(f"cannot read {expr[position : position + 20]!r} in {expr!r}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            out.append(_Token(kind, match.group()))
        position = match.end()
    return out


def selectors(expr: str) -> list[Selector]:
    """Every series selector in `expr`, in order of appearance."""
    toks = tokens(expr)
    found: list[Selector] = []
    # One entry per open parenthesis: the function it calls, or None for grouping.
    calls: list[str | None] = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        following = toks[i + 1] if i + 1 < len(toks) else None
        if tok.kind == "ident":
            word = tok.text.lower()
            if word in _LABEL_LIST_KEYWORDS and following is not None and following.text == "(":
                i = _skip_past(toks, i + 1, ")")
                continue
            if following is not None and following.text == "(":
                calls.append(tok.text)
                i += 2
                continue
            if following is not None and following.text.lower() in ("by", "without"):
                # `sum by (engine) (...)`: an aggregation with its grouping first.
                i = _skip_past(toks, i + 2, ")")
                if i >= len(toks) or toks[i].text != "(":
                    raise PromQLError(f"{tok.text} {following.text} (...) without an argument")
                calls.append(tok.text)
                i += 1
                continue
            if word in _KEYWORDS:
                i += 1
                continue
            matchers: tuple[Matcher, ...] = ()
            i += 1
            if following is not None and following.text == "{":
                matchers, i = _matchers(toks, i + 1, expr)
            found.append(Selector(tok.text, matchers, tuple(c for c in calls if c is not None)))
            continue
        if tok.text == "{":
            raise PromQLError(f"a selector without a metric name in {expr!r}")
        if tok.text == "[":
            i = _skip_past(toks, i, "]")
            continue
        if tok.text == "(":
            calls.append(None)
        elif tok.text == ")":
            if not calls:
                raise PromQLError(f"unbalanced ')' in {expr!r}")
            calls.pop()
        elif tok.text in ("}", "]"):
            raise PromQLError(f"unbalanced {tok.text!r} in {expr!r}")
        i += 1
    if calls:
        raise PromQLError(f"unclosed '(' in {expr!r}")
    return found


def _skip_past(toks: list[_Token], start: int, close: str) -> int:
    """The index after the first `close` token at or after `start` (label lists and
    ranges hold no parentheses or brackets of their own)."""
    for j in range(start, len(toks)):
        if toks[j].text == close:
            return j + 1
    raise PromQLError(f"no closing {close!r}")


def _matchers(toks: list[_Token], start: int, expr: str) -> tuple[tuple[Matcher, ...], int]:
    """The `label op "value"` list after a `{`; returns it and the index after the `}`."""
    matchers: list[Matcher] = []
    i = start
    while i < len(toks) and toks[i].text != "}":
        if i + 2 >= len(toks):
            break
        label, op, value = toks[i], toks[i + 1], toks[i + 2]
        if label.kind != "ident" or op.text not in ("=", "!=", "=~", "!~"):
            raise PromQLError(f"cannot read the label matchers in {expr!r}")
        if value.kind != "string":
            raise PromQLError(f"a label value that is not a string in {expr!r}")
        matchers.append((label.text, op.text, _unquote(value.text)))
        i += 3
        if i < len(toks) and toks[i].text == ",":
            i += 1
    if i >= len(toks):
        raise PromQLError(f"unclosed '{{' in {expr!r}")
    return tuple(matchers), i + 1


def _unquote(literal: str) -> str:
    body = literal[1:-1]
    if literal[0] == "`":
        return body
    return re.sub(r"\\(.)", r"\1", body)


def grouping_labels(expr: str) -> set[str]:
    """The labels named in `by`, `without`, `on`, `ignoring`, `group_left` and
    `group_right` lists."""
    toks = tokens(expr)
    labels: set[str] = set()
    for i, tok in enumerate(toks[:-1]):
        if tok.kind == "ident" and tok.text.lower() in _LABEL_LIST_KEYWORDS:
            if toks[i + 1].text != "(":
                continue
            end = _skip_past(toks, i + 1, ")")
            labels.update(t.text for t in toks[i + 2 : end - 1] if t.kind == "ident")
    return labels
