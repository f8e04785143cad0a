"""The OpenAPI document Narwhal ships (src/narwhal/openapi.yaml) is true of the router.

- It is a valid OpenAPI 3.1 document, shipped as package data.
- Its paths and methods are exactly the routes a Router registers (aiohttp's automatic
  HEAD beside each GET aside): a route added without being described fails here.
- Every error the router has (each NarwhalError class: its status, type and code) is
  declared by some operation for that status.
- Over real sockets, against a router in front of `narwhal sim`: every operation's own
  examples, and the error cases derived from its schemas (a required field left out, a
  field of a type its schema does not allow, a number past its bounds, a value outside its
  enum, a body that is not JSON, no body, too large a body, a media type other than JSON, a
  header that does not match its pattern, a path parameter naming nothing), are answered
  with a status the operation declares, the declared media type, the required headers and
  a body that matches the declared schema (each SSE event's JSON too). The examples get a
  200, the error cases a 4xx. Afterwards the router logged no ERROR and counted every
  completion request once.

The longer, schema-driven run is scripts/fuzz/schemathesis_run.py, outside CI.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import yaml
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from yarl import URL

import narwhal.router
from narwhal.config import Config
from narwhal.errors import NarwhalError
from narwhal.router import Router
from tests.e2e.conftest import MODEL, fleet_config, sim_process
from tests.metrics_text import samples, total
from tests.processes import NarwhalProcess, router_process

DOCUMENT: dict[str, Any] = yaml.safe_load(
    resources.files("narwhal").joinpath("openapi.yaml").read_text(encoding="utf-8")
)
BASE_URI = "urn:narwhal:openapi"
REGISTRY: Registry[Any] = Registry().with_resource(
    BASE_URI, Resource.from_contents(DOCUMENT, default_specification=DRAFT202012)
)
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
COMPLETION_PATHS = ("/v1/chat/completions", "/v1/completions")
ENGINE = "s0"
LIMIT = 16_384  # serving.max_request_bytes
# Values for the path parameters: the first names something, the others nothing.
PATH_VALUES = {
    "name": [ENGINE, "no-such-engine"],
    "model": [MODEL, "org/no-such-model", "line\nbreak"],
}


# One xdist worker runs the whole module, in order (`--dist loadgroup`): its last test checks what
# every test before it did to the module's router.
pytestmark = pytest.mark.xdist_group("test_openapi")


def escape(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


def resolve(node: Any, pointer: str) -> tuple[Any, str]:
    """Follow the document-local $refs from `node` (at `pointer`): the object and its pointer."""
    while isinstance(node, dict) and "$ref" in node:
        pointer = node["$ref"]
        assert pointer.startswith("#/"), pointer
        node = DOCUMENT
        for part in pointer[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
    return node, pointer


def validator(pointer: str) -> Draft202012Validator:
    return Draft202012Validator({"$ref": BASE_URI + pointer}, registry=REGISTRY)


@dataclass(frozen=True)
class Operation:
    path: str
    method: str
    spec: dict[str, Any]
    pointer: str

    def __str__(self) -> str:
        return f"{self.method.upper()} {self.path}"


OPERATIONS = [
    Operation(path, method, spec, f"#/paths/{escape(path)}/{method}")
    for path, item in DOCUMENT["paths"].items()
    for method, spec in item.items()
    if method in METHODS
]


# --- the document itself -----------------------------------------------------------------


def test_the_document_is_valid_openapi_3_1() -> None:
    validate_openapi(DOCUMENT)
    assert DOCUMENT["openapi"].startswith("3.1")
    assert {"url": "http://127.0.0.1:8000"}.items() <= DOCUMENT["servers"][0].items()


def test_the_document_is_package_data() -> None:
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    assert re.search(r'(?m)^narwhal = \[.*"openapi\.yaml"', pyproject.read_text())


def test_its_paths_and_methods_are_the_routes_the_router_registers() -> None:
    router = Router(Config(model=MODEL, engines=()))
    registered: set[tuple[str, str]] = set()
    heads: set[str] = set()
    for route in router.app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if route.method == "HEAD":
            heads.add(path)
        else:
            registered.add((route.method, path))
    described = {(op.method.upper(), op.path) for op in OPERATIONS}
    assert registered == described
    # HEAD is aiohttp's own beside each GET, as the document's description says.
    assert heads == {path for method, path in registered if method == "GET"}


def _narwhal_errors() -> Iterator[type[NarwhalError]]:
    assert narwhal.router  # imported for its side effect: every module defining an error
    pending: list[type[NarwhalError]] = [NarwhalError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__.startswith("narwhal."):
            yield cls


@pytest.mark.parametrize("error", list(_narwhal_errors()), ids=lambda cls: cls.__name__)
def test_every_error_the_router_has_is_declared(error: type[NarwhalError]) -> None:
    """Some operation declares the error's status with a schema its envelope satisfies."""
    # `param` is the instance's (a field, a header, a path parameter): each one a schema pins.
    envelopes = [
        {"error": {"message": "m", "type": error.error_type, "param": param, "code": error.code}}
        for param in (None, "name", "Content-Type", "Content-Encoding")
    ]
    declared = []
    for op in OPERATIONS:
        response = op.spec["responses"].get(str(error.status))
        if response is None:
            continue
        response, pointer = resolve(response, f"{op.pointer}/responses/{error.status}")
        if "application/json" in response.get("content", {}):
            check = validator(f"{pointer}/content/application~1json/schema")
            declared.append(any(check.is_valid(envelope) for envelope in envelopes))
    assert any(declared), (error.__name__, error.status, error.code)


