"""Reading Markdown the way a reader of the README does: fenced blocks, headings, links.

Enough of CommonMark for this project's own files (backtick fences, ATX headings, inline
links), written for the README test (`tests/test_readme.py`), not a general parser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,})(?P<info>[^`]*)$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target); a target has no spaces in these files.
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its info string split into the language and the
    words after it, the section it is in, and its text (the fence's indentation removed)."""

    path: Path
    line: int  # of the opening fence, 1-based
    language: str | None
    words: tuple[str, ...]
    section: str  # the nearest heading above it, as written
    text: str

    @property
    def marker(self) -> str | None:
        return self.words[0] if self.words else None

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line} ({self.section})"


def fenced_blocks(path: Path) -> list[Block]:
    """Every fenced block of `path`, in order. An unclosed fence is an error: the rest of
    the file would silently become code."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    section = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        heading = _HEADING.match(line)
        if heading:
            section = heading.group(2)
        fence = _FENCE.match(line)
        if not fence:
            i += 1
            continue
        indent, ticks = fence.group("indent"), fence.group("ticks")
        words = fence.group("info").split()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not _closes(lines[j], ticks):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        if j == len(lines):
            raise ValueError(f"{path.name}:{i + 1}: the fence opened here is never closed")
        blocks.append(
            Block(
                path=path,
                line=i + 1,
                language=words[0] if words else None,
                words=tuple(words[1:]),
                section=section,
                text="\n".join(body) + "\n",
            )
        )
        i = j + 1
    return blocks


def _closes(line: str, ticks: str) -> bool:
    stripped = line.strip()
    return stripped.startswith(ticks) and set(stripped) == {"`"}


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of `path` (outside code blocks)."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("```"):
            in_code = not in_code
            continue
        heading = None if in_code else _HEADING.match(line)
        if heading:
            slug = slugify(heading.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def slugify(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and
    underscores kept), each space a hyphen."""
    text = heading.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def link_targets(path: Path) -> list[str]:
    """The targets of the inline links and images of `path`, outside code blocks and code
    spans."""
    targets: list[str] = []
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("```"):
            in_code = not in_code
            continue
        if not in_code:
            targets += _LINK.findall(re.sub(r"`[^`]*`", "", line))
    return targets
