"""The grader: a pytest plugin (loaded with `-p course.grader.plugin`), the hooks that wire
the grader's parts into pytest.

It adds
  --impl lessons|solutions|PATH   which implementation the lesson tests grade
  --grade-json PATH              a results file in Gradescope's results.json shape
and prints, at the end of the run, a table of points per lesson. The parts:
  gradebook   points, the table, the results file (registered in the controller only)
  imports     each lesson file imported in a child before its first test: a file that
              hangs or fails at import fails its tests at once (the Cancel they run under)
  launches    the launches a lesson's tests share, and the -n scheduling by file
  case_runs   a lesson's functions called in a child by its case script
  rules       what a test is worth and what its markers mean

Integrity (docs/threat-model.md): this process never imports a submission;
student code runs only in child processes (course/grader/case_runs.py, course/launch/),
and a test fails if a submission's module ever turns up in sys.modules here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from course import launch, registry
from course.grader import launches, rules
from course.grader.gradebook import GradeBook
from course.grader.imports import IMPORT_DEADLINE_S, exercises_of, import_check_for
from course.grader.rules import LESSON_PROPERTY, MARKERS_PROPERTY, POINTS_PROPERTY, lesson_of
from course.launch.warm import pool  # noqa: F401 - a grading's launches start warm
from course.measure import draws

# The fixtures and markers of the lesson tests (impl, backend, launcher, run_script).
pytest_plugins = ("course.grader.fixtures",)


def pytest_addoption(parser):
    group = parser.getgroup("course", "course grader")
    group.addoption(
        "--impl",
        default="solutions",
        help="what to grade: lessons (the starters, or your work in them), solutions "
        "(the reference, the default for the test suite) or a folder laid out like lessons/",
    )
    group.addoption("--grade-json", default=None, metavar="PATH", help="write results.json here")
    group.addoption(
        "--import-deadline",
        type=float,
        default=IMPORT_DEADLINE_S,
        metavar="SECONDS",
        help="how long importing one lesson file may take before its tests fail without "
        f"running (default {IMPORT_DEADLINE_S} s; stretched by COURSE_TIMEOUT_SCALE)",
    )


def pytest_configure(config):
    try:
        config.course_impl = registry.impl_folder(config.getoption("impl"))
    except FileNotFoundError as err:
        raise pytest.UsageError(str(err)) from None
    launch.become_subreaper()  # orphans of the children come back to us, to be killed
    # Set here, in the controller, before xdist starts its workers: they and every child
    # draw the same configurations (course/measure/draws.py).
    config.course_seed = draws.choose_seed()
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller keeps the grade
    config.pluginmanager.register(GradeBook(config), "course-gradebook")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """With -n N: a test file's tests go to one worker together, in the items' order
    (course/grader/launches.py; tests/conftest.py refines it for the course's own suite)."""
    if config.getvalue("dist") != "load":
        return None  # the caller asked for another scheme: keep it
    return launches.file_scheduling(config, log)


# --- a submission that hangs or fails at import: its tests fail at once (imports.py) ---

_CANCEL = pytest.StashKey()  # each test's Cancel


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    check = import_check_for(item)
    item.stash[_CANCEL] = check.cancel_for(exercises_of(item)) if check is not None else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    # After setup, so that a test the machine cannot run (no GPUs) is still skipped.
    cancel = item.stash.get(_CANCEL, None)
    if cancel is not None and cancel.event.is_set():
        pytest.fail(cancel.reason, pytrace=False)


def _scale_pytest_timeouts(config, items) -> None:
    """pytest-timeout's limits (its `timeout` setting, @pytest.mark.timeout) stretch with
    COURSE_TIMEOUT_SCALE, as every launch's deadline does (course/launch/): on a slow
    machine a test would otherwise be killed by pytest-timeout while its launches,
    already scaled, are still within theirs."""
    scale = launch.timeout_scale()
    if scale == 1 or not hasattr(config, "_env_timeout"):  # no pytest-timeout: nothing to do
        return
    if config._env_timeout:
        config._env_timeout *= scale
    for item in items:
        marker = item.get_closest_marker("timeout")
        if marker is not None and marker.args and isinstance(marker.args[0], int | float):
            item.add_marker(pytest.mark.timeout(marker.args[0] * scale), append=False)


def pytest_collection_modifyitems(config, items):
    _scale_pytest_timeouts(config, items)
    for item in items:
        # For `python -m course durations`: each test's markers, in the JUnit file.
        item.user_properties.append((MARKERS_PROPERTY, ",".join(rules.reported_markers(item))))
        points = rules.points_of(item)
        if points is None:
            continue
        # user_properties travel with the reports from xdist workers.
        item.user_properties.append((LESSON_PROPERTY, lesson_of(item.path) or "--"))
        item.user_properties.append((POINTS_PROPERTY, points))


_checked: set[str] = set()  # modules already known not to be the submission's


def submission_modules(impl: Path) -> list[str]:
    """Modules loaded in this process from files under `impl` (there must be none)."""
    root = os.path.realpath(impl) + os.sep
    found = []
    for name, module in list(sys.modules.items()):
        if name in _checked:
            continue
        file = getattr(module, "__file__", None)
        if file and os.path.realpath(file).startswith(root):
            found.append(name)
        else:
            _checked.add(name)
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    impl = item.config.course_impl
    if call.when == "call" and submission_modules(impl):
        report.outcome = "failed"
        report.longrepr = (
            f"the grading process imported the submission ({submission_modules(impl)}): "
            "a test must call student code in a child process (course/grader/case_runs.py)"
        )
        return
    # A file known broken: the same one line for every test that reads it.
    cancel = item.stash.get(_CANCEL, None)
    if report.failed and cancel is not None and cancel.event.is_set():
        report.longrepr = cancel.reason
        return
    # An unsolved TODO is not a bug to debug: say which TODO in one line.
    if call.excinfo is not None and call.excinfo.errisinstance(NotImplementedError):
        report.longrepr = f"NotImplementedError: {call.excinfo.value}"
        return
    # A failed check: its message (what was expected, what was seen, the likely cause)
    # first, then where the grader checked it, for whoever wants the source.
    if report.failed and call.excinfo is not None and call.excinfo.errisinstance(AssertionError):
        message = str(call.excinfo.value).strip()
        if message:
            where = f"--- where the grader checked it ---\n{report.longreprtext}"
            report.longrepr = f"{message}\n\n{where}"