# --- against a running router --------------------------------------------------------------


@dataclass
class Live:
    process: NarwhalProcess
    log: Path
    completion_requests: int = 0
    statuses: dict[int, int] = field(default_factory=dict)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    log = tmp_path_factory.mktemp("openapi") / "router.stderr"
    with ExitStack() as stack:
        sim = stack.enter_context(sim_process("--time-scale", "0", "--output-len-mean", "4"))
        config = fleet_config([(ENGINE, sim, "vllm")], serving={"max_request_bytes": LIMIT})
        process = stack.enter_context(router_process(config, stderr_path=log))
        yield Live(process, log)


@dataclass
class Case:
    what: str
    path: str
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    valid: bool = False


@dataclass
class Answer:
    status: int
    headers: Any
    body: bytes


async def send(live: Live, op: Operation, case: Case) -> Answer:
    headers = dict(case.headers)
    if case.body is not None:
        headers.setdefault("Content-Type", "application/json")
    url = URL(live.process.url + case.path, encoded=True)
    timeout = aiohttp.ClientTimeout(total=30)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.request(op.method.upper(), url, data=case.body, headers=headers) as resp,
    ):
        answer = Answer(resp.status, resp.headers.copy(), await resp.read())
    if op.path in COMPLETION_PATHS:
        live.completion_requests += 1
    live.statuses[answer.status] = live.statuses.get(answer.status, 0) + 1
    return answer


def check_declared(op: Operation, case: Case, answer: Answer) -> None:
    """The answer is one the operation declares: status, media type, headers, body."""
    where = f"{op} {case.what}: {answer.status} {answer.body[:300]!r}"
    assert str(answer.status) in op.spec["responses"], where
    response, pointer = resolve(
        op.spec["responses"][str(answer.status)], f"{op.pointer}/responses/{answer.status}"
    )
    for name, header in response.get("headers", {}).items():
        header, header_pointer = resolve(header, f"{pointer}/headers/{escape(name)}")
        value = answer.headers.get(name)
        if header.get("required"):
            assert value is not None, (name, where)
        if value is not None:
            validator(f"{header_pointer}/schema").validate(value)
    media = answer.headers.get("Content-Type", "").split(";")[0].strip()
    assert media in response["content"], where
    schema_pointer = f"{pointer}/content/{escape(media)}/schema"
    if media == "application/json":
        validator(schema_pointer).validate(json.loads(answer.body))
    elif media == "text/event-stream":
        check_events(schema_pointer, answer.body, where)


def check_events(pointer: str, body: bytes, where: str) -> None:
    """Each event matches the event schema, and its JSON data the schema the event schema
    gives for it (contentSchema, which JSON Schema itself only annotates)."""
    event_schema, event_pointer = resolve({"$ref": pointer}, pointer)
    branches = event_schema["properties"]["data"]["anyOf"]
    json_branch = next(i for i, b in enumerate(branches) if "contentSchema" in b)
    content = validator(f"{event_pointer}/properties/data/anyOf/{json_branch}/contentSchema")
    events = [
        block.removeprefix("data: ")
        for block in body.decode().replace("\r\n", "\n").split("\n\n")
        if block.strip()
    ]
    assert events and events[-1] == "[DONE]", where
    for data in events:
        validator(pointer).validate({"data": data})
        if data != "[DONE]":
            content.validate(json.loads(data))


