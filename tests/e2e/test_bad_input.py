"""Bad input at every route of one real router (open admission, in front of `narwhal sim`).

Hypothesis generates malformed and truncated JSON, wrong types at every field the router
interprets, huge numbers, deep nesting, invalid UTF-8 and lone surrogates, wrong content
types and codings, and junk for every other route; raw sockets add what a client library
will not send: duplicate and conflicting framing headers, oversized header lines,
X-Request-Timeout garbage, bodies and heads trickled slower than the deadlines allow.

Every answer must be a 4xx OpenAI envelope (a 504 for a body too slow to arrive, a closed
connection for a head too slow), never a 500 or a hang. At the end the router must still
be alive, its log must hold no ERROR and no traceback, and every request that reached a
completion route must have been counted once: offered = sum of outcomes = requests sent.
Requests go over raw sockets (one connection each, `Connection: close`), so what is sent
is exactly what the test wrote.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import MODEL, fleet_config, sim_process
from tests.metrics_text import samples, total
from tests.processes import NarwhalProcess, router_process

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
COMPLETION_ROUTES = (CHAT, COMPLETIONS)
REQUEST_TIMEOUT_S = 3.0  # serving.request_timeout_s: the body and head deadlines
MAX_NESTING = 128
TOKENS_MAX = 2**31 - 1
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# One xdist worker runs the whole module, in order (`--dist loadgroup`): its last test checks what
# every test before it did to the module's router.
pytestmark = pytest.mark.xdist_group("test_bad_input")


@dataclass
class Router:
    process: NarwhalProcess
    host: str
    port: int
    log: Path
    reached: int = 0  # requests sent that reached a completion route
    statuses: dict[int, int] = field(default_factory=dict)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    log = tmp_path_factory.mktemp("bad_input") / "router.stderr"
    with ExitStack() as stack:
        sim = stack.enter_context(sim_process("--time-scale", "0"))
        config = fleet_config(
            [("s0", sim, "vllm")], serving={"request_timeout_s": REQUEST_TIMEOUT_S}
        )
        process = stack.enter_context(router_process(config, stderr_path=log))
        parts = urllib.parse.urlsplit(process.url)
        assert parts.hostname is not None and parts.port is not None
        yield Router(process, parts.hostname, parts.port, log)


# --- a raw HTTP/1.1 client ------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    headers: dict[str, list[str]]
    body: bytes

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[0] if values else None

    def error(self) -> dict[str, Any]:
        """The OpenAI envelope's inner object, checked for shape."""
        payload = json.loads(self.body)
        assert set(payload) == {"error"}, payload
        error = payload["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"]
        assert error["param"] is None or isinstance(error["param"], str)
        return dict(error)


def request_bytes(
    method: str,
    path: str,
    body: bytes = b"",
    headers: list[tuple[str, str]] | None = None,
    *,
    length: bool = True,
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: narwhal", "Connection: close"]
    if headers is None:
        headers = [("Content-Type", "application/json")]
    lines += [f"{name}: {value}" for name, value in headers]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body


def exchange(router: Router, raw: bytes, *, reaches_route: bool, timeout: float = 15) -> Reply:
    """Send `raw` on a new connection and read the one reply."""
    with socket.create_connection((router.host, router.port), timeout=timeout) as sock:
        # Refused early (413, 415, 400), the reply may still be there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(raw)
        if reaches_route:
            router.reached += 1
        reply = read_reply(sock)
    router.statuses[reply.status] = router.statuses.get(reply.status, 0) + 1
    return reply


def read_reply(sock: socket.socket, data: bytes = b"") -> Reply:
    """One response: its Content-Length of body, or (a stream) all until the router closes.
    Not always to the end: after a 413 aiohttp keeps reading the unsent body for a while."""
    while b"\r\n\r\n" not in data:
        chunk = _recv(sock)
        assert chunk, f"no response head in {data[:200]!r}"
        data += chunk
    reply = _parse(data)
    length = reply.header("Content-Length")
    while length is None or len(reply.body) < int(length):
        chunk = _recv(sock)
        if not chunk:
            break
        reply.body += chunk
    return reply


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""


def _parse(data: bytes) -> Reply:
    head, sep, body = data.partition(b"\r\n\r\n")
    assert sep, f"no response head in {data[:200]!r}"
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, list[str]] = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return Reply(int(status_line.split()[1]), headers, body)


