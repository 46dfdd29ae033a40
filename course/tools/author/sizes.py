"""python -m course sizes: how long each solution is, and how much each lesson changes.

    python -m course sizes            # the table, and whether the targets hold

A lesson should read like one step of PyTorch's own DDP series: the training
loop, the parallel wrapper, the launch and the lesson's new idea, nothing
else. Three numbers keep that honest:

    code lines   lines that are code: not blank, not a comment, not a docstring
    changed      code lines added plus code lines removed, against the lesson
                 this one builds on (registry.Lesson.builds_on): the diff of the
                 two files' code lines, comments and docstrings left out
    page diff    lines added plus removed in the diff the lesson's page shows
                 (comments and docstrings included; reported, not a target)

The page's diff (docs/hooks/course_site.py) and the page-diff count read the
same lines, `shown()`: the file without its scaffolding (snippet section
markers, solution markers and hints, which the page shows folded in their
own section).
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

from course import REPO_ROOT, registry
from course.tools.author.release import BEGIN, BUG, END, END_BUG, FIX, HINT, HINT_MORE

MAX_CODE_LINES = 150
MAX_CHANGED = 80
MAX_EXERCISE_LINES = 80  # each of a lesson of small exercises (09)
SMALL_EXERCISES = ("09",)  # lessons of several small scripts; 10's two files are full lessons
SECTION_MARKER = re.compile(r"#\s*--8<--\s*\[(start|end):[\w-]+\]")


def shown(text: str) -> list[str]:
    """The lines a page shows of a source file: no section or solution markers, no hints,
    and of a planted bug's block (lesson 09) only the fix."""
    out: list[str] = []
    in_hint = broken = False
    for line in text.splitlines(keepends=True):
        if line.strip() == BUG:
            broken = True
            continue
        if broken or line.strip() in (FIX, END_BUG):
            broken = broken and line.strip() != FIX
            continue
        if HINT.match(line):
            in_hint = True
            continue
        if in_hint and HINT_MORE.match(line):
            continue
        in_hint = False
        if SECTION_MARKER.search(line) or line.strip() in (BEGIN, END):
            continue
        if not line.strip() and len(out) >= 2 and not out[-1].strip() and not out[-2].strip():
            continue  # a removed marker leaves blank lines behind: at most two in a row
        out.append(line)
    return out


def diff(old: str, new: str, old_name: str = "old", new_name: str = "new") -> list[str]:
    """The unified diff of the shown lines of two sources."""
    return list(difflib.unified_diff(shown(old), shown(new), old_name, new_name, n=3))


def shown_changed(old: str, new: str) -> int:
    """Lines added plus lines removed between the shown lines of two sources."""
    body = diff(old, new)[2:]  # past the ---/+++ header
    return sum(1 for line in body if line[:1] in "+-")


def changed(old: str, new: str) -> int:
    """Code lines added plus code lines removed between two sources."""
    body = list(difflib.unified_diff(code(old), code(new), n=0, lineterm=""))[2:]
    return sum(1 for line in body if line[:1] in "+-" and not line.startswith("@@"))


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def code(text: str) -> list[str]:
    """The code lines of a source, in order, each without its trailing comment."""
    skip = _docstring_lines(ast.parse(text))
    noise = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    noise |= {tokenize.ENCODING, tokenize.ENDMARKER}
    lines: set[int] = set()
    comment_at: dict[int, int] = {}
    for tok in tokenize.tokenize(io.BytesIO(text.encode()).readline):
        if tok.type == tokenize.COMMENT:
            comment_at[tok.start[0]] = tok.start[1]
        if tok.type in noise:
            continue
        lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in skip)
    source = text.splitlines()
    return [source[n - 1][: comment_at.get(n)].rstrip() for n in sorted(lines)]


def code_lines(text: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    return len(code(text))


@dataclass
class Row:
    lesson: str
    path: str
    lines: int
    code: int
    builds_on: str | None
    changed: int | None
    page_diff: int | None
    limit: int = MAX_CODE_LINES

    @property
    def ok(self) -> bool:
        return self.code <= self.limit and (self.changed is None or self.changed <= MAX_CHANGED)


def measure(impl: Path = REPO_ROOT / "solutions") -> list[Row]:
    """One row per training lesson that has a script under `impl` (lesson 00 is no lesson step)."""
    rows = []
    for lesson in registry.LESSONS:
        path = lesson.path(impl)
        if lesson.number == "00" or not path.is_file():
            continue
        if lesson.exercises:  # small scripts of their own, each held to the exercise limit
            for name in lesson.exercises:
                text = (path.parent / name).read_text(encoding="utf-8")
                rel = f"{lesson.slug}/{name}"
                count, code = len(text.splitlines()), code_lines(text)
                limit = MAX_EXERCISE_LINES if lesson.number in SMALL_EXERCISES else MAX_CODE_LINES
                rows.append(Row(lesson.number, rel, count, code, None, None, None, limit))
            continue
        text = path.read_text(encoding="utf-8")
        before = page = None
        if lesson.builds_on:
            old = registry.get(lesson.builds_on).path(impl).read_text("utf-8")
            before, page = changed(old, text), shown_changed(old, text)
        rel, lines = str(path.relative_to(impl)), len(text.splitlines())
        rows.append(
            Row(lesson.number, rel, lines, code_lines(text), lesson.builds_on, before, page)
        )
    return rows


def table(rows: list[Row]) -> str:
    head = f"{'lesson':<7}{'file':<30}{'lines':>6}{'code lines':>11}{'vs':>4}"
    out = [f"{head}{'changed':>9}{'page diff':>11}"]
    for r in rows:
        vs, changes, page = (r.builds_on, r.changed, r.page_diff) if r.builds_on else "---"
        flag = "" if r.ok else "   over the target"
        line = f"{r.lesson:<7}{r.path:<30}{r.lines:>6}{r.code:>11}{vs:>4}{changes:>9}{page:>11}"
        out.append(line + flag)
    out.append(
        f"targets: at most {MAX_CODE_LINES} code lines and {MAX_CHANGED} changed code lines "
        f"(added + removed) a lesson; {MAX_EXERCISE_LINES} code lines an exercise of lesson 09"
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m course sizes", description=__doc__.splitlines()[0])
    p.add_argument(
        "--impl",
        default="solutions",
        type=registry.impl_argument,
        help="solutions (default), lessons or a folder",
    )
    args = p.parse_args(argv)
    rows = measure(args.impl)
    print(table(rows))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
