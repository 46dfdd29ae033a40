"""Import a lesson file from any submission folder, turning every way it can
be broken into one line that says what is wrong; and keep what only the grader may use
out of its reach.

The grader's own code (course.grader, and its kit course.measure: the counters, the recorder
and the meter) and everything in
the course's tests/ folder (the grader's models, which compute the answers) are refused to
code in the submission's folder: importing one raises ImportError naming the shortcut. The
case child that runs a submission is a fresh process (course/grader/case_runs.py), not a
fork of the grader, so none of the grader's state is in its memory either.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType

from course import measure

TESTS = Path(__file__).resolve().parents[2] / "tests"
GRADER_ONLY = (__package__, measure.__name__)  # the grader and its measuring kit


class LessonError(Exception):
    """A submission that cannot be graded; the message is one line for the student."""


def check_script(path: Path) -> None:
    """Raise LessonError if `path` is missing or does not parse, before anything runs it."""
    path = Path(path)
    if not path.is_file():
        raise LessonError(f"{path}: file not found (the grader expects the layout of lessons/)")
    try:
        compile(path.read_bytes(), str(path), "exec")
    except SyntaxError as err:
        raise LessonError(
            f"{path}:{err.lineno}: syntax error: {err.msg}; fix it, then run `python {path}`"
        ) from None


class GraderOnly:
    """A meta path finder that refuses the grader's modules to code in `folder`."""

    def __init__(self, folder: Path):
        self.folder = Path(folder).resolve()

    def _importer(self) -> Path | None:
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if not name.startswith("<frozen") and "importlib" not in Path(name).parts:
                return Path(name).resolve() if Path(name).is_file() else None
            frame = frame.f_back
        return None

    def find_spec(self, name, path=None, target=None):
        importer = self._importer()
        if importer is None or not importer.is_relative_to(self.folder):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
        if (
            name in GRADER_ONLY
            or name.startswith(tuple(f"{package}." for package in GRADER_ONLY))
            or (origin is not None and origin.is_relative_to(TESTS))
        ):
            raise ImportError(
                f"{name} is the grader's own code: a submission may not import it (a "
                "shortcut: the grade uses it to check your answers, so compute them yourself)"
            )
        return None


def guard(folder: Path) -> None:
    """Refuse the grader's modules to the code in `folder`, from now on in this process."""
    if not any(isinstance(f, GraderOnly) and f.folder == Path(folder).resolve()
               for f in sys.meta_path):  # fmt: skip
        sys.meta_path.insert(0, GraderOnly(folder))


def load(path: Path, *, requires: tuple[str, ...] = ()) -> ModuleType:
    path = Path(path)
    check_script(path)
    guard(path.parent)
    name = f"course_lesson_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass in the lesson looks its module up there
    # The lesson's own folder first, as when the script is run directly.
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except BaseException as err:  # noqa: BLE001 - any failure at import is the submission's
        frame = traceback.extract_tb(err.__traceback__)[-1]
        raise LessonError(
            f"{path}: importing it raised {type(err).__name__}: {err} "
            f"({Path(frame.filename).name}:{frame.lineno})"
        ) from None
    finally:
        sys.path.remove(str(path.parent))
    missing = [attr for attr in requires if not callable(getattr(module, attr, None))]
    if missing:
        raise LessonError(f"{path}: missing function(s) {', '.join(missing)} (were they renamed?)")
    return module