def post(router: Router, path: str, body: bytes, **kw: Any) -> Reply:
    return exchange(router, request_bytes("POST", path, body, **kw), reaches_route=True)


def assert_refused(
    reply: Reply,
    *,
    statuses: tuple[int, ...] = (400,),
    param: str | type[Any] | None = Any,
    type_: str = "invalid_request_error",
) -> dict[str, Any]:
    assert reply.status in statuses, (reply.status, reply.body[:300])
    assert reply.header("X-Request-Id")
    error = reply.error()
    assert error["type"] == type_, error
    if param is not Any:
        assert error["param"] == param, error
    return error


def assert_not_broken(reply: Reply) -> None:
    """Served, or refused with an envelope: never a server error."""
    assert reply.status < 500, (reply.status, reply.body[:300])
    if reply.status >= 400:
        reply.error()


def top_field(param: str | None) -> str | None:
    return None if param is None else param.split(".")[0]


def chat(**fields: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        **fields,
    }


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hi", "max_tokens": 2, **fields}


def base(path: str) -> dict[str, Any]:
    return chat() if path == CHAT else completion()


def with_raw_field(path: str, name: str, raw_value: bytes) -> bytes:
    """A valid body for `path` with field `name` set to the JSON text `raw_value` (which may
    be anything: a literal no JSON encoder would write, a truncated document)."""
    body = base(path)
    body.pop(name, None)
    encoded = msgspec.json.encode(body)
    return encoded[:-1] + b', "' + name.encode() + b'": ' + raw_value + b"}"


def decodes(raw: bytes) -> bool:
    try:
        msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


routes = st.sampled_from(COMPLETION_ROUTES)


# --- malformed JSON -------------------------------------------------------------------------


def mutations(raw: bytes) -> st.SearchStrategy[bytes]:
    at = st.integers(0, len(raw))
    junk = st.sampled_from(
        [b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\\ud800", b"\\udfff", b"\x00", b'"', b"}", b","]
    ) | st.binary(min_size=1, max_size=6)
    return st.one_of(
        at.map(lambda i: raw[:i]),  # truncated
        st.tuples(at, junk).map(lambda t: raw[: t[0]] + t[1] + raw[t[0] :]),  # inserted
        st.tuples(at, st.integers(1, 4)).map(lambda t: raw[: t[0]] + raw[t[0] + t[1] :]),
        st.binary(max_size=200),
    )


@SETTINGS
@given(data=st.data(), path=routes)
def test_malformed_and_truncated_json(router: Router, data: st.DataObject, path: str) -> None:
    raw = data.draw(mutations(msgspec.json.encode(base(path))))
    reply = post(router, path, raw)
    if decodes(raw):
        assert_not_broken(reply)
    else:
        assert_refused(reply)  # not JSON: 400, whatever else is wrong with it


# --- wrong types at every interpreted field -------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, 1, 2, 20, 21, TOKENS_MAX, TOKENS_MAX + 1, -1])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.sampled_from(["none", "auto", "required", "function", "text", "audio", "user", MODEL]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["type", "role", "content", "text", "function", "name", "x"]),
            children,
            max_size=3,
        )
    ),
    max_leaves=6,
)


def _int(value: object, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _ok_parts(content: object) -> bool:
    if content is None or isinstance(content, str):
        return True
    if not isinstance(content, list):
        return False
    for part in content:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            return False
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            return False
    return True


def _ok_messages(value: object) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and _ok_parts(m.get("content"))
            for m in value
        )
    )


def _ok_prompt(value: object) -> bool:
    if isinstance(value, str):
        return True
    if not isinstance(value, list) or not value:
        return False
    if all(type(t) is int for t in value):
        return True
    return all(
        isinstance(p, str) or (isinstance(p, list) and p and all(type(t) is int for t in p))
        for p in value
    )


def _ok_function(value: object) -> bool:
    return isinstance(value, dict) and isinstance(value.get("name"), str)


def _ok_tool(tool: object) -> bool:
    return (
        isinstance(tool, dict)
        and tool.get("type", "function") == "function"
        and _ok_function(tool.get("function"))
    )


def _ok_tool_choice(value: object) -> bool:
    if value is None or value in ("none", "auto", "required"):
        return True
    return (
        isinstance(value, dict)
        and value.get("type") == "function"
        and _ok_function(value.get("function"))
    )