# --- cases from the document -----------------------------------------------------------------

_MISSING = object()
# A value of each JSON type, tried in this order for "a type the schema does not allow".
_TYPED_VALUES: list[tuple[str, Any]] = [
    ("object", {"x": 1}),
    ("array", [1]),
    ("string", "x"),
    ("number", 0.5),
    ("boolean", True),
    ("null", None),
]


def flatten(schema: Any) -> dict[str, Any]:
    """The schema with its $refs followed and its allOf merged (properties, required)."""
    schema, _ = resolve(schema, "")
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema.get("allOf", []):
        part = flatten(part)
        merged["properties"] = {**merged.get("properties", {}), **part.get("properties", {})}
        merged["required"] = [*merged.get("required", []), *part.get("required", [])]
        for key, value in part.items():
            merged.setdefault(key, value)
    return merged


def allowed_types(schema: dict[str, Any]) -> set[str] | None:
    """The JSON types a schema admits, where it says (None: it does not say)."""
    if "anyOf" in schema:
        types: set[str] = set()
        for branch in schema["anyOf"]:
            branch_types = allowed_types(flatten(branch))
            if branch_types is None:
                return None
            types |= branch_types
        return types
    if "type" in schema:
        declared = schema["type"]
        return set(declared if isinstance(declared, list) else [declared])
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if values is None:
        return None
    return {_json_type(value) for value in values}


def _admits(types: set[str], value: Any) -> bool:
    kind = _json_type(value)
    return kind in types or (kind == "integer" and "number" in types)


def _json_type(value: Any) -> str:
    for name, kind in (("null", type(None)), ("boolean", bool), ("integer", int)):
        if isinstance(value, kind):
            return name
    return {float: "number", str: "string", list: "array", dict: "object"}[type(value)]


def invalid_values(value: Any, schema: Any) -> Iterator[tuple[str, Any]]:
    """(what, value) for values derived from `value` (or _MISSING) that the schema may
    refuse: a value that one anyOf branch refuses may be another's, so the caller keeps
    only those the whole schema refuses."""
    schema = flatten(schema)
    types = allowed_types(schema)
    if types is not None:
        if "number" in types:
            types.add("integer")
        wrong = next(((t, v) for t, v in _TYPED_VALUES if t not in types), None)
        if wrong is not None:
            yield f"as {wrong[0]}", wrong[1]
    if "minimum" in schema:
        yield "under its minimum", schema["minimum"] - 1
    if "maximum" in schema:
        yield "over its maximum", schema["maximum"] + 1
    if "enum" in schema or "const" in schema:
        yield "outside its values", "no-such-value"
    if "minItems" in schema and schema.get("type") in ("array", ["array"]):
        yield "empty", []
    if value is _MISSING:
        return
    for branch in schema.get("anyOf", []):  # the branches the value may be of
        types = allowed_types(flatten(branch))
        if types is None or _admits(types, value):
            yield from invalid_values(value, branch)
    if isinstance(value, dict):
        for name in value:  # a required field, or one another depends on (stream)
            yield f"without {name}", {k: v for k, v in value.items() if k != name}
        for name, sub in schema.get("properties", {}).items():
            for what, bad in invalid_values(value.get(name, _MISSING), sub):
                yield f"{name} {what}", {**value, name: bad}
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            for what, bad in invalid_values(item, schema["items"]):
                yield f"item {index} {what}", [*value[:index], bad, *value[index + 1 :]]


def paths_of(op: Operation) -> list[str]:
    """The operation's path with each of PATH_VALUES filled in (the first naming something)."""
    names = re.findall(r"{(\w+)}", op.path)
    if not names:
        return [op.path]
    assert len(names) == 1, f"{op}: give the test values for each path parameter"
    return [
        op.path.replace(f"{{{names[0]}}}", quote(value, safe="/"))
        for value in PATH_VALUES[names[0]]
    ]


