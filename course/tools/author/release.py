"""Make the student starters in lessons/ from the reference solutions.

Like nbgrader's release step: each solution marks the code a student writes
between `### BEGIN SOLUTION` and `### END SOLUTION`. The starter keeps
everything else (the TODO comments and hints above a block, the snippet
sections the site includes) and puts a `raise NotImplementedError` where the
block was, so an unsolved starter fails loudly at the exact line, and never
passes a test by doing nothing.

A debugging exercise (lesson 09) is the other way round: its starter is a
broken script that runs and shows the failure. Between `### BEGIN BUG` and
`### FIX`, the solution keeps the broken lines as comments (`#| code`); the
starter gets them back as code, and drops the fix that follows, up to `### END BUG`.
Its TODO points at the first broken line.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from course import REPO_ROOT

BEGIN = "### BEGIN SOLUTION"
HINTS_FILE = "hints.json"  # next to each starter: its TODOs' goals and hints
END = "### END SOLUTION"
BUG, FIX, END_BUG = "### BEGIN BUG", "### FIX", "### END BUG"
BROKEN = re.compile(r"^(\s*)#\| ?(.*)$", re.S)  # a broken line, kept as a comment: "#| code"
SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints"}


class ReleaseError(ValueError):
    pass


HINT = re.compile(r"^\s*# HINT(?: \d+)?:\s?(.*)$")
HINT_MORE = re.compile(r"^\s*#   (.*)$")  # a hint's continuation line: "#" and 3 spaces
TODO = re.compile(r"^\s*# TODO:\s?(.*)$")
COMMENT = re.compile(r"^\s*#\s?(.*)$")


def convert(source: str, name: str) -> tuple[str, list[dict]]:
    """(the starter text, its TODOs) for one solution file; `name` is used in messages.

    Each TODO is {"id": "TODO at <name>:<line>", "goal": text, "hints": [text, ...]}
    (and "bug": the broken lines, for a BEGIN BUG block):
    the goal is the `# TODO:` comment above a solution block (the starter keeps
    it), the hints its `# HINT n:` lines (the starter drops them; `python -m
    course hint` and the lesson's page reveal them one at a time)."""
    out: list[str] = []
    todos: list[dict] = []
    comment: list[str] = []  # the comment lines just above the current line
    hints: list[str] = []
    inside_from: int | None = None
    bug: dict | None = None  # the BEGIN BUG block being read
    for number, line in enumerate(source.splitlines(keepends=True), start=1):
        marker = line.strip()
        if bug is not None:  # inside a BEGIN BUG block
            if marker == FIX:
                if bug["fix"]:
                    raise ReleaseError(f"{name}:{number}: a second {FIX} in the block")
                bug["fix"] = True
            elif marker == END_BUG:
                if not bug["fix"]:
                    raise ReleaseError(f"{name}:{number}: {END_BUG} before its {FIX}")
                bug = None
            elif marker in (BEGIN, END, BUG):
                raise ReleaseError(f"{name}:{number}: {marker} inside the bug at line {bug['at']}")
            elif not bug["fix"]:
                if not (m := BROKEN.match(line)) and marker:
                    raise ReleaseError(f"{name}:{number}: a broken line must read `#| code`")
                if not bug["first"]:
                    where = f"TODO at {name}:{len(out) + 1}"
                    todos.append({"id": where, "goal": _goal(comment), "hints": hints, "bug": []})
                    comment, hints, bug["first"] = [], [], True
                out.append(m.group(1) + m.group(2) if m else line)
                if m and m.group(2).strip():  # how `course hint` tells the bug is still there
                    todos[-1]["bug"].append(m.group(2).strip())
            continue
        if inside_from is None and (m := HINT.match(line)):
            hints.append(m.group(1).strip())
            continue
        if inside_from is None and hints and (m := HINT_MORE.match(line)):
            hints[-1] += " " + m.group(1).strip()
            continue
        if marker == BUG:
            if inside_from is not None:
                raise ReleaseError(f"{name}:{number}: {BUG} inside the block at {inside_from}")
            bug = {"at": number, "fix": False, "first": False}
            continue
        if marker in (FIX, END_BUG):
            raise ReleaseError(f"{name}:{number}: {marker} without a {BUG}")
        if marker == BEGIN:
            if inside_from is not None:
                raise ReleaseError(
                    f"{name}:{number}: {BEGIN} inside the block opened at line {inside_from}"
                )
            inside_from = number
            indent = line[: len(line) - len(line.lstrip())]
            where = f"TODO at {name}:{len(out) + 1}"
            out.append(f'{indent}raise NotImplementedError("{where} is not done yet")\n')
            todos.append({"id": where, "goal": _goal(comment), "hints": hints})
            comment, hints = [], []
        elif marker == END:
            if inside_from is None:
                raise ReleaseError(f"{name}:{number}: {END} without a {BEGIN}")
            inside_from = None
        elif inside_from is None:
            out.append(line)
            comment = comment + [line] if COMMENT.match(line) else []
            if not comment:
                hints = []
    if inside_from is not None:
        raise ReleaseError(f"{name}:{inside_from}: {BEGIN} is never closed")
    if bug is not None:
        raise ReleaseError(f"{name}:{bug['at']}: {BUG} is never closed")
    return "".join(out), todos


def _goal(comment: list[str]) -> str:
    """The text of the `# TODO:` comment among the lines just above a block."""
    for start, line in enumerate(comment):
        if TODO.match(line):
            parts = [TODO.match(line).group(1)]
            parts += [COMMENT.match(rest).group(1) for rest in comment[start + 1 :]]
            return " ".join(p.strip() for p in parts if p.strip())
    return ""


def make_starter(source: str, name: str) -> str:
    """The starter text for one solution file; `name` is used in messages."""
    return convert(source, name)[0]


SECTION = re.compile(r"#\s*--8<--\s*\[(start|end):([\w-]+)\]")


def solution_view(source: str, section: str | None = None) -> str:
    """The reference solution as a reader of the site sees it: the code only.

    No `### BEGIN/END SOLUTION` lines, no `# TODO:` comment (the goal, with its
    continuation lines) above a block, no `# HINT` lines, no snippet section
    markers; `section` keeps only the lines between that section's markers. A
    removed block of comments leaves at most one blank line behind."""
    lines = source.splitlines(keepends=True)
    if section is not None:
        starts = [i for i, line in enumerate(lines) if (m := SECTION.search(line))
                  and m.groups() == ("start", section)]  # fmt: skip
        ends = [i for i, line in enumerate(lines) if (m := SECTION.search(line))
                and m.groups() == ("end", section)]  # fmt: skip
        if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
            raise ReleaseError(f"no single section {section!r} in the source")
        lines = lines[starts[0] + 1 : ends[0]]
    out: list[str] = []
    dropping = False  # inside a TODO comment or its hints
    broken = False  # between BEGIN BUG and FIX: the starter's lines, not the solution's
    for line in lines:
        if line.strip() == BUG:
            broken, dropping = True, False
            continue
        if broken or line.strip() in (FIX, END_BUG):
            broken = broken and line.strip() != FIX
            continue
        if TODO.match(line) or HINT.match(line):
            dropping = True
            continue
        if dropping and COMMENT.match(line) and line.strip() != BEGIN:
            continue
        dropping = False
        if line.strip() in (BEGIN, END) or SECTION.search(line):
            continue
        out.append(line)
    return "".join(out)


def _source_files(solutions: Path):
    for path in sorted(solutions.rglob("*")):
        if path.is_file() and not SKIP_DIRS.intersection(path.relative_to(solutions).parts):
            yield path


def plan(solutions: Path = REPO_ROOT / "solutions", lessons: Path = REPO_ROOT / "lessons"):
    """What lessons/ should hold: {relative path: bytes}."""
    wanted: dict[Path, bytes] = {}
    hints: dict[Path, list[dict]] = {}
    for path in _source_files(solutions):
        rel = path.relative_to(solutions)
        if path.name == HINTS_FILE:
            continue
        if path.suffix == ".py":
            text, todos = convert(path.read_text(), rel.as_posix())
            wanted[rel] = text.encode()
            if todos:
                hints.setdefault(rel.parent / HINTS_FILE, []).extend(todos)
        else:
            wanted[rel] = path.read_bytes()
    for rel, todos in hints.items():
        wanted[rel] = (json.dumps({"todos": todos}, indent=1, ensure_ascii=False) + "\n").encode()
    return wanted


def stale(solutions: Path = REPO_ROOT / "solutions", lessons: Path = REPO_ROOT / "lessons"):
    """The starter files that differ from what the solutions generate, or should not exist."""
    wanted = plan(solutions, lessons)
    have = {p.relative_to(lessons) for p in _source_files(lessons)} if lessons.exists() else set()
    out = []
    for rel in sorted(set(wanted) | have):
        target = lessons / rel
        if rel not in wanted or not target.exists() or target.read_bytes() != wanted[rel]:
            out.append(rel)
    return out


def release(solutions: Path = REPO_ROOT / "solutions", lessons: Path = REPO_ROOT / "lessons"):
    """Rewrite lessons/ from solutions/; returns the paths that changed."""
    wanted = plan(solutions, lessons)
    changed = stale(solutions, lessons)
    for rel in changed:
        target = lessons / rel
        if rel in wanted:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(wanted[rel])
            if (solutions / rel).exists():
                shutil.copymode(solutions / rel, target)
        else:
            target.unlink()
    return changed
