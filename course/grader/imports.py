"""Import checks: every file of a lesson imported, each in a child, before the lesson's
first test, so that a file that hangs or fails at import fails its own tests at once, named,
and leaves the lesson's other exercises alone.

    check = ImportCheck("09", [oom.py, unused.py, hang.py, ...])   # the first one: the main file
    check.broken            # {path: the one line that says why}, of those that failed
    check.cancel_for(["hang.py"])   # the Cancel a test of hang.py runs under (course.launch)
    import_check_for(item)  # the check of the lesson a test grades, made at its first test

A test reads the lesson's main file and the exercises its `@pytest.mark.exercise("hang.py")`
names. Its Cancel is set when one of those is broken: its launches never start and it fails
with that file's line. Whatever the test, a launch that names a broken file is not started
(`Cancel.broken`): a launch shared by several exercises loses only the broken one's part.
"""

from __future__ import annotations

import functools
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from course import launch, registry
from course.grader import submission
from course.grader.rules import lesson_of

# Importing a lesson file (torch included) took at most 2.2 s on an idle 2-core machine
# and 6.0 s with four busy loops sharing its two cores (every solution, measured
# 2026-12-01); 30 s is five times the loaded figure, and stretches with
# COURSE_TIMEOUT_SCALE. A hanging import therefore fails its tests in about 30 s, where
# each test used to wait out its own deadline (217 s for lesson 03). The files of a lesson
# of several are imported at once, each in its own child.
IMPORT_DEADLINE_S = 30  # `pytest --import-deadline S` gives another
_IMPORT = """
import importlib.util, os, sys
path = sys.argv[1]
sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
spec = importlib.util.spec_from_file_location("submission", path)
module = importlib.util.module_from_spec(spec)
sys.modules["submission"] = module
spec.loader.exec_module(module)
"""
_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b:?.*)$")


def check(number: str, path: Path, deadline: float = IMPORT_DEADLINE_S) -> str | None:
    """The one line that says why `path` cannot be imported within `deadline` seconds
    (scaled), or None when it imports."""
    try:
        submission.check_script(path)  # parses only, runs nothing
    except submission.LessonError as err:
        return str(err)  # the same line the tests give a file that won't parse
    # A new process (warm-started where it can be: course/launch/warm/), never a fork of
    # the grader: the submission's code must not run where the grader's memory is.
    with tempfile.TemporaryDirectory(prefix="course-import-") as folder:
        result = launch.python("-c", _IMPORT, path, timeout=deadline, cwd=folder)
    name = f"lesson {number}'s {path.name}"
    if result.timed_out:
        return (
            f"importing {name} did not finish within {result.timeout:.0f} s: code at the "
            "top level of the file waits (a loop, a sleep, input(), a collective or a join "
            "outside main()), so the tests of that file fail without running"
        )
    if result.returncode != 0:
        lines = [line for line in result.output.splitlines() if line.strip()]
        error = next((m.group(1) for ln in reversed(lines) if (m := _RAISED.match(ln))), None)
        where = re.findall(rf'File "[^"]*{re.escape(path.name)}", line (\d+)', result.output)
        at = f" at {path.name}:{where[-1]}" if where else ""
        return f"{name} fails at import{at}: {error or (lines[-1] if lines else 'no output')}"
    return None


class ImportCheck:
    """Imports each of the lesson's files (`paths`, the main one first) in a child of its
    own, all at once, before the lesson's first test.

    It runs before the test, not beside it: a submission that kills its parent at import
    (tests/course/grader/test_integrity.py) would otherwise kill the grader while the test's own
    launches still start, and those, orphaned, would be handed to the process above."""

    def __init__(self, number: str, paths: list[Path], deadline: float = IMPORT_DEADLINE_S):
        self.number, self.main = number, paths[0]
        present = [p for p in paths if p.is_file()]  # a missing one: its tests say so
        if launch.can_fork() or len(present) < 2:  # forks are cheap: one after another
            found = [check(number, p, deadline) for p in present]
        else:
            with ThreadPoolExecutor(max_workers=len(present)) as pool:
                found = list(pool.map(functools.partial(check, number, deadline=deadline),
                                      present))  # fmt: skip
        self.broken = {str(p): why for p, why in zip(present, found, strict=True) if why}
        # The Cancel of the tests that read only the main file (most lessons: every test).
        self.cancel = self.cancel_for([])

    def cancel_for(self, exercises) -> launch.Cancel:
        """The Cancel of a test that reads the main file and `exercises` (file names)."""
        cancel = launch.Cancel(self.broken)
        for path in [self.main, *(self.main.with_name(e) for e in exercises)]:
            if str(path) in self.broken:
                cancel.set(self.broken[str(path)])
                break
        return cancel


# --- the checks of a grading: one per lesson, made before its first test ---

_import_checks: dict[str, ImportCheck] = {}


def import_check_for(item) -> ImportCheck | None:
    """The import check of the lesson the test `item` grades (None: not a lesson's test, or
    its file is missing, which its tests say in their own words)."""
    number = lesson_of(item.path)
    if number is None:
        return None
    if number not in _import_checks:
        try:
            lesson = registry.get(number)
        except LookupError:
            return None
        path = lesson.path(item.config.course_impl)
        if not path.is_file():
            return None  # the tests say so in their own words
        files = [path, *(path.with_name(e) for e in lesson.exercises if e != lesson.script)]
        deadline = item.config.getoption("import_deadline", IMPORT_DEADLINE_S)
        _import_checks[number] = ImportCheck(number, files, deadline)
    return _import_checks[number]


def lesson_cancel(number: str) -> launch.Cancel | None:
    """The Cancel of lesson `number`'s shared launches and cases (they read its main file):
    None before its import check ran (its first test's setup makes it)."""
    check = _import_checks.get(number)
    return check.cancel if check is not None else None


def exercises_of(item) -> tuple[str, ...]:
    """The files besides the main one a test reads: @pytest.mark.exercise("hang.py")."""
    marker = item.get_closest_marker("exercise")
    return tuple(marker.args) if marker is not None else ()
