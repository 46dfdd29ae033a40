"""Import a lesson file from any submission folder, turning every way it can
be broken into one line that says what is wrong."""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType


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


def load(path: Path, *, requires: tuple[str, ...] = ()) -> ModuleType:
    path = Path(path)
    check_script(path)
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