def cases_of(op: Operation) -> Iterator[Case]:
    path, *naming_nothing = paths_of(op)
    body = op.spec.get("requestBody")
    examples: list[Any] = []
    if body is not None:
        body, body_pointer = resolve(body, f"{op.pointer}/requestBody")
        media = body["content"]["application/json"]
        body_schema = validator(f"{body_pointer}/content/application~1json/schema")
        examples = [example["value"] for example in media["examples"].values()]
        for index, example in enumerate(examples):
            yield Case(f"example {index}", path, json.dumps(example).encode(), valid=True)
    else:
        yield Case("as documented", path, valid=True)
    first = None if body is None else json.dumps(examples[0]).encode()
    for other in naming_nothing:
        yield Case(f"at {other}", other, first)
    if body is not None:
        sent: set[bytes] = set()
        for index, example in enumerate(examples):
            for what, bad in invalid_values(example, media["schema"]):
                raw = json.dumps(bad).encode()
                if raw not in sent and not body_schema.is_valid(bad):
                    sent.add(raw)
                    yield Case(f"example {index}, {what}", path, raw)
        yield Case("body not JSON", path, b'{"model": ')
        yield Case("no body", path, b"")
        padded = {**examples[0], "padding": "x" * LIMIT}
        yield Case("body over the limit", path, json.dumps(padded).encode())
        if "415" in op.spec["responses"]:
            yield Case("as text/plain", path, b"hi", {"Content-Type": "text/plain"})
    for parameter in op.spec.get("parameters", []):
        parameter, _ = resolve(parameter, "#")
        pattern = parameter["schema"].get("pattern")
        if parameter["in"] == "header" and pattern is not None:
            assert not re.search(pattern, "soon")
            headers = {parameter["name"]: "soon"}
            yield Case(f"{parameter['name']} not matching its pattern", path, first, headers)


@pytest.mark.parametrize("op", OPERATIONS, ids=str)
async def test_every_answer_is_one_the_document_declares(live: Live, op: Operation) -> None:
    try:
        for case in cases_of(op):
            case.headers.setdefault("X-Request-Id", "openapi-test-1")
            answer = await send(live, op, case)
            check_declared(op, case, answer)
            where = f"{op} {case.what}: {answer.status} {answer.body[:300]!r}"
            if case.valid:
                assert answer.status == 200, where
                assert answer.headers["X-Request-Id"].startswith("openapi-test-1-")
            else:
                assert 400 <= answer.status < 500, where
    finally:
        await restore(live)


async def restore(live: Live) -> None:
    """Undo what the examples did to the fleet: the engine undrained, no wave in maintenance."""
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{live.process.url}/admin/engines/{ENGINE}/undrain") as resp:
            assert resp.status == 200
        async with session.get(f"{live.process.url}/admin/engines") as resp:
            waves = {engine["wave"] for engine in (await resp.json())["engines"]}
        for wave in waves - {None}:
            body = {"wave": wave, "action": "end"}
            async with session.post(f"{live.process.url}/admin/maintenance", json=body) as resp:
                assert resp.status == 200


@pytest.mark.parametrize("path", list(DOCUMENT["paths"]))
async def test_an_undescribed_method_is_405_with_allow(live: Live, path: str) -> None:
    declared = {m.upper() for m in DOCUMENT["paths"][path] if m in METHODS}
    concrete = paths_of(Operation(path, "get", {}, ""))[0]
    async with (
        aiohttp.ClientSession() as session,
        session.delete(URL(live.process.url + concrete, encoded=True)) as resp,
    ):
        status, allow, body = resp.status, resp.headers.get("Allow", ""), await resp.json()
    assert status == 405
    allowed = {method.strip() for method in allow.split(",")}
    assert allowed - {"HEAD"} == declared
    validator("#/components/schemas/InvalidRequestError").validate(body)


async def test_an_unknown_route_is_404_in_the_envelope(live: Live) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(live.process.url + "/v1/embeddings") as resp,
    ):
        status, body = resp.status, await resp.json()
    assert status == 404
    validator("#/components/schemas/InvalidRequestError").validate(body)


async def test_zz_the_router_logged_no_error_and_counted_every_completion_request(
    live: Live,
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(live.process.url + "/metrics") as resp,
    ):
        values = samples(await resp.text())
    offered = values["narwhal_offered_total"]
    assert offered == total(values, "narwhal_outcomes_total") == live.completion_requests
    assert live.completion_requests > 0, live.statuses
    log = live.log.read_text(errors="replace")
    assert not [line for line in log.splitlines() if "ERROR" in line or "Traceback" in line]
