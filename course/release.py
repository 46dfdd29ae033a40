"""Make the student starters in lessons/ from the reference solutions.

Like nbgrader's release step: each solution marks the code a student writes
between `### BEGIN SOLUTION` and `### END SOLUTION`. The starter keeps
everything else (the TODO comments and hints above a block, the snippet
sections the site includes) and puts a `raise NotImplementedError` where the
block was, so an unsolved starter fails loudly at the exact line, and never
passes a test by doing nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from course import REPO_ROOT

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints"}


class ReleaseError(ValueError):
    pass


def make_starter(source: str, name: str) -> str:
    """The starter text for one solution file; `name` is used in messages."""
    out: list[str] = []
    inside_from: int | None = None
    for number, line in enumerate(source.splitlines(keepends=True), start=1):
        marker = line.strip()
        if marker == BEGIN:
            if inside_from is not None:
                raise ReleaseError(
                    f"{name}:{number}: {BEGIN} inside the block opened at line {inside_from}"
                )
            inside_from = number
            indent = line[: len(line) - len(line.lstrip())]
            where = f"{name}:{len(out) + 1}"
            out.append(f'{indent}raise NotImplementedError("TODO at {where} is not done yet")\n')
        elif marker == END:
            if inside_from is None:
                raise ReleaseError(f"{name}:{number}: {END} without a {BEGIN}")
            inside_from = None
        elif inside_from is None:
            out.append(line)
    if inside_from is not None:
        raise ReleaseError(f"{name}:{inside_from}: {BEGIN} is never closed")
    return "".join(out)


def _source_files(solutions: Path):
    for path in sorted(solutions.rglob("*")):
        if path.is_file() and not SKIP_DIRS.intersection(path.relative_to(solutions).parts):
            yield path


def plan(solutions: Path = REPO_ROOT / "solutions", lessons: Path = REPO_ROOT / "lessons"):
    """What lessons/ should hold: {relative path: bytes}."""
    wanted: dict[Path, bytes] = {}
    for path in _source_files(solutions):
        rel = path.relative_to(solutions)
        if path.suffix == ".py":
            text = make_starter(path.read_text(), rel.as_posix())
            wanted[rel] = text.encode()
        else:
            wanted[rel] = path.read_bytes()
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
            shutil.copymode(solutions / rel, target)
        else:
            target.unlink()
    return changed
