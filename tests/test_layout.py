"""The package layout shows the architecture (DESIGN.md §2): which floor each module is on,
and which floors it may lean on. Checked on the source of every module, including
modules added later, so a new arrow upward or a new module loose at the package root
fails here before a reader has to find it.

The decision core (`narwhal.decision`) and what it is made of (`admission`, `scheduler`,
`models`) are sans-IO: checked here as `tests/protocol/test_sans_io.py` checks protocol.
The attempt runner (`dispatch`) reaches the decisions through the core's protocol and its
messages only, never its implementation or admission's parts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import narwhal

PACKAGE = Path(narwhal.__file__).parent

# The package root holds the entry points, the composition root and what every floor
# shares; everything else lives in a package of its own concern.
ROOT_MODULES = frozenset(
    {
        "__init__",
        "__main__",
        "cli",  # the command line
        "serve",  # `narwhal serve`: the command line and the configuration it starts from
        "serving",  # one router process on its event loop: listeners, signals, shutdown
        "check_config",  # `narwhal check-config`
        "router",  # the composition root
        "relay_worker",  # a relay worker's composition root (Step 16)
        "supervisor",  # relay workers and their decision process, as one router
        "lease",  # what a dispatched request holds and gives back
        "errors",  # the error tree every floor raises
    }
)

# Floor -> the floors of Narwhal it may import (its own always). The models are pure math
# over values; configuration and the wire protocol sit under everything; the simulator
# and the load generator speak the wire format only, so that they can face any router.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "models": frozenset({"protocol"}),
    "config": frozenset({"protocol"}),
    "protocol": frozenset({"errors"}),
    "sim": frozenset({"protocol"}),
    "bench": frozenset({"protocol"}),
    "observability": frozenset({"config", "errors", "protocol", "models"}),
    "fleet": frozenset({"config", "engines", "protocol", "errors"}),
    "sizing": frozenset({"config", "engines", "protocol", "errors"}),
    # The engine clients shape requests and read answers; they decide nothing, so they
    # know no model, registry or admission (the profiler that drives them is above).
    "engines": frozenset({"config", "errors", "protocol"}),
    # Placement sits under admission: it is told about tickets, it does not import them.
    "scheduler": frozenset({"config", "errors", "fleet", "models", "protocol"}),
    # Admission's parts (retention, the queue, the predictive check, classes, tenants)
    # sit under the decision core that composes them.
    "admission": frozenset({"config", "errors", "models", "protocol", "scheduler"}),
    "decision": frozenset(
        {"admission", "config", "errors", "models", "ops", "protocol", "scheduler", "sizing"}
    ),
    # The attempt runner and the core's asyncio shell: no admission part, no model.
    "dispatch": frozenset(
        {
            "config",
            "decision",
            "engines",
            "errors",
            "lease",
            "observability",
            "ops",
            "protocol",
            "scheduler",
            "sizing",
        }
    ),
    "profiling": frozenset(
        {"config", "engines", "errors", "models", "protocol", "scheduler", "sizing"}
    ),
    # The api reaches the decisions only through dispatch (what it hands back: `lease`).
    "api": frozenset({"config", "errors", "lease", "observability", "ops", "protocol", "sizing"}),
    "ha": frozenset({"ops"}),
    # The core behind a socket: its protocol and messages on either side, never the core
    # itself (the decision process's composition hands a `DecisionCore` over).
    "transport": frozenset({"decision", "errors", "observability", "protocol"}),
}
# Modules a floor may not import although it may import their floor.
NOT_IMPORTED: dict[str, frozenset[str]] = {
    # High availability asks for the replicated operator state to be read back
    # (`ReplicatedState`); it does not know what is in it.
    "ha": frozenset({"narwhal.ops.operator_state"}),
    # The seam: the core's protocol and messages, never the core itself (`Brain` may run
    # in another process; the composition root hands it over).
    "dispatch": frozenset({"narwhal.decision.brain"}),
    "transport": frozenset({"narwhal.decision.brain"}),
}
# Nothing of I/O in the models: the caller passes `now` and does the I/O.
MODELS_FORBIDDEN = frozenset(
    {"asyncio", "aiohttp", "socket", "time", "threading", "prometheus_client", "logging"}
)
# Nor in the decision core or admission's parts: time is passed in, the shell waits.
SANS_IO_FLOORS = ("decision", "admission")
SANS_IO_FORBIDDEN = frozenset(
    {"asyncio", "aiohttp", "uvloop", "socket", "time", "threading", "selectors", "ssl"}
)


def _floor(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _imports(path: Path) -> list[str]:
    """Every module the file imports, at any depth of the file (TYPE_CHECKING too: a
    type is a dependency of the design as much as a call)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_package_root_holds_only_its_entry_points_and_composition() -> None:
    loose = {path.stem for path in PACKAGE.glob("*.py")} - ROOT_MODULES
    assert not loose, f"modules loose at the package root, put each in its floor: {loose}"


