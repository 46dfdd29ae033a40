"""The course's known mistakes and honest rewrites, as data: tests/mutants/lesson_NN.py.

Each mutant is a mistake a student makes, written into a copy of the reference solution
(`old` becomes `new`; `also` lists more edits of the same submission); `caught_by` names
the tests that must reject it, as a pytest -k expression of words joined by " or ". Each
alternative is a correct solution written differently. tests/mutants/test_mutants.py grades them
all; `python -m course tolerances --mistakes` measures how far each mutant lands from the
bounds the tests that catch it declare.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from course import REPO_ROOT

MUTANT_DIR = REPO_ROOT / "tests" / "mutants"


def load(path: Path):
    """One lesson's module of cases (FILE, MUTANTS, ALTERNATIVES)."""
    spec = importlib.util.spec_from_file_location(f"mutants_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cases(kind: str, folder: Path = MUTANT_DIR):
    """(lesson number, file, case) for every case of `kind`: "MUTANTS" or "ALTERNATIVES"."""
    for path in sorted(folder.glob("lesson_*.py")):
        module = load(path)
        number = path.stem.removeprefix("lesson_")
        for case in getattr(module, kind):
            yield number, case.get("file", module.FILE), case  # 09 has several files


def selects(caught_by: str, test_name: str) -> bool:
    """Whether `caught_by` (words joined by " or ", as -k reads them) picks this test."""
    return any(word.strip() in test_name for word in caught_by.split(" or "))


def apply(dest: Path, file: str, case: dict, root: Path = REPO_ROOT) -> Path:
    """A copy of the solution's lesson folder under `dest` with `case` written into it;
    returns the folder to grade (--impl)."""
    impl = dest / "impl"
    folder = Path(file).parent
    shutil.copytree(root / "solutions" / folder, impl / folder)
    target = impl / file
    source = target.read_text()
    for edit in [case, *case.get("also", ())]:
        if "file" in edit and impl / edit["file"] != target:  # an edit of another file
            target.write_text(source)
            target = impl / edit["file"]
            source = target.read_text()
        if source.count(edit["old"]) != 1:
            raise ValueError(f"{case['name']}: `old` must occur once in {target.name}")
        source = source.replace(edit["old"], edit["new"])
    target.write_text(source)
    return impl
