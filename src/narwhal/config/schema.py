"""Checking parsed YAML against a tree of msgspec Structs, reporting every error at once.

`msgspec.convert` stops at the first error, and an operator fixing a file wants them all.
`type_problems(raw, Config)` walks the data beside the types: every unknown key, every
missing required key and every value of the wrong type is a `Problem`, named by its
dotted path (`engines.1.wave`) and saying what was expected, for example
`admission.queue_limit: expected int >= 0, got "ten"`. A value that is not a Struct (or a
list of Structs) is checked by `msgspec.convert` itself, so what passes here is exactly
what msgspec accepts for the whole tree.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

Path = tuple[str | int, ...]


class Problem(NamedTuple):
    """One thing wrong with a configuration: where (a path of keys and list indexes), and
    what."""

    path: Path
    message: str

    def __str__(self) -> str:
        return f"{dotted(self.path) or '(top level)'}: {self.message}"


def dotted(path: Sequence[str | int]) -> str:
    return ".".join(str(part) for part in path)


def type_problems(raw: object, annotation: Any, path: Path = ()) -> list[Problem]:
    """Everything in `raw` that `msgspec.convert(raw, annotation, strict=True)` refuses."""
    struct = _struct_of(annotation, raw)
    if struct is not None:
        return _struct_problems(raw, struct, path)
    item = _struct_items_of(annotation)
    if item is not None and isinstance(raw, list):
        problems: list[Problem] = []
        for i, value in enumerate(raw):
            problems += type_problems(value, item, (*path, i))
        return problems
    entry = _struct_values_of(annotation)
    if entry is not None and isinstance(raw, dict):
        key_type, value_type = entry
        problems = []
        for key, value in raw.items():
            try:
                msgspec.convert(key, key_type, strict=True)
            except msgspec.ValidationError:
                node = msgspec.inspect.type_info(key_type)
                problems.append(Problem((*path, str(key)), f"the name must be {_describe(node)}"))
                continue
            problems += type_problems(value, value_type, (*path, key))
        return problems
    try:
        msgspec.convert(raw, annotation, strict=True)
    except msgspec.ValidationError as error:
        return [_leaf_problem(error, raw, annotation, path)]
    return []


def _struct_problems(raw: object, struct: type[msgspec.Struct], path: Path) -> list[Problem]:
    if not isinstance(raw, dict):
        return [Problem(path, f"expected a mapping, got {_show(raw)}")]
    fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
    problems: list[Problem] = []
    for key, value in raw.items():  # in the file's order
        field = fields.get(key)
        if field is None:
            allowed = ", ".join(fields)
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.75)
            hint = f'did you mean "{close[0]}"? ' if close else ""
            message = f"unknown key ({hint}expected one of: {allowed})"
            problems.append(Problem((*path, str(key)), message))
        else:
            problems += type_problems(value, field.type, (*path, key))
    for name, field in fields.items():
        if field.required and name not in raw:
            problems.append(Problem((*path, name), "required key missing"))
    return problems


def _struct_of(annotation: Any, raw: object) -> type[msgspec.Struct] | None:
    """The Struct class `raw` must be read as: the annotation's own, or the one in a
    union (`Struct | None`, `str | Struct`) when `raw` is a mapping."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation
    if isinstance(raw, dict) and _is_union(annotation):
        structs = [a for a in typing.get_args(annotation) if _struct_of(a, raw) is not None]
        if len(structs) == 1:
            return _struct_of(structs[0], raw)
    return None


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _holds_struct(annotation: Any) -> bool:
    """Whether the annotation is a Struct or a union with one."""
    if _is_union(annotation):
        return any(_holds_struct(a) for a in typing.get_args(annotation))
    return isinstance(annotation, type) and issubclass(annotation, msgspec.Struct)


def _struct_items_of(annotation: Any) -> Any:
    """X for `tuple[X, ...]` where X is a Struct or a union with one, else None."""
    if typing.get_origin(annotation) is not tuple:
        return None
    args = typing.get_args(annotation)
    if len(args) == 2 and args[1] is Ellipsis and _holds_struct(args[0]):
        return args[0]
    return None


