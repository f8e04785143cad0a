"""`narwhal.protocol` is sans-IO (DESIGN.md §2, STYLE.md "What Narwhal absorbs" 1):
no event loop, no sockets, no clocks, no global state. Checked on the source of every
module in the package, including modules added later, and on what importing them
actually loads."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import narwhal.protocol

PACKAGE = Path(narwhal.protocol.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))

# I/O, event loops, threads and clocks: the caller passes `now` and does the I/O.
FORBIDDEN = frozenset(
    {"asyncio", "aiohttp", "uvloop", "socket", "time", "selectors", "ssl", "threading", "trio"}
    | {"anyio", "http", "urllib", "requests", "httpx"}
)
# From Narwhal itself only the error tree and the package's own modules.
ALLOWED_NARWHAL = ("narwhal.errors", "narwhal.protocol")


def imported_modules(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_package_has_modules() -> None:
    names = {path.stem for path in MODULES}
    assert {"sse", "tokens", "exposure", "assembly", "usage", "events"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_imports_nothing_forbidden(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for name in imported_modules(tree):
        top = name.split(".")[0]
        assert top not in FORBIDDEN, f"{path.name} imports {name}"
        if top == "narwhal" and name != "narwhal":
            assert name.startswith(ALLOWED_NARWHAL), f"{path.name} imports {name}"
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Global), f"{path.name}:{node.lineno} uses global state"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id != "__import__", f"{path.name}:{node.lineno} calls __import__"


def test_importing_every_module_loads_no_io() -> None:
    """The source check misses transitive imports; a clean interpreter does not."""
    code = (
        "import importlib, pkgutil, sys, narwhal.protocol as p\n"
        "for m in pkgutil.walk_packages(p.__path__, 'narwhal.protocol.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = set(out.stdout.split())
    # `time` is loaded by the interpreter itself; the source check covers it.
    for name in FORBIDDEN - {"time"}:
        assert name not in loaded, f"importing narwhal.protocol loads {name}"
    assert not {m for m in loaded if m.startswith("narwhal.")} - {
        m for m in loaded if m.startswith(ALLOWED_NARWHAL)
    }
