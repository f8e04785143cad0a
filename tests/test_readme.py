"""The README and docs/ as a reader follows them: every snippet runs as written.

Every fenced block names its language, and every shell and YAML block says after it what
this test does with it (the README's "Development" section lists the markers):
`sh runnable` blocks run as written, `sh quickstart` is the Quick start, `yaml runnable`
configurations pass `narwhal check-config`, `yaml fragment`s pass it inside a minimal
configuration, and `manual` blocks (GPUs, root, a cluster) are left alone. A block
without a known marker fails, so a new snippet cannot go untested by accident.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from narwhal.sim.options import SimOptions
from tests.markdown import Block, fenced_blocks, heading_anchors, link_targets
from tests.snippets import (
    REPO,
    busy,
    checkout_like,
    environment_with_narwhal,
    ports_named,
    run_shell,
)

README = REPO / "README.md"
DOCUMENTS = [README, *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGUAGES = {"sh", "bash", "shell", "console", "zsh"}
YAML_LANGUAGES = {"yaml", "yml"}
MARKERS = {
    "shell": {"runnable", "quickstart", "manual"},
    "yaml": {"runnable", "fragment", "manual"},
}
QUICK_START = ["pip install . && narwhal serve", "./scripts/test"]
SNIPPET_TIMEOUT_S = 100.0
# What `check-config` is given for every `*_env` secret a configuration names: it reads
# them from its environment, as the router will, and the reader sets them.
PLACEHOLDER_SECRET = "placeholder-secret-for-the-readme-test"

BLOCKS = [block for path in DOCUMENTS for block in fenced_blocks(path)]


# The snippets use the README's fixed ports (8000, 8101, ...), one at a time, and their bench
# runs are a new user's first sight of predictive admission: run after the parallel tests,
# with nothing beside them, as a user's machine would (on a machine the xdist workers and a
# real vLLM keep busy, the embedded sims are slower than their profile and the router
# rightly refuses part of a burst, which the snippets must not show).
pytestmark = pytest.mark.alone


def _kind(block: Block) -> str | None:
    if block.language in SHELL_LANGUAGES:
        return "shell"
    if block.language in YAML_LANGUAGES:
        return "yaml"
    return None


def _marked(kind: str, marker: str, documents: list[Path] = DOCUMENTS) -> list[Block]:
    return [b for b in BLOCKS if _kind(b) == kind and b.marker == marker and b.path in documents]


def _id(block: Block) -> str:
    return f"{block.path.name}:{block.line}"


# --- every block is marked --------------------------------------------------------------------


def test_every_block_names_its_language_and_what_the_test_does_with_it() -> None:
    problems = []
    for block in BLOCKS:
        if block.language is None:
            problems.append(f"{block.where}: a fence without a language (```text for output)")
            continue
        kind = _kind(block)
        if kind is not None and block.marker not in MARKERS[kind]:
            problems.append(
                f"{block.where}: ```{block.language} needs one of "
                f"{sorted(MARKERS[kind])} after the language, got {block.marker!r}"
            )
    assert not problems, "\n".join(problems)


_INDENTED_COMMAND = re.compile(
    r"^ {4,}(\$ )?(narwhal|python3?|pip|curl|vllm|etcd|kubectl|docker|buildah)\b"
)


def test_no_command_hides_in_an_indented_block() -> None:
    # Markdown's indented code blocks have no info string, so a command in one would
    # escape the markers: a blank line, then a command indented by four spaces or more.
    problems = []
    for path in DOCUMENTS:
        lines = path.read_text(encoding="utf-8").splitlines()
        in_fence = False
        for number, line in enumerate(lines, 1):
            if line.strip().startswith("```"):
                in_fence = not in_fence
            elif (
                not in_fence
                and number > 1
                and not lines[number - 2].strip()
                and _INDENTED_COMMAND.match(line)
            ):
                problems.append(f"{path.name}:{number}: put it in a marked fenced block")
    assert not problems, "\n".join(problems)


def test_the_documents_have_runnable_snippets_to_test() -> None:
    # The other tests are parametrized over the marked blocks: with none found (a parser
    # broken by an edit) they would all vanish and pass.
    assert len(_marked("shell", "runnable", [README])) >= 3
    assert len(_marked("yaml", "runnable", [README])) >= 4
    assert len(_marked("shell", "quickstart", [README])) == 2


# --- the Quick start ---------------------------------------------------------------------------


def test_the_quick_start_opens_the_readme_with_exactly_its_two_commands() -> None:
    first = next(b for b in BLOCKS if b.path == README)
    assert first.section == "Quick start" and first.marker == "quickstart", first.where
    assert first.text.splitlines() == QUICK_START
    scripts_test = REPO / "scripts" / "test"
    assert scripts_test.is_file() and os.access(scripts_test, os.X_OK)
    # `pip install .` installs the distribution that gives the `narwhal` command, on the
    # Python the README names.
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["scripts"]["narwhal"] == "narwhal.cli:main"
    assert project["requires-python"] == ">=3.11"
    assert "Python 3.11 or newer" in _section_text(README, "Quick start")


def test_the_quick_start_router_answers_the_request_below_it(tmp_path: Path) -> None:
    install_and_serve, request = _marked("shell", "quickstart", [README])
    serve = install_and_serve.text.splitlines()[0].split("&& ", 1)[1]
    _skip_if_busy(ports_named(request.text) | {8000})
    cwd = checkout_like(tmp_path / "checkout")
    env = environment_with_narwhal(tmp_path / "bin")
    router = subprocess.Popen(
        shlex.split(serve),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_for_listening(router)
        run = run_shell(request.text, cwd, env, timeout=SNIPPET_TIMEOUT_S)
    finally:
        router.terminate()
        router.wait(30)
        assert router.stdout is not None
        router.stdout.close()
    assert run.returncode == 0, run.describe()
    assert '"object":"chat.completion"' in run.stdout, run.describe()


def _wait_for_listening(process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            pytest.fail(f"narwhal serve exited ({process.wait()}) before it listened")
        if b"listening on" in line:
            return
    pytest.fail("narwhal serve did not say it was listening")


# --- shell snippets ---------------------------------------------------------------------------


@pytest.mark.parametrize("block", _marked("shell", "runnable"), ids=_id)
def test_runnable_shell_snippet_runs_as_written(block: Block, tmp_path: Path) -> None:
    _skip_if_busy(ports_named(block.text))
    cwd = checkout_like(tmp_path / "checkout")
    env = environment_with_narwhal(tmp_path / "bin")
    run = run_shell(block.text, cwd, env, timeout=SNIPPET_TIMEOUT_S)
    assert run.returncode == 0, f"{block.where}: {run.describe()}"
    assert not run.left_running, f"{block.where} left processes running: {run.describe()}"
    # Every request it shows gets its answer, and every load it runs succeeds.
    for route, kind in (
        ("/v1/chat/completions", "chat.completion"),
        ("/v1/completions", "text_completion"),
    ):
        asked = len(re.findall(rf"curl .*{re.escape(route)}", block.text))
        answered = run.stdout.count(f'"object":"{kind}"')
        assert answered >= asked, f"{block.where}: {asked} {route} asked, {answered} answered"
    benches = len(re.findall(r"^narwhal bench ", block.text, re.MULTILINE))
    stages = re.findall(r"\(ok (\d+), errors (\d+)\)", run.stdout)
    assert len(stages) >= benches, f"{block.where}: {benches} bench runs, {len(stages)} reports"
    # The stdout shown below is its end; the lines that say where errors came are kept.
    said = [
        line
        for line in run.stdout.splitlines()
        if re.search(r"errors [1-9]|warm-up:|^  HTTP |^== |^narwhal bench", line)
    ]
    assert all(errors == "0" for _, errors in stages), (
        f"{block.where}:\n" + "\n".join(said) + "\n" + run.describe()
    )


def _skip_if_busy(ports: set[int]) -> None:
    taken = busy(ports)
    if not taken:
        return
    message = f"ports {taken} are in use here (a narwhal serve of the Quick start?)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


# --- YAML snippets ----------------------------------------------------------------------------


@pytest.mark.parametrize("block", _marked("yaml", "runnable"), ids=_id)
def test_runnable_configuration_passes_check_config(block: Block, tmp_path: Path) -> None:
    _check_config(block.text, tmp_path, block.where)


@pytest.mark.parametrize("block", _marked("yaml", "fragment"), ids=_id)
def test_configuration_fragment_passes_check_config_in_a_whole_one(
    block: Block, tmp_path: Path
) -> None:
    fragment = yaml.safe_load(block.text)
    assert isinstance(fragment, dict), block.where
    whole = {"model": "m", "engines": [{"name": "e0", "url": "http://127.0.0.1:9"}], **fragment}
    _check_config(yaml.safe_dump(whole), tmp_path, block.where)


def _check_config(text: str, tmp_path: Path, where: str) -> dict[str, Any]:
    path = tmp_path / "narwhal.yaml"
    path.write_text(text, encoding="utf-8")
    named = re.findall(r"_env:\s*\"?([A-Za-z_][A-Za-z0-9_]*)", text)
    # (One of its own for each: one key may not serve two tenants.)
    env = dict(os.environ, **{name: f"{PLACEHOLDER_SECRET}-{name}" for name in named})
    result = subprocess.run(
        [sys.executable, "-m", "narwhal", "check-config", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, f"{where}: check-config said\n{result.stderr}"
    effective: dict[str, Any] = yaml.safe_load(result.stdout)
    return effective


def test_the_configuration_reference_names_every_key(tmp_path: Path) -> None:
    reference = _reference()
    effective = _check_config(reference.text, tmp_path, reference.where)
    missing = sorted(
        k for k in _keys(effective) if not re.search(rf"(?<![\w.]){k}:", reference.text)
    )
    assert not missing, (
        f"{reference.where}: check-config prints keys the reference does not name: {missing}"
    )


def test_the_configuration_reference_describes_the_first_examples_fleet() -> None:
    # Followed verbatim, the reference must serve what the sims of the example serve.
    reference = yaml.safe_load(_reference().text)
    example = next(
        b
        for b in _marked("shell", "runnable", [README])
        if b.section == "First, on simulated engines"
    )
    sims = {
        int(port): role
        for role, port in re.findall(r"narwhal sim --role (\w+) --port (\d+)", example.text)
    }
    assert reference["model"] == SimOptions().model
    served = {int(e["url"].rsplit(":", 1)[1]): e.get("role", "both") for e in reference["engines"]}
    assert served == sims


def _reference() -> Block:
    (reference,) = [
        b for b in _marked("yaml", "runnable", [README]) if b.section == "Configuration"
    ]
    return reference


def _keys(tree: object) -> set[str]:
    """Every mapping key anywhere in `tree` (lists of mappings included)."""
    if isinstance(tree, dict):
        return set(tree) | {k for value in tree.values() for k in _keys(value)}
    if isinstance(tree, list):
        return {k for item in tree for k in _keys(item)}
    return set()


# --- install lines and links ------------------------------------------------------------------


def test_every_install_line_installs_from_a_checkout() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = set(project["optional-dependencies"])
    assert project["name"] != "narwhal"  # an unrelated project has that name on PyPI
    problems = []
    for path in DOCUMENTS:
        for line in re.findall(r"pip install ([^`\n]+)", path.read_text(encoding="utf-8")):
            # What it installs: its first word that is not an option (prose and `&& ...`
            # may follow it).
            word = next(w.strip("'\"();,") for w in line.split() if not w.startswith("-"))
            if word.startswith("."):
                asked = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", word)
                named = (
                    set() if asked is None or not asked.group(1) else set(asked.group(1).split(","))
                )
                if asked is None or named - extras:
                    problems.append(f"{path.name}: pip install {word}: no such extra")
            elif word.split("[")[0].lower().startswith("narwhal"):
                problems.append(f"{path.name}: pip install {word} installs another project")
    assert not problems, "\n".join(problems)


def test_every_link_between_the_documents_resolves() -> None:
    problems = []
    for path in DOCUMENTS:
        for target in link_targets(path):
            if re.match(r"[a-z]+:", target):
                continue  # http(s):, mailto:
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                problems.append(f"{path.name}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked):
                problems.append(f"{path.name}: {target}: no such heading")
    assert not problems, "\n".join(problems)


def _section_text(path: Path, heading: str) -> str:
    text = path.read_text(encoding="utf-8")
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : None if end < 0 else end]