def _struct_values_of(annotation: Any) -> tuple[Any, Any] | None:
    """(K, V) for `dict[K, V]` where V is a Struct, else None."""
    if typing.get_origin(annotation) is not dict:
        return None
    key, value = typing.get_args(annotation)
    return (key, value) if _holds_struct(value) else None


# --- msgspec's message for one value, as a message that names the key ----------------------


def _leaf_problem(
    error: msgspec.ValidationError, raw: object, annotation: Any, path: Path
) -> Problem:
    _, _, where = str(error).partition(" - at `$")
    inner = _parse_path(where.rstrip("`")) if where else []
    node = _type_at(msgspec.inspect.type_info(annotation), inner)
    return Problem((*path, *inner), f"expected {_describe(node)}, got {_show(_lookup(raw, inner))}")


def _parse_path(where: str) -> list[str | int]:
    """`[0]` or `.key[1]` -> [0] or ["key", 1]."""
    parts: list[str | int] = []
    for piece in where.replace("[", ".[").split("."):
        if not piece:
            continue
        if piece.startswith("[") and piece.endswith("]"):
            parts.append(int(piece[1:-1]))
        else:
            parts.append(piece)
    return parts


def _type_at(node: msgspec.inspect.Type, path: Sequence[str | int]) -> msgspec.inspect.Type:
    for part in path:
        node = _unwrap(node)
        if isinstance(node, msgspec.inspect.StructType) and isinstance(part, str):
            fields = {f.encode_name: f.type for f in node.fields}
            node = fields.get(part, msgspec.inspect.AnyType())
        elif isinstance(node, msgspec.inspect.VarTupleType | msgspec.inspect.ListType):
            node = node.item_type
        elif isinstance(node, msgspec.inspect.DictType):
            node = node.value_type
        else:
            return msgspec.inspect.AnyType()
    return node


def _unwrap(node: msgspec.inspect.Type) -> msgspec.inspect.Type:
    if isinstance(node, msgspec.inspect.UnionType):
        rest = [t for t in node.types if not isinstance(t, msgspec.inspect.NoneType)]
        if len(rest) == 1:
            return rest[0]
    return node


def _describe(node: msgspec.inspect.Type) -> str:
    if isinstance(node, msgspec.inspect.UnionType):
        return " or ".join(_describe(t) for t in node.types)
    if isinstance(node, msgspec.inspect.NoneType):
        return "null"
    if isinstance(node, msgspec.inspect.BoolType):
        return "true or false"
    if isinstance(node, msgspec.inspect.IntType):
        return "int" + _bounds(node.ge, node.gt, node.le, node.lt)
    if isinstance(node, msgspec.inspect.FloatType):
        return "number" + _bounds(node.ge, node.gt, node.le, node.lt)
    if isinstance(node, msgspec.inspect.StrType):
        if node.pattern is not None:
            return f"a string matching {node.pattern}"
        return "string" + (f" of at least {node.min_length} chars" if node.min_length else "")
    if isinstance(node, msgspec.inspect.LiteralType):
        return "one of " + ", ".join(json.dumps(v) for v in node.values)
    if isinstance(node, msgspec.inspect.StructType):
        return "a mapping"
    if isinstance(node, msgspec.inspect.VarTupleType | msgspec.inspect.ListType):
        return "a list"
    return "a valid value"


def _bounds(ge: float | None, gt: float | None, le: float | None, lt: float | None) -> str:
    parts = []
    if ge is not None:
        parts.append(f">= {ge}")
    if gt is not None:
        parts.append(f"> {gt}")
    if le is not None:
        parts.append(f"<= {le}")
    if lt is not None:
        parts.append(f"< {lt}")
    return (" " + " and ".join(parts)) if parts else ""


def _lookup(raw: object, path: Sequence[str | int]) -> object:
    node = raw
    for part in path:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return None
    return node


def _show(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return json.dumps(value, default=str)
