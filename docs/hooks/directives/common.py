"""What the directives share: the repository's root, the lesson registry, records and hints."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

from course.tools.author import figures, record
from course.tools.student import hints

# The repository: docs/hooks/directives/ is three folders down.
ROOT = Path(__file__).resolve().parents[3]


_loaded_mtime: dict[str, float] = {}


def load_lessons():
    """The lesson registry, imported again only when its file changed, so that `mkdocs serve`
    sees edits. A reload makes new classes (UnknownLesson among them), so a process that
    caught the old ones, a test session that builds the site, must not get one for nothing."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        module = importlib.import_module("course.registry")
    except ImportError as exc:
        raise PluginError(f"lesson registry course.registry cannot be imported: {exc}") from exc
    mtime = Path(module.__file__).stat().st_mtime
    if _loaded_mtime.setdefault(module.__file__, mtime) != mtime:
        _loaded_mtime[module.__file__] = mtime
        module = importlib.reload(module)
    return module.LESSONS


def lesson_page(lesson) -> Path:
    return ROOT / "docs" / "lessons" / f"{lesson.slug}.md"


def run_command(lesson) -> str:
    """What a page's "Run it" shows: the student's own file, started as the lesson's page
    says (python -m course run asks course.registry.command for it)."""
    return f"python -m course run {lesson.number}"


def known_figure(path: Path, root: Path = ROOT) -> None:
    """A page renders only figures that `python -m course figures` knows how to make again."""
    load_lessons()  # puts the repository on sys.path
    try:
        figures.recipe(path, root)
    except figures.UnknownFigure as exc:
        raise PluginError(f"{exc}: `python -m course figures` cannot make it again") from exc


def read_record(name: str) -> dict:
    """A `python -m course record` record, read by course.tools.author.record itself."""
    load_lessons()  # puts the repository on sys.path
    known_figure(ROOT / "docs" / "results" / "outputs" / f"{name}.json")
    try:
        return record.load(name)
    except FileNotFoundError as exc:
        raise PluginError(str(exc)) from exc


def lesson_todos(where: str, number: str) -> list[dict]:
    """Lesson NN's TODOs and hints, as `python -m course hint` reads them
    (course.tools.student.hints)."""
    lessons = {lesson.number: lesson for lesson in load_lessons()}
    if number not in lessons:
        raise PluginError(f"{where}: lesson {number!r} is not in course.registry.LESSONS")
    todos = hints.todos(lessons[number])
    if not todos:
        raise PluginError(f"{where}: lesson {number} has no hints.json (run course release)")
    return todos
