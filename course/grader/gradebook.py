"""The grade book: each test's points and status, the table of points per lesson printed
at the end of the run, and the results file in Gradescope's results.json shape
(--grade-json). The grader's plugin (course/grader/plugin.py) registers it in the
controller only (an xdist worker's results reach it as reports).

Points: a test in tests/lessons/test_NN_*.py grades lesson NN and is worth
@pytest.mark.points(n) (1 by default; course/grader/rules.py). A test earns its points
only if every phase of it passed; an error in a fixture, a timeout or a crashed worker is
a failure worth 0. Skipped tests (the nccl variants on a machine without enough GPUs)
count neither way, and the table says how many were skipped.

The results file is written by this process alone: a zero-score file when the session
starts (a killed grading leaves no stale score), and the real one last, after every
process the children started, even those that left their process group, has been killed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import course
from course import atomic, launch, registry
from course.grader.rules import LESSON_PROPERTY, POINTS_PROPERTY, lesson_of
from course.launch.warm import pool
from course.measure import draws

NOT_FINISHED = "did not finish: the test process crashed or was stopped"


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
                i.nodeid: dict(i.user_properties)[POINTS_PROPERTY]
                for i in items
                if POINTS_PROPERTY in dict(i.user_properties)
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
        if POINTS_PROPERTY in props:
            self.points[report.nodeid] = props[POINTS_PROPERTY]
        entry = self._entry(report.nodeid)
        if entry is None:
            return
        entry["lesson"] = props.get(LESSON_PROPERTY, entry["lesson"])
        entry["max_score"] = self.points.get(report.nodeid, entry["max_score"])
        entry["phases"][report.when] = report.outcome
        if report.failed:
            entry["output"] = report.longreprtext[:4000]  # the message first (plugin.py)
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
            "course_version": course.__version__,
            "grading_seed": draws.grade_seed(),
            "tests": tests,
        }
        atomic.write_json(results, self.path)  # a crash mid-write leaves the last version

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_sessionfinish(self, session):
        yield  # after every other plugin's session end (xdist stops its workers there)
        # Nothing a submission started may outlive the grading and touch the file.
        pool.stop_zygotes()  # course/launch/warm/: they end their children themselves
        launch.kill_descendants()
        if self.path:
            self.write()

    def pytest_terminal_summary(self, terminalreporter):
        rows = self.rows()
        if not rows:
            return
        tr = terminalreporter
        tr.section(f"grade of {self.impl}")
        titles = {lesson.number: lesson.title for lesson in registry.LESSONS}
        wide = max(len(titles.get(number, "?")) for number in rows) + 2  # whole titles
        tr.write_line(
            f"{'lesson':<8}{'title':<{wide}}{'points':>8}{'passed':>8}{'failed':>8}{'skipped':>9}"
        )
        for number, r in rows.items():
            points = f"{_fmt(r['earned'])}/{_fmt(r['possible'])}"
            tr.write_line(
                f"{number:<8}{titles.get(number, '?'):<{wide}}{points:>8}"
                f"{r['passed']:>8}{r['failed']:>8}{r['skipped']:>9}"
            )
        earned = sum(r["earned"] for r in rows.values())
        possible = sum(r["possible"] for r in rows.values())
        tr.write_line(f"{'total':<{8 + wide}}{_fmt(earned) + '/' + _fmt(possible):>8}")
        seed = draws.grade_seed()
        tr.write_line(f"grading seed {seed}: {draws.SEED_ENV}={seed} replays these configurations")
        if self.path:
            tr.write_line(f"results written to {self.path}")


def _fmt(x: float) -> str:
    return f"{x:g}"


def _skip_reason(report) -> str:
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        return str(report.longrepr[2])
    return ""