def test_operations_and_observability_have_packages_of_their_own() -> None:
    for floor, members in {
        "ops": {"membership", "operator_state", "reload", "config_changes", "shutdown", "drain"},
        "observability": {"logs", "tracing", "otel", "loop_monitor", "exposition", "metrics"},
    }.items():
        present = {path.stem for path in (PACKAGE / floor).glob("*.py")}
        assert members <= present, f"{floor}/ lacks {members - present}"


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if _floor(p) in MAY_IMPORT],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_each_floor_leans_only_on_the_floors_below_it(path: Path) -> None:
    floor = _floor(path)
    allowed = MAY_IMPORT[floor] | {floor}
    for name in _imports(path):
        parts = name.split(".")
        if parts[0] != "narwhal" or len(parts) < 2:
            continue
        assert parts[1] in allowed, f"{path.relative_to(PACKAGE)} ({floor}) imports {name}"
        assert not name.startswith(tuple(NOT_IMPORTED.get(floor, ()))), (
            f"{path.relative_to(PACKAGE)} imports {name}"
        )


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if _floor(p) == "models"],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_the_models_are_math_over_values(path: Path) -> None:
    for name in _imports(path):
        top = name.split(".")[0]
        assert top not in MODELS_FORBIDDEN, f"models/{path.name} imports {name}"


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if _floor(p) in SANS_IO_FLOORS],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_the_decision_core_is_sans_io(path: Path) -> None:
    for name in _imports(path):
        top = name.split(".")[0]
        assert top not in SANS_IO_FORBIDDEN, f"{path.relative_to(PACKAGE)} imports {name}"


def test_the_rules_see_every_floor() -> None:
    """A rule against a floor that was renamed would pass for ever."""
    floors = {_floor(path) for path in MODULES}
    assert set(MAY_IMPORT) <= floors


# Where a dialect's (or an engine vendor's) name may be written: the one table of what each
# dialect does, the configuration's default, the metric names of each vendor, and the
# simulator and load generator, which play or face an engine.
_DIALECT_NAMES = frozenset({"vllm", "sglang", "openai"})
_MAY_NAME_DIALECTS = (
    "protocol/dialects.py",
    "config/__init__.py",
    "fleet/scrape.py",
    "sim/",
    "bench/",
)


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr):
            found.add(id(node.body[0].value))
    return found


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if not str(p.relative_to(PACKAGE)).startswith(_MAY_NAME_DIALECTS)],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_no_behaviour_is_keyed_on_a_dialects_name(path: Path) -> None:
    """Every decision by dialect reads its capabilities (`narwhal.protocol.dialects`):
    the upstream body, the tracker's IDs, the tokenize route and form, the metric names,
    what /admin/engines reports. A string compared with "vllm" elsewhere is a second
    table that the first will not keep in step."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in _DIALECT_NAMES:
            assert id(node) in docstrings, (
                f"{path.relative_to(PACKAGE)}:{node.lineno} names the dialect {node.value!r}"
            )
