"""Progressive hints: `python -m course hint NN [K]`.

A TODO in a lesson says what to achieve and why; how, with which PyTorch
call, comes in hints, from the general idea (hint 1) to nearly the code (the
last). `course release` collects them from the solutions' `# HINT n:`
comments into lessons/<lesson>/hints.json, next to the starter, so they ship
without the solutions; the lesson's page shows the same hints, folded.

`hint NN K` finds the first TODO still unsolved in your file (its `raise
NotImplementedError("TODO at ...")` is still there) and prints its goal and
hint K.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

from course import REPO_ROOT, lessons
from course.tools.release import HINTS_FILE

RAISED = re.compile(r'raise NotImplementedError\("(TODO at [^"]+?) is not done yet"\)')


def todos(lesson: lessons.Lesson) -> list[dict]:
    """The lesson's TODOs, in file order: [{"id", "goal", "hints"}]."""
    path = lesson.path(REPO_ROOT / "lessons").parent / HINTS_FILE
    if not path.is_file():
        return []
    found = json.loads(path.read_text())["todos"]
    if lesson.exercises:  # in the order the lesson takes its exercises, not the files'

        def order(todo):
            name = todo["id"].removeprefix("TODO at ").rsplit(":", 1)[0].rsplit("/", 1)[-1]
            return lesson.exercises.index(name) if name in lesson.exercises else len(found)

        found.sort(key=order)  # stable: file order within one exercise
    return found


def unsolved(lesson: lessons.Lesson, impl: Path) -> list[str]:
    """Ids of the TODOs still unsolved in the files under `impl`: the `raise
    NotImplementedError` is still there or, for a planted bug (lesson 09), every
    broken line still is."""
    script = lesson.path(impl)
    if not script.is_file():
        raise FileNotFoundError(f"{script}: no such file")
    left = []
    for todo in todos(lesson):
        rel = todo["id"].removeprefix("TODO at ").rsplit(":", 1)[0]
        path = Path(impl) / rel
        text = path.read_text() if path.is_file() else ""
        if todo.get("bug"):
            code = {line.strip() for line in text.splitlines()}
            if all(line in code for line in todo["bug"]):
                left.append(todo["id"])
        elif todo["id"] in RAISED.findall(text):
            left.append(todo["id"])
    return left


def hint(lesson: lessons.Lesson, number: int, impl: Path) -> str:
    """What `python -m course hint` prints for hint `number` (1-based)."""
    known = todos(lesson)
    if not known:
        return f"lesson {lesson.number} has no TODOs: nothing to hint"
    left = unsolved(lesson, impl)
    todo = next((t for t in known if t["id"] in left), None)
    if todo is None:
        return (
            f"every TODO of lesson {lesson.number} is done in {lesson.path(impl)}; "
            f"check it with `python -m course grade {lesson.number}`"
        )
    where = todo["id"].removeprefix("TODO at ")
    done = len(known) - len(left)
    lines = [f"lesson {lesson.number}, TODO {done + 1} of {len(known)} ({where}):", todo["goal"]]
    hints = todo["hints"]
    if not hints:
        lines.append("(this TODO has no hints beyond its text)")
    elif number > len(hints):
        lines.append(f"(this TODO has {len(hints)} hint(s); this is the last)")
        lines.append(f"hint {len(hints)}: {hints[-1]}")
    else:
        lines.append(f"hint {number} of {len(hints)}: {hints[number - 1]}")
        if number < len(hints):
            lines.append(f"more: python -m course hint {lesson.number} {number + 1}")
    return "\n".join(textwrap.fill(line, 88, subsequent_indent="  ") for line in lines)
