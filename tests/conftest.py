"""The course's own suite (the lesson tests' fixtures are the grader's:
course/grader/fixtures.py).

- `course_without_solutions`: a copy of the course as a class deploys it, with
  no solutions/ folder, to grade from.

And the schedule of the course's own suite with `-n N` (the grader's plugin sends a test
file's tests to one worker, in the items' order: course/grader/launches.py): the slowest
files first (SLOWEST), the files of SPREAD test by test and last, the files of TOGETHER
on one worker.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from course import REPO_ROOT
from course.grader import launches

# What a class deployment ships: the course, its tests and the starters, no solutions/.
DEPLOYED = ("course", "tests", "lessons", "pyproject.toml")


def copy_course(into: Path) -> Path:
    """A copy of the course without solutions/ (the grader must never need it)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in DEPLOYED:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=ignore)
        else:
            shutil.copy2(source, into / name)
    assert not (into / "solutions").exists()
    return into


@pytest.fixture(scope="session")
def course_without_solutions(tmp_path_factory) -> Path:
    return copy_course(tmp_path_factory.mktemp("deployed") / "course")


# --- the schedule of the course's own suite with -n N ---------------------------------

# Files of independent gradings, one test each: spread test by test, as xdist's default
# `load` does, and run last: small pieces that fill both workers to the end.
SPREAD = ("test_mutants.py", "test_plugin.py")
TOGETHER = {"test_site.py": "site", "test_browser.py": "site"}  # one worker, one site build

# Seconds of the slowest files in `pytest -m "not mutation" -n 2` on two idle cores
# (2026-12-04, `python -m course durations`; test_site.py's share counts with the browser's).
# Sent first, they no longer start last and leave one worker alone at the end: xdist's
# own order, by number of tests, put the 40 s planted hang (two tests) near the end.
SLOWEST = {
    "test_recorded_outputs.py": 111, "test_browser.py": 104, "test_site.py": 104,
    "test_bench.py": 45, "test_hangs.py": 40, "test_warm.py": 26,
    "test_notebooks.py": 22, "test_09_debugging.py": 20, "test_autograder.py": 19,
    "test_04_torchrun.py": 18, "test_grade_class.py": 17, "test_command.py": 16,
}  # fmt: skip


def in_schedule_order(items: list) -> None:
    """Sort the items (stable): SPREAD's last, the SLOWEST files' first, the rest as
    collected."""
    items.sort(key=lambda item: (item.path.name in SPREAD, -SLOWEST.get(item.path.name, 0)))


def pytest_collection_modifyitems(items):
    in_schedule_order(items)


def _scope(nodeid: str, file: str) -> str:
    """A test's scheduling scope: its own for SPREAD's files, the group's name for
    TOGETHER's, else its file's."""
    name = Path(file).name
    if name in SPREAD:
        return nodeid
    return TOGETHER.get(name, file)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """The grader's scheduling by file (course/grader/launches.py), with SPREAD's files
    test by test and TOGETHER's on one worker: the site tests and the browser tests read
    one build of the site (tests/site/_sitebuild.py)."""
    if config.getvalue("dist") != "load":
        return None  # the caller asked for another scheme: keep it
    return launches.file_scheduling(config, log, scope=_scope)
