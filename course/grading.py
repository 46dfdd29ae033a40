"""The grader: a pytest plugin (loaded with `-p course.grading`).

It adds
  --impl lessons|solutions|PATH   which implementation the lesson tests grade
  --grade-json PATH              a results file in Gradescope's results.json shape
and prints, at the end of the run, a table of points per lesson.

Points: a test in tests/test_NN_*.py grades lesson NN and is worth
@pytest.mark.points(n) (1 by default). A test earns its points only if every
phase of it passed; an error in a fixture, a timeout or a crashed worker is a
failure worth 0. Skipped tests (the nccl variants on a machine without enough
GPUs) count neither way, and the table says how many were skipped.

Integrity (docs/threat-model.md): this process never imports a submission;
student code runs only in child processes (course/calls.py, course/procs.py),
and a test fails if a submission's module ever turns up in sys.modules here.
The results file is written by this process alone: a zero-score file when the
session starts (a killed grading leaves no stale score), and the real one
last, after every process the children started, even those that left their
process group, has been killed.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

from course import calls, procs
from course import lessons as registry
from course.files import write_json_atomic

LESSON_FILE = re.compile(r"test_(\d\d)_")
NOT_FINISHED = "did not finish: the test process crashed or was stopped"


def pytest_addoption(parser):
    group = parser.getgroup("course", "course grader")
    group.addoption(
        "--impl",
        default="solutions",
        help="what to grade: lessons (the starters, or your work in them), solutions "
        "(the reference, the default for the test suite) or a folder laid out like lessons/",
    )
    group.addoption("--grade-json", default=None, metavar="PATH", help="write results.json here")


def pytest_configure(config):
    try:
        config.course_impl = registry.resolve_impl(config.getoption("impl"))
    except FileNotFoundError as err:
        raise pytest.UsageError(str(err)) from None
    procs.become_subreaper()  # orphans of the children come back to us, to be killed
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller keeps the grade
    config.pluginmanager.register(GradeBook(config), "course-gradebook")


class LessonCalls:
    """A lesson's functions as called in a child process by its case script
    (course/calls.py): `calls("case")` is the value the case returned, and a
    case that raised fails the test with one line saying what and where."""

    def __init__(self, outcome: calls.Outcome):
        self.outcome = outcome

    def _get(self, method, name):
        try:
            return method(name)
        except calls.CaseFailed as err:
            message = str(err)
        pytest.fail(message, pytrace=False)  # outside `except`: no chained traceback

    def __call__(self, name: str):
        return self._get(self.outcome.value, name)

    def tensors(self, name: str) -> dict:
        return self._get(self.outcome.tensors, name)


def call_lesson(impl, lesson: registry.Lesson, cases: Path, folder: Path) -> LessonCalls:
    """Run the case script `cases` on the lesson file of `impl` in a child, in `folder`.

    The grading process never imports the submission (see course/calls.py)."""
    return LessonCalls(calls.run_cases(cases, lesson.path(impl), folder))


def lesson_of(path: Path) -> str | None:
    match = LESSON_FILE.match(Path(path).name)
    return match.group(1) if match else None


def pytest_collection_modifyitems(config, items):
    for item in items:
        lesson = lesson_of(item.path)
        marker = item.get_closest_marker("points")
        if lesson is None and marker is None:
            continue
        points = float(marker.args[0]) if marker else 1.0
        # user_properties travel with the reports from xdist workers.
        item.user_properties.append(("course_lesson", lesson or "--"))
        item.user_properties.append(("course_points", points))


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
            "a test must call student code in a child process (course/calls.py)"
        )
        return
    # An unsolved TODO is not a bug to debug: say which TODO in one line.
    if call.excinfo is not None and call.excinfo.errisinstance(NotImplementedError):
        report.longrepr = f"NotImplementedError: {call.excinfo.value}"


class GradeBook:
    def __init__(self, config):
        self.config = config
        self.impl = config.course_impl
        self.path = config.getoption("grade_json")
        self.started = time.time()
        self.tests: dict[str, dict] = {}
        self.points: dict[str, float] = {}
        if self.path:
            self.write()  # all zero until the end: a killed grading leaves no stale score

    # --- collecting results -------------------------------------------------
    def pytest_collection_modifyitems(self, items):
        # Without xdist the controller collects too, so it knows each test's
        # worth before the test starts (and before it can crash).
        self.points.update(
            {
                i.nodeid: dict(i.user_properties)["course_points"]
                for i in items
                if "course_points" in dict(i.user_properties)
            }
        )

    def _entry(self, nodeid: str) -> dict | None:
        if nodeid not in self.tests:
            lesson = lesson_of(Path(nodeid.split("::")[0]))
            if lesson is None and nodeid not in self.points:
                return None
            # Failed until its reports say otherwise: a crash or a killed run
            # leaves a 0 in the file, never a pass.
            self.tests[nodeid] = {
                "name": nodeid,
                "lesson": lesson or "--",
                "max_score": self.points.get(nodeid, 1.0),
                "status": "failed",
                "output": NOT_FINISHED,
                "phases": {},
            }
        return self.tests[nodeid]

    def pytest_runtest_logstart(self, nodeid, location):
        self._entry(nodeid)

    def pytest_runtest_logreport(self, report):
        props = dict(report.user_properties)
        if "course_points" in props:
            self.points[report.nodeid] = props["course_points"]
        entry = self._entry(report.nodeid)
        if entry is None:
            return
        entry["lesson"] = props.get("course_lesson", entry["lesson"])
        entry["max_score"] = self.points.get(report.nodeid, entry["max_score"])
        entry["phases"][report.when] = report.outcome
        if report.failed:
            entry["output"] = report.longreprtext[-4000:]
        phases = entry["phases"]
        if "failed" in phases.values():
            entry["status"] = "failed"
        elif "skipped" in (phases.get("setup"), phases.get("call")):
            entry["status"] = "skipped"
            entry["output"] = _skip_reason(report) or entry["output"]
        elif phases.get("call") == "passed":
            entry["status"] = "passed"
            entry["output"] = ""

    # --- reporting ----------------------------------------------------------
    def graded(self):
        return list(self.tests.values())

    def rows(self):
        by_lesson: dict[str, dict] = {}
        for test in self.graded():
            row = by_lesson.setdefault(
                test["lesson"],
                {"earned": 0.0, "possible": 0.0, "passed": 0, "failed": 0, "skipped": 0},
            )
            row[test["status"]] += 1
            if test["status"] != "skipped":
                row["possible"] += test["max_score"]
                row["earned"] += test["max_score"] if test["status"] == "passed" else 0.0
        return dict(sorted(by_lesson.items()))

    def write(self):
        tests = []
        for test in self.graded():
            score = test["max_score"] if test["status"] == "passed" else 0.0
            tests.append(
                {
                    "name": test["name"],
                    "number": test["lesson"],
                    "score": score,
                    "max_score": 0.0 if test["status"] == "skipped" else test["max_score"],
                    "status": test["status"],
                    "output": test.get("output", ""),
                }
            )
        rows = self.rows()
        results = {
            "score": sum(r["earned"] for r in rows.values()),
            "max_score": sum(r["possible"] for r in rows.values()),
            "execution_time": round(time.time() - self.started, 2),
            "impl": str(self.impl),
            "tests": tests,
        }
        write_json_atomic(results, self.path)  # a crash mid-write leaves the last version

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_sessionfinish(self, session):
        yield  # after every other plugin's session end (xdist stops its workers there)
        # Nothing a submission started may outlive the grading and touch the file.
        procs.kill_descendants()
        if self.path:
            self.write()

    def pytest_terminal_summary(self, terminalreporter):
        rows = self.rows()
        if not rows:
            return
        tr = terminalreporter
        tr.section(f"grade of {self.impl}")
        titles = {lesson.number: lesson.title for lesson in registry.LESSONS}
        tr.write_line(
            f"{'lesson':<8}{'title':<28}{'points':>12}{'passed':>8}{'failed':>8}{'skipped':>9}"
        )
        for number, r in rows.items():
            points = f"{_fmt(r['earned'])}/{_fmt(r['possible'])}"
            tr.write_line(
                f"{number:<8}{titles.get(number, '?')[:27]:<28}{points:>12}"
                f"{r['passed']:>8}{r['failed']:>8}{r['skipped']:>9}"
            )
        earned = sum(r["earned"] for r in rows.values())
        possible = sum(r["possible"] for r in rows.values())
        tr.write_line(f"{'total':<36}{_fmt(earned) + '/' + _fmt(possible):>12}")
        if self.path:
            tr.write_line(f"results written to {self.path}")


def _fmt(x: float) -> str:
    return f"{x:g}"


def _skip_reason(report) -> str:
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        return str(report.longrepr[2])
    return ""