# What the router accepts at each field it interprets (of a non-streaming request with no
# tools); any other value must be refused with that field in `param`.
ACCEPTS: dict[str, Any] = {
    "model": lambda v: v == MODEL,
    "stream": lambda v: v is None or isinstance(v, bool),
    "stream_options": lambda v: v is None,  # without stream, any options are refused
    "n": lambda v: v is None or _int(v, 1, 1),
    "best_of": lambda v: v is None or _int(v, 1, 1),
    "max_tokens": lambda v: v is None or _int(v, 1, TOKENS_MAX),
    "max_completion_tokens": lambda v: v is None or _int(v, 1, TOKENS_MAX),
    "return_token_ids": lambda v: v is None or isinstance(v, bool),
    "echo": lambda v: v is None or isinstance(v, bool),
    "top_logprobs": lambda v: v is None or _int(v, 0, 20),
    "tools": lambda v: v is None or (isinstance(v, list) and all(map(_ok_tool, v))),
    "tool_choice": _ok_tool_choice,
    "modalities": lambda v: v is None or (isinstance(v, list) and all(m == "text" for m in v)),
    "audio": lambda v: v is None,  # audio output is refused for non-streaming requests
}
CHAT_ACCEPTS = {
    **ACCEPTS,
    "messages": _ok_messages,
    "logprobs": lambda v: v is None or isinstance(v, bool),
}
COMPLETION_ACCEPTS = {
    **ACCEPTS,
    "prompt": _ok_prompt,
    "logprobs": lambda v: v is None or _int(v, 0, 20),
}


@st.composite
def wrong_field(draw: st.DrawFn) -> tuple[str, str, Any]:
    path = draw(routes)
    accepts = CHAT_ACCEPTS if path == CHAT else COMPLETION_ACCEPTS
    name = draw(st.sampled_from(sorted(accepts)))
    value = draw(json_values.filter(lambda v: not accepts[name](v)))
    return path, name, value


@SETTINGS
@given(case=wrong_field())
def test_a_wrong_value_at_an_interpreted_field_is_refused_naming_it(
    router: Router, case: tuple[str, str, Any]
) -> None:
    path, name, value = case
    body = base(path)
    if value is None:
        body.pop(name, None)  # absent: "required property" for messages and prompt
    else:
        body[name] = value
    reply = post(router, path, msgspec.json.encode(body))
    error = assert_refused(reply, statuses=(400, 404))
    assert top_field(error["param"]) == name, (name, value, error)


# --- huge numbers ---------------------------------------------------------------------------

INTERPRETED_INTS = {  # the values accepted (n and best_of above 1: "Invalid sampling width")
    "max_tokens": (1, TOKENS_MAX),
    "max_completion_tokens": (1, TOKENS_MAX),
    "n": (1, 1),
    "best_of": (1, 1),
    "top_logprobs": (0, 20),
}
PASSED_NUMBERS = ("temperature", "top_p", "seed", "frequency_penalty", "top_k", "min_p")
huge_literals = st.one_of(
    st.sampled_from([b"1e400", b"-1e400", b"1E+99999", b"9" * 4301, b"-" + b"9" * 5000]),
    st.integers(19, 4300).map(lambda n: b"1" + b"0" * (n - 1)),
    st.integers(19, 4300).map(lambda n: b"-" + b"9" * n),
    st.integers(309, 2000).map(lambda e: b"1.5e%d" % e),
    st.sampled_from([b"1.7976931348623157e308", b"4.9e-324", b"1e-400", b"-0"]),
)


@SETTINGS
@given(
    path=routes,
    name=st.sampled_from((*INTERPRETED_INTS, *PASSED_NUMBERS)),
    literal=huge_literals,
)
def test_huge_numbers(router: Router, path: str, name: str, literal: bytes) -> None:
    reply = post(router, path, with_raw_field(path, name, literal))
    if not decodes(literal):  # out of float range, or past Python's int digit limit
        assert_refused(reply, param=name)
    elif name in INTERPRETED_INTS:
        value = msgspec.json.decode(literal)
        low, high = INTERPRETED_INTS[name]
        if not (type(value) is int and low <= value <= high):
            assert_refused(reply, param=name)
    else:
        assert_not_broken(reply)  # the engine's to judge


# --- deep nesting ---------------------------------------------------------------------------

DEEP_FIELDS = ("messages", "tools", "response_format", "guided_json", "logit_bias", "stop", "x")


