"""Fixtures shared by the lesson tests.

- `impl`: the folder being graded (--impl).
- `backend`: a distributed test that asks for it runs twice, with gloo on CPU
  and with nccl on GPUs; the nccl run is skipped unless the machine has the
  GPUs that @pytest.mark.gpus(n) asks for (2 by default).
- `run_script`: run a lesson script in its own process group with a deadline.
- `course_without_solutions`: a copy of the course as a class deploys it, with
  no solutions/ folder, to grade from.

And the schedule of the course's own suite with `-n N` (the grader's plugin sends a test
file's tests to one worker, in the items' order: course/grader/launches.py): the slowest
files first (SLOWEST), the files of SPREAD test by test and last, the files of TOGETHER
on one worker.
"""

from __future__ import annotations

import functools
import shutil
import sys
from pathlib import Path

import pytest

from course import REPO_ROOT
from course.grader import launches, submission


@functools.cache
def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("gpus")
        need = marker.args[0] if marker else 2
        metafunc.parametrize(
            "backend",
            [
                pytest.param("gloo", id="gloo"),
                pytest.param("nccl", id="nccl", marks=pytest.mark.gpus(need)),
            ],
        )


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("gpus")
    if marker is None:
        return
    param = getattr(item, "callspec", None)
    if param is not None and param.params.get("backend") == "gloo":
        return  # the CPU variant of a distributed test needs no GPU
    need, have = marker.args[0], visible_gpus()
    if have < need:
        pytest.skip(f"needs {need} CUDA GPU(s), this machine has {have}")


@pytest.fixture(scope="session")
def impl(pytestconfig):
    return pytestconfig.course_impl


@pytest.fixture
def run_script(tmp_path, launcher):
    """Run `python <script> args...`; fail with each rank's last lines unless asked not to."""

    def run(script, *args, timeout=60, check=True, env=None):
        try:
            submission.check_script(script)  # a missing or unparsable file: one line, no launch
        except submission.LessonError as err:
            pytest.fail(str(err), pytrace=False)
        result = launcher.run(
            [sys.executable, str(script), *map(str, args)],
            timeout=timeout,
            env=env,
            cwd=tmp_path,
            log_dir=tmp_path / "ranks",
        )
        if check and not result.ok:
            pytest.fail(result.describe(), pytrace=False)
        return result

    return run


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
SPREAD = ("test_mutants.py", "test_grader.py")
TOGETHER = {"test_site.py": "site", "test_browser.py": "site"}  # one worker, one site build

# Seconds of the slowest files in `pytest -m "not mutation" -n 2` on two idle cores
# (2026-12-04, `python -m course durations`; test_site.py's share counts with the browser's).
# Sent first, they no longer start last and leave one worker alone at the end: xdist's
# own order, by number of tests, put the 40 s planted hang (two tests) near the end.
SLOWEST = {
    "test_browser.py": 104, "test_site.py": 104, "test_recorded_outputs.py": 63,
    "test_course_bench.py": 45, "test_grader_hangs.py": 40, "test_course_warmstart.py": 26,
    "test_notebooks.py": 22, "test_09_debugging.py": 20, "test_course_autograder.py": 19,
    "test_04_torchrun.py": 18, "test_course_grade_class.py": 17, "test_course_procs.py": 16,
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
    one build of the site (tests/_sitebuild.py)."""
    if config.getvalue("dist") != "load":
        return None  # the caller asked for another scheme: keep it
    return launches.file_scheduling(config, log, scope=_scope)
