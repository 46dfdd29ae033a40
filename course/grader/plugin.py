"""The grader: a pytest plugin (loaded with `-p course.grader.plugin`).

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
student code runs only in child processes (course/grader/calls.py, course/launch/),
and a test fails if a submission's module ever turns up in sys.modules here.
The results file is written by this process alone: a zero-score file when the
session starts (a killed grading leaves no stale score), and the real one
last, after every process the children started, even those that left their
process group, has been killed.

Over 300 lines, on purpose: pytest's hooks of one plugin share its state (the
gradebook, the fail-fast verdicts, the scheduler); the rules they apply live in
course/grader/rules.py.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

import course
from course import atomic, launch
from course import lessons as registry
from course.grader import calls, draws, rules
from course.grader.imports import ImportProbe
from course.grader.rules import LESSON_PROPERTY, MARKERS_PROPERTY, POINTS_PROPERTY, lesson_of
from course.launch.launcher import Launcher

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
    launch.become_subreaper()  # orphans of the children come back to us, to be killed
    # Set here, in the controller, before xdist starts its workers: they and every child
    # draw the same configurations (course/grader/draws.py).
    config.course_seed = draws.choose_seed()
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller keeps the grade
    config.pluginmanager.register(GradeBook(config), "course-gradebook")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """With -n N: a test file's tests go to one worker together. A lesson's tests share
    launches cached in their module, and other files share module fixtures (the site's
    build, the recorded runs): sent to two workers, each would run them. The files of
    SPREAD, whose tests are independent gradings, are spread test by test, as xdist's
    default `load` does, and run last (pytest_collection_modifyitems): small pieces
    that fill both workers to the end. The files of TOGETHER share one worker: the
    site tests and the browser tests read one build of the site (tests/_sitebuild.py).
    Files go out longest first, in the order pytest_collection_modifyitems gives them
    (SLOWEST), not in xdist's order by number of tests."""
    if config.getvalue("dist") != "load":
        return None  # the caller asked for another scheme: keep it
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the items' order is the schedule

    class LessonScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            name = Path(file).name
            if name in SPREAD:
                return nodeid
            return TOGETHER.get(name, file)

    return LessonScheduling(config, log)


class LessonCalls:
    """A lesson's functions as called in a child process by its case script
    (course/grader/calls.py): `calls("case")` is the value the case returned, and a
    case that raised fails the test with one line saying what and where."""

    def __init__(self, outcome: calls.Outcome, lesson_file: Path):
        self.outcome, self.lesson_file = outcome, lesson_file  # the file: to read, not import

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


def call_lesson(
    impl, lesson: registry.Lesson, cases: Path, folder: Path, only=None, script: str = ""
) -> LessonCalls:
    """Run the case script `cases` on the lesson file of `impl` (or on its file `script`,
    for a lesson of several) in a child, in `folder` (only the cases named in `only`, when
    given).

    The grading process never imports the submission (see course/grader/calls.py)."""
    path = lesson.path(impl).with_name(script) if script else lesson.path(impl)
    probe = _probes.get(lesson.number)  # made before the lesson's first test (setup)
    cancel = probe.cancel if probe is not None else None
    return LessonCalls(calls.run_cases(cases, path, folder, only=only, cancel=cancel), path)


# --- a submission that hangs or fails at import: its tests fail at once (imports.py) ---

_probes: dict[str, ImportProbe] = {}
_CANCEL = pytest.StashKey()  # each test's Cancel


def _probe_for(item) -> ImportProbe | None:
    number = lesson_of(item.path)
    if number is None:
        return None
    if number not in _probes:
        try:
            lesson = registry.get(number)
        except LookupError:
            return None
        path = lesson.path(item.config.course_impl)
        if not path.is_file():
            return None  # the tests say so in their own words
        files = [path, *(path.with_name(e) for e in lesson.exercises if e != lesson.script)]
        _probes[number] = ImportProbe(number, files)
    return _probes[number]


def exercises_of(item) -> tuple[str, ...]:
    """The files besides the main one a test reads: @pytest.mark.exercise("hang.py")."""
    marker = item.get_closest_marker("exercise")
    return tuple(marker.args) if marker is not None else ()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    probe = _probe_for(item)
    item.stash[_CANCEL] = probe.cancel_for(exercises_of(item)) if probe is not None else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    # After setup, so that a test the machine cannot run (no GPUs) is still skipped.
    cancel = item.stash.get(_CANCEL, None)
    if cancel is not None and cancel.event.is_set():
        pytest.fail(cancel.reason, pytrace=False)


@pytest.fixture(scope="module")
def launcher(request) -> Launcher:
    """Launches for a lesson's tests (course.launch.Launcher): one that names a file of the
    lesson known broken (it hangs or fails at import) is refused at once, so that the
    lesson's tests fail in a second instead of each waiting out its deadline."""
    probe = _probe_for(request.node)
    return Launcher(probe.cancel if probe is not None else None)


def needed(request, every) -> list[str]:
    """Which of the shared launches (or case-script cases) `every` the tests selected to
    run in this module need. Of the tests that use the requesting fixture, one marked
    @pytest.mark.needs("a", "b") needs those (a name may use the test's parameters,
    "ring_{world}"), an unmarked one needs them all. A full grade
    launches everything at once, as before; a grade of one test (`-k`, a mutant's
    `caught_by`) launches only what that test reads."""
    want: set[str] = set()
    for item in request.session.items:
        if getattr(item, "module", None) is not request.module:
            continue
        if request.fixturename not in getattr(item, "fixturenames", ()):
            continue
        probe = _probe_for(item)
        if probe is not None and probe.cancel_for(exercises_of(item)).event.is_set():
            continue  # its file is broken: it fails at once, and a case of it could hang
        marker = item.get_closest_marker("needs")
        params = getattr(getattr(item, "callspec", None), "params", {})
        # A name may use the test's parameters: needs("ring_{world}").
        want |= {a.format(**params) for a in marker.args} if marker is not None else set(every)
    return [name for name in every if name in want]


class _Interrupted:
    """The mark a shared launch leaves in its cache while it runs (see shared)."""


def shared(cache: dict, key, launch):
    """cache[key], made by launch() the first time: the launches a lesson's tests share.

    If that first attempt never finished (pytest-timeout stopped its test, say), the
    later tests fail at once, pointing at it, instead of starting the launches again."""
    if isinstance(cache.get(key), _Interrupted):
        pytest.fail(
            "the launches this test reads were interrupted in an earlier test, which "
            "reports why; they are not started again",
            pytrace=False,
        )
    if key not in cache:
        cache[key] = _Interrupted()
        cache[key] = launch()
    return cache[key]


# The course's own suite: files of independent gradings, one test each (see the scheduler).
SPREAD = ("test_mutants.py", "test_grader.py")
TOGETHER = {"test_site.py": "site", "test_browser.py": "site"}  # one worker, one site build


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


def pytest_collection_modifyitems(config, items):
    in_schedule_order(items)
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
            "a test must call student code in a child process (course/grader/calls.py)"
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
            "course_version": course.__version__,
            "grading_seed": draws.grade_seed(),
            "tests": tests,
        }
        atomic.write_json(results, self.path)  # a crash mid-write leaves the last version

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_sessionfinish(self, session):
        yield  # after every other plugin's session end (xdist stops its workers there)
        # Nothing a submission started may outlive the grading and touch the file.
        launch.stop_zygotes()  # course/launch/warm/: they end their children themselves
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