@SETTINGS
@given(
    path=routes,
    name=st.sampled_from((*DEEP_FIELDS, "prompt")),
    depth=st.integers(1, 3000) | st.sampled_from([MAX_NESTING - 1, MAX_NESTING, 100_000]),
    kind=st.sampled_from(["array", "object"]),
)
def test_deep_nesting_anywhere(router: Router, path: str, name: str, depth: int, kind: str) -> None:
    if kind == "array":
        value = b"[" * depth + b"]" * depth
    else:
        value = b'{"a":' * (depth - 1) + b"{}" + b"}" * (depth - 1)
    reply = post(router, path, with_raw_field(path, name, value))
    if depth + 1 > MAX_NESTING:  # the body object is a level too
        error = assert_refused(reply, param=name)
        assert "nested" in error["message"]
    else:
        assert_not_broken(reply)


@pytest.mark.parametrize("path", COMPLETION_ROUTES)
@pytest.mark.parametrize("kind", ["array", "object"])
def test_a_body_nested_100000_levels_deep_is_400(router: Router, path: str, kind: str) -> None:
    depth = 100_000
    if kind == "array":
        raw = b"[" * depth + b"]" * depth
        param = None
    else:
        raw = with_raw_field(path, "guided_json", b'{"a":' * depth + b"1" + b"}" * depth)
        param = "guided_json"
    error = assert_refused(post(router, path, raw), param=param)
    assert "nested more than 128 levels" in error["message"]


# --- invalid UTF-8 and lone surrogates ------------------------------------------------------

bad_text = st.sampled_from(
    [
        b"\xff",
        b"\xfe\xff",
        b"\xc0\xaf",  # overlong "/"
        b"\xed\xa0\x80",  # a surrogate, UTF-8 encoded
        b"\xf4\x90\x80\x80",  # past U+10FFFF
        b"\xe2\x82",  # truncated sequence
        b"\\ud800",
        b"\\uDBFF",
        b"\\udc00",
        b"\\ud800\\ud800",
        b"\\ud800x",
    ]
)


@SETTINGS
@given(
    path=routes,
    name=st.sampled_from(["content", "user", "stop", "x", "model"]),
    before=st.text(max_size=5, alphabet="ab c"),
    bad=bad_text,
)
def test_invalid_unicode_in_strings(
    router: Router, path: str, name: str, before: str, bad: bytes
) -> None:
    text = b'"' + before.encode() + bad + b'"'
    if name == "content":
        if path == CHAT:
            messages = b'[{"role": "user", "content": ' + text + b"}]"
            raw, param = with_raw_field(path, "messages", messages), "messages"
        else:
            raw, param = with_raw_field(path, "prompt", text), "prompt"
    else:
        raw, param = with_raw_field(path, name, text), name
    error = assert_refused(post(router, path, raw), param=param)
    assert "UTF-8" in error["message"] or "surrogate" in error["message"]


# --- content types and codings --------------------------------------------------------------

header_text = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=30
)
content_types = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "application/json",
            "application/json; charset=utf-8",
            "APPLICATION/JSON",
            "application/problem+json",
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/octet-stream",
            "text/json",
        ]
    ),
    header_text,
)
codings = st.one_of(st.none(), st.sampled_from(["identity", "gzip", "br", "deflate"]), header_text)


def _json_type(value: str | None) -> bool:
    if value is None:
        return True
    kind, _, subtype = value.split(";")[0].strip().lower().partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


@SETTINGS
@given(path=routes, content_type=content_types, coding=codings)
def test_content_type_and_encoding(
    router: Router, path: str, content_type: str | None, coding: str | None
) -> None:
    headers = [] if content_type is None else [("Content-Type", content_type)]
    if coding is not None:
        headers.append(("Content-Encoding", coding))
    reply = post(router, path, msgspec.json.encode(base(path)), headers=headers)
    if not _json_type(content_type):
        assert_refused(reply, statuses=(415,), param="Content-Type")
    elif coding is not None and {c.strip().lower() for c in coding.split(",")} - {"", "identity"}:
        assert_refused(reply, statuses=(415,), param="Content-Encoding")
        assert reply.header("Accept-Encoding") == "identity"
    else:
        assert reply.status == 200, reply.body[:300]


# --- every other route ----------------------------------------------------------------------

