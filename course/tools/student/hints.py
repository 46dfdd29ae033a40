"""Progressive hints: `python -m course hint NN [K]`.

A TODO in a lesson says what to achieve and why; how, with which PyTorch
call, comes in hints, from the general idea (hint 1) to nearly the code (the
last). `course release` collects them from the solutions' `# HINT n:`
comments into lessons/<lesson>/hints.json, next to the starter, so they ship
without the solutions; the lesson's page shows the same hints, folded.

`hint NN K` finds the first TODO still unsolved in your files (its `raise
NotImplementedError("TODO at ...")` is still there) and prints its goal and
hint K; `hint NN SCRIPT K` looks only in one script of a lesson that has several,
and the first line says what is left in the others.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

from course import REPO_ROOT, registry
from course.tools.author.release import HINTS_FILE

RAISED = re.compile(r'raise NotImplementedError\("(TODO at [^"]+?) is not done yet"\)')


def todos(lesson: registry.Lesson) -> list[dict]:
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


def script_of(todo: dict) -> str:
    """The file a TODO is in: "fsdp.py" for "TODO at 10_sharding/fsdp.py:56"."""
    return todo["id"].removeprefix("TODO at ").rsplit(":", 1)[0].rsplit("/", 1)[-1]


def unsolved(lesson: registry.Lesson, impl: Path) -> list[str]:
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


def hint(lesson: registry.Lesson, number: int, impl: Path, script: str | None = None) -> str:
    """What `python -m course hint` prints for hint `number` (1-based), of the next
    unsolved TODO in `script` (a lesson's file, "fsdp" or "fsdp.py"), or in any file."""
    known = todos(lesson)
    if not known:
        return f"lesson {lesson.number} has no TODOs: nothing to hint"
    scripts = list(dict.fromkeys(script_of(t) for t in known))
    if script is not None:
        wanted = script if script.endswith(".py") else f"{script}.py"
        if wanted not in scripts:
            raise ValueError(f"lesson {lesson.number} has no TODOs in {wanted}; its scripts "
                             f"with TODOs: {', '.join(scripts)}")  # fmt: skip
        scripts = [wanted, *(s for s in scripts if s != wanted)]
    left = unsolved(lesson, impl)
    todo = next((t for t in known if t["id"] in left and script_of(t) == scripts[0]), None)
    todo = todo if script else next((t for t in known if t["id"] in left), None)
    if todo is None:
        where = scripts[0] if script else "its files"
        return (
            f"every TODO of lesson {lesson.number} is done in {where} "
            f"({lesson.path(impl).parent}); check it with `python -m course grade "
            f"{lesson.number}`"
        )
    where = todo["id"].removeprefix("TODO at ")
    mine = [t for t in known if script_of(t) == script_of(todo)]
    done = len([t for t in mine if t["id"] not in left])
    lines = [f"lesson {lesson.number}, {script_of(todo)}, TODO {done + 1} of {len(mine)} "
             f"({where}):", todo["goal"]]  # fmt: skip
    others = [(s, sum(t["id"] in left for t in known if script_of(t) == s)) for s in scripts]
    others = [f"{s} {n} left" for s, n in others if s != script_of(todo)]
    hints = todo["hints"]
    more = f"{lesson.number} {script_of(todo).removesuffix('.py')}" if script else lesson.number
    if not hints:
        lines.append("(this TODO has no hints beyond its text)")
    elif number > len(hints):
        lines.append(f"(this TODO has {len(hints)} hint(s); this is the last)")
        lines.append(f"hint {len(hints)}: {hints[-1]}")
    else:
        lines.append(f"hint {number} of {len(hints)}: {hints[number - 1]}")
        if number < len(hints):
            lines.append(f"more: python -m course hint {more} {number + 1}")
    if others:
        lines.append(f"other scripts: {', '.join(others)} (python -m course hint "
                     f"{lesson.number} SCRIPT: that script's next TODO)")  # fmt: skip
    return "\n".join(textwrap.fill(line, 88, subsequent_indent="  ") for line in lines)


def parse_which(which: list[str]) -> tuple[str | None, int]:
    """`hint NN [SCRIPT] [N]`'s words after the lesson: (the script or None, the hint)."""
    words = list(which)
    script = words.pop(0) if words and not words[0].lstrip("-").isdigit() else None
    if len(words) > 1 or (words and not words[0].lstrip("-").isdigit()):
        raise ValueError(f"expected [SCRIPT] [N] after the lesson, got {' '.join(which)}")
    number = int(words[0]) if words else 1
    if number < 1:
        raise ValueError("hints are numbered from 1")
    return script, number