segment = st.text(max_size=12).map(lambda s: urllib.parse.quote(s, safe=""))
other_paths = st.one_of(
    st.sampled_from(
        [
            *("/v1/models", "/health", "/ready", "/metrics", "/admin/engines"),
            *("/admin/maintenance", "/", "/v1", "/v1/", "/v1/embeddings", "/v1/chat", "/admin"),
        ]
    ),
    segment.map(lambda s: f"/v1/models/{s}"),
    st.tuples(segment, st.sampled_from(["drain", "undrain"])).map(
        lambda t: f"/admin/engines/{t[0]}/{t[1]}"
    ),
    st.lists(segment, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts)),
)
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
any_bodies = st.one_of(
    st.just(b""),
    st.binary(max_size=64),
    json_values.map(msgspec.json.encode),
    st.integers(129, 5000).map(lambda d: b"[" * d + b"]" * d),
)


def _changes_state(method: str, path: str, body: bytes) -> bool:
    """Requests that would drain the only engine or start maintenance: not sent."""
    if method != "POST":
        return False
    if path.startswith("/admin/engines/s0/"):
        return True
    if path == "/admin/maintenance":
        try:
            value = msgspec.json.decode(body)
        except (msgspec.DecodeError, RecursionError):
            return False
        return isinstance(value, dict) and value.get("action") in ("start", "end")
    return False


@settings(SETTINGS, max_examples=400)
@given(
    method=methods,
    path=other_paths | st.sampled_from(COMPLETION_ROUTES),
    body=any_bodies,
    content_type=content_types,
)
def test_every_other_route_and_wrong_methods(
    router: Router, method: str, path: str, body: bytes, content_type: str | None
) -> None:
    if path in COMPLETION_ROUTES and method == "POST":
        method = "PUT"  # the completion routes are the other tests'
    if _changes_state(method, path, body):
        return
    headers = [] if content_type is None else [("Content-Type", content_type)]
    raw = request_bytes(method, path, body, headers)
    reply = exchange(router, raw, reaches_route=False)
    assert reply.status != 500
    assert reply.status < 500 or path == "/ready", (method, path, reply.status, reply.body)
    if reply.status >= 400 and method != "HEAD" and path != "/ready":
        reply.error()
    if path in COMPLETION_ROUTES:
        assert reply.status == 405
    if reply.status == 405:  # RFC 9110 §15.5.6: a 405 lists the methods the resource has
        allowed = {m.strip() for m in (reply.header("Allow") or "").split(",")}
        assert method not in allowed and allowed & {"GET", "POST"}, reply.headers


@pytest.mark.parametrize(
    "path", ["/admin/maintenance", "/admin/engines/nope/drain", "/v1/models", "/health"]
)
@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"wave": 1e400, "action": "start"}',
        b'{"wave": 1, "action": "\xff"}',
        b'{"wave": 1, "action": "\\ud800"}',
        b'{"wave": 1, "act',
    ],
    ids=["nested-100000", "1e400", "invalid-utf8", "lone-surrogate", "truncated"],
)
def test_the_worst_bodies_at_other_post_routes(router: Router, path: str, body: bytes) -> None:
    reply = exchange(router, request_bytes("POST", path, body), reaches_route=False)
    assert 400 <= reply.status < 500, (reply.status, reply.body[:200])
    reply.error()


# --- HTTP framing, raw ----------------------------------------------------------------------

BODY = msgspec.json.encode(chat())
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
N = str(len(BODY)).encode()


@pytest.mark.parametrize(
    "raw",
    [
        HEAD + b"Content-Length: " + N + b"\r\nContent-Length: " + N + b"\r\n\r\n" + BODY,
        HEAD + b"Content-Length: " + N + b"\r\nContent-Length: 5\r\n\r\n" + BODY,
        HEAD + b"Content-Length: " + N + b", " + N + b"\r\n\r\n" + BODY,
        HEAD + b"Content-Length: -1\r\n\r\n" + BODY,
        HEAD + b"Content-Length: 99999999999999999999999\r\n\r\n" + BODY,
        HEAD + b"Content-Length: " + N + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + BODY,
        HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + BODY + b"\r\n0\r\n\r\n",
        HEAD + b"X-Big: " + b"a" * 9000 + b"\r\nContent-Length: " + N + b"\r\n\r\n" + BODY,
        HEAD + b"".join(b"X-H%d: v\r\n" % i for i in range(200)) + b"\r\n" + BODY,
        b"POST /v1/chat/completions?" + b"q" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        HEAD + b"X-A: a\r\n folded\r\nContent-Length: " + N + b"\r\n\r\n" + BODY,
        HEAD + b"X-A: a\x00b\r\nContent-Length: " + N + b"\r\n\r\n" + BODY,
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: " + N + b"\r\n\r\n" + BODY,
        b"P@ST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /v1/chat/completions HTTP/9.9\r\nHost: x\r\n\r\n",
    ],
    ids=[
        "two-content-lengths",
        "conflicting-content-lengths",
        "content-length-list",
        "negative-content-length",
        "huge-content-length",
        "content-length-and-chunked",
        "bad-chunk-size",
        "header-line-past-8190-bytes",
        "200-headers",
        "request-line-past-8190-bytes",
        "obsolete-line-folding",
        "nul-in-a-header",
        "no-host",
        "bad-method",
        "bad-version",
    ],
)
def test_malformed_http_is_a_400_envelope_and_closes(router: Router, raw: bytes) -> None:
    """aiohttp's parser refuses these before any route: not counted as offered."""
    reply = exchange(router, raw, reaches_route=False)
    error = assert_refused(reply)
    assert error["message"].startswith("Malformed HTTP request")
    assert b"a" * 200 not in reply.body  # an oversized line is not echoed back


def test_a_bad_chunk_after_the_head_is_answered_by_the_deadline(router: Router) -> None:
    """A chunk-size line that is not hex, arriving after the handler has started. aiohttp's
    Python parser fails the body at once (400); its C parser (3.14) leaves the body waiting,
    so the request deadline answers (504). Either way: answered, bounded, counted once."""
    with socket.create_connection((router.host, router.port), timeout=15) as sock:
        sock.sendall(HEAD + b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"mod\r\n')
        router.reached += 1
        time.sleep(0.3)
        start = time.monotonic()
        sock.sendall(b"zz\r\n")
        reply = read_reply(sock)
        elapsed = time.monotonic() - start
    if reply.status == 504:
        assert_refused(reply, statuses=(504,), type_="timeout_error")
    else:
        assert_refused(reply)
    assert elapsed < REQUEST_TIMEOUT_S + 2


@pytest.mark.parametrize(
    "values",
    [["abc"], ["-1"], ["0"], ["nan"], ["inf"], ["1e999"], [""], ["1_0"], ["1e-300"], ["5", "6"]],
)
def test_x_request_timeout_garbage_is_400(router: Router, values: list[str]) -> None:
    headers = [("Content-Type", "application/json")] + [("X-Request-Timeout", v) for v in values]
    reply = post(router, CHAT, BODY, headers=headers)
    assert_refused(reply, param="X-Request-Timeout")


def test_an_acceptable_x_request_timeout_is_honoured(router: Router) -> None:
    headers = [("Content-Type", "application/json"), ("X-Request-Timeout", "2.5")]
    assert post(router, CHAT, BODY, headers=headers).status == 200


def test_content_length_over_the_limit_is_413(router: Router) -> None:
    raw = HEAD + b"Content-Length: 50000000\r\n\r\n"
    reply = exchange(router, raw, reaches_route=True)
    error = assert_refused(reply, statuses=(413,))
    assert error["code"] == "request_too_large"


def test_chunked_body_over_the_limit_is_413(router: Router) -> None:
    chunk = b"a" * 65536
    raw = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + (b"10000\r\n" + chunk + b"\r\n") * 20
    error = assert_refused(exchange(router, raw, reaches_route=True), statuses=(413,))
    assert error["code"] == "request_too_large"


# --- too slow to send -----------------------------------------------------------------------


@pytest.mark.parametrize("asked", [None, "1"])
def test_a_trickled_body_ends_at_its_deadline_with_504(router: Router, asked: str | None) -> None:
    """A body sent a byte every 0.2 s never completes: the request deadline (3 s, or what
    X-Request-Timeout asked) ends it with 504 terminal_expiry, bounded, not held."""
    deadline = REQUEST_TIMEOUT_S if asked is None else float(asked)
    extra = b"" if asked is None else b"X-Request-Timeout: " + asked.encode() + b"\r\n"
    with socket.create_connection((router.host, router.port), timeout=15) as sock:
        sock.sendall(HEAD + extra + b"Content-Length: 400\r\n\r\n")
        router.reached += 1
        start = time.monotonic()
        sock.settimeout(0.2)
        data = b""
        for byte in BODY * 2:
            try:
                sock.sendall(bytes([byte]))
                data += sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if data:
                break
            if time.monotonic() - start > deadline + 5:
                break
        sock.settimeout(5)
        reply = read_reply(sock, data)
        elapsed = time.monotonic() - start
    error = assert_refused(reply, statuses=(504,), type_="timeout_error")
    assert error["code"] == "terminal_expiry"
    assert deadline - 0.3 < elapsed < deadline + 2, elapsed


@pytest.mark.parametrize("trickle", [True, False])
def test_a_trickled_head_is_cut_off(router: Router, trickle: bool) -> None:
    """A head sent a byte every quarter second (or nothing at all): the connection is
    closed at the head deadline (min(60 s, request_timeout_s) = 3 s here) instead of held
    for the hour aiohttp would wait. No request was read: nothing is counted."""
    head = HEAD + b"X-Slow: " + b"a" * 1000
    with socket.create_connection((router.host, router.port), timeout=15) as sock:
        start = time.monotonic()
        sock.settimeout(0.25)
        closed = False
        for byte in head:
            if time.monotonic() - start > REQUEST_TIMEOUT_S + 5:
                break
            try:
                if trickle:
                    sock.sendall(bytes([byte]))
                if sock.recv(65536) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
        elapsed = time.monotonic() - start
    assert closed
    assert REQUEST_TIMEOUT_S - 0.3 < elapsed < REQUEST_TIMEOUT_S + 2, elapsed


def test_a_slow_but_steady_request_within_its_deadline_is_served(router: Router) -> None:
    raw = request_bytes("POST", CHAT, BODY)
    with socket.create_connection((router.host, router.port), timeout=15) as sock:
        for i in range(0, len(raw), len(raw) // 8 + 1):
            sock.sendall(raw[i : i + len(raw) // 8 + 1])
            time.sleep(0.15)
        router.reached += 1
        reply = read_reply(sock)
    assert reply.status == 200


# --- memory ---------------------------------------------------------------------------------


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


# Twelve megabyte bodies, each read and parsed within the router's 3 s request deadline:
# beside other test processes on two cores, one has missed it (a 504).
@pytest.mark.alone
def test_megabyte_bodies_of_nested_arrays_do_not_balloon_the_router(router: Router) -> None:
    budget = 1_048_576 - 200
    deep = b"[" * 120 + b"]" * 120
    deepish = b"[" + b",".join([deep] * (budget // (len(deep) + 1))) + b"]"
    wide = b"[" + b",".join([b"[]"] * (budget // 3 - 20)) + b"]"
    too_deep = b"[" * (budget // 2) + b"]" * (budget // 2)
    before = _peak_rss_mib(router.process.pid)
    for _ in range(3):
        for path in COMPLETION_ROUTES:
            for value in (deepish, wide):
                raw = with_raw_field(path, "x", value)
                assert len(raw) <= 1_048_576
                assert_not_broken(post(router, path, raw))
            assert_refused(post(router, path, with_raw_field(path, "x", too_deep[:-300])))
    after = _peak_rss_mib(router.process.pid)
    assert after - before < 150, (before, after)
    assert after < 600, after


# --- afterwards -----------------------------------------------------------------------------


def test_zz_the_router_survived_logged_no_error_and_counted_every_request(router: Router) -> None:
    """Last in the module: everything above happened to this one process."""
    assert router.process.proc.poll() is None, "the router exited"
    values: dict[str, float] = {}
    for _ in range(100):
        values = _metrics(router)
        if (
            values["narwhal_offered_total"]
            == router.reached
            == total(values, "narwhal_outcomes_total")
        ):
            break
        time.sleep(0.1)
    assert values["narwhal_offered_total"] == router.reached, router.statuses
    assert total(values, "narwhal_outcomes_total") == router.reached
    assert values['narwhal_outcomes_total{outcome="internal_error"}'] == 0
    invalid = values['narwhal_outcomes_total{outcome="invalid"}']
    assert values["narwhal_invalid_requests_total"] == invalid
    assert 500 not in router.statuses
    log = router.log.read_text(errors="replace")
    bad = [line for line in log.splitlines() if "ERROR" in line or "Traceback" in line]
    assert not bad, "\n".join(bad[:20])


def _metrics(router: Router) -> dict[str, float]:
    reply = exchange(router, request_bytes("GET", "/metrics", headers=[]), reaches_route=False)
    assert reply.status == 200
    return samples(reply.body.decode())
