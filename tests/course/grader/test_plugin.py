"""The grader grades itself: it fails unsolved starters, survives broken and
hanging submissions, and keeps its results file valid through a crash.

These run pytest (or a planted script) in a subprocess, exactly as an
instructor's `python -m course grade` would. Those that grade a wrong submission
(the starters, a broken or hanging file) are marked `mutation`, like the mutants:
the full suite runs them, the quick loop (`-m "not mutation"`) does not.
"""

from __future__ import annotations

import ast
import json
import shutil
import sys
import textwrap
import time

import pytest

import course
from course import REPO_ROOT, launch, registry
from course.grader import warm
from course.grader.grading import Grading


@pytest.fixture(scope="module")
def grader():
    """A warm grading server (course/grader/warm.py), as tests/mutants/test_mutants.py uses,
    on gloo: what these tests show of the grader is the same on every backend, and with
    a GPU box's GPUs hidden its gradings start warm (course/launch/warm/protocol.py)."""
    with warm.Server(REPO_ROOT, env={"CUDA_VISIBLE_DEVICES": ""}) as server:
        yield server


# The import check's wait in the tests of a file that hangs at import: they show the check,
# not its default (course/grader/imports.py: IMPORT_DEADLINE_S, 30 s). Importing a lesson
# file took at most 6.0 s on two cores beside four busy loops; the other files of the
# lesson are imported under the same deadline.
SHORT_IMPORT_DEADLINE_S = 15


def waited_the_short_deadline(reason: str) -> bool:
    """The import check's line names the deadline --import-deadline gave it (scaled)."""
    return f"within {SHORT_IMPORT_DEADLINE_S * launch.timeout_scale():.0f} s" in reason


def grade(grader, tmp_path, files, *options, timeout=300):
    """Run the grader on `files`; return (results.json as a dict, RunResult)."""
    results = tmp_path / "results.json"
    grading = Grading(tuple(map(str, files)), options=(f"--grade-json={results}", *options))
    run = grader.run(grading, timeout=timeout, cwd=REPO_ROOT)
    assert not run.timed_out, run.describe()
    assert results.exists(), run.describe()
    return json.loads(results.read_text()), run


def lesson_test_files(lesson):
    return registry.tests(lesson)


def copy_solutions(tmp_path):
    submission = tmp_path / "submission"
    shutil.copytree(
        REPO_ROOT / "solutions", submission, ignore=shutil.ignore_patterns("__pycache__")
    )
    return submission


@pytest.mark.mutation
@pytest.mark.parametrize("lesson", registry.LESSONS, ids=lambda lesson: lesson.number)
def test_every_starter_fails_its_core_tests(grader, tmp_path, lesson):
    results, run = grade(
        grader, tmp_path, lesson_test_files(lesson), "--impl=lessons", "-m", "core"
    )
    graded = [t for t in results["tests"] if t["status"] != "skipped"]
    assert graded, f"lesson {lesson.number} has no core tests\n{run.describe()}"
    passed = [t["name"] for t in graded if t["status"] != "failed" or t["score"] != 0]
    assert not passed, f"these core tests pass on the unsolved starter: {passed}"
    assert results["score"] == 0
    row = next((line for line in run.output.splitlines() if line.startswith(lesson.number)), "")
    assert lesson.title in row, f"the grade table cuts the title {lesson.title!r}: {row!r}"


def test_solutions_earn_full_points_and_json_has_gradescope_shape(grader, tmp_path):
    results, run = grade(
        grader, tmp_path, lesson_test_files(registry.get("00")), "--impl=solutions"
    )
    assert run.returncode == 0, run.describe()
    assert results["score"] == results["max_score"] > 0
    assert isinstance(results["execution_time"], float | int)
    assert results["course_version"] == course.__version__, results.get("course_version")
    for test in results["tests"]:
        assert set(test) >= {"name", "score", "max_score", "status", "output"}
        assert test["status"] in ("passed", "skipped")
    assert "grade of" in run.output and "Environment check" in run.output


@pytest.mark.mutation
def test_syntax_error_fails_only_that_lesson_with_one_line(grader, tmp_path):
    submission = copy_solutions(tmp_path)
    broken = submission / "00_environment" / "env_check.py"
    broken.write_text(broken.read_text() + "\ndef unfinished(:\n")
    # Lessons 00 and 02: one other lesson graded in the same session shows the others
    # unharmed. With lesson 01 as well (two training runs) the test took 14.4 s of CPU,
    # without it 6.4 s (measured 2026-12-02, 2 cores), and showed nothing more.
    files = [f for n in ("00", "02") for f in lesson_test_files(registry.get(n))]
    results, _ = grade(grader, tmp_path, files, f"--impl={submission}", "-m", "core")
    mine = [t for t in results["tests"] if t["number"] == "00"]
    others = [t for t in results["tests"] if t["number"] != "00" and t["status"] != "skipped"]
    assert mine and all(t["status"] == "failed" and t["score"] == 0 for t in mine)
    for test in mine:
        message = test["output"].strip()
        assert "\n" not in message, f"not one line: {message!r}"
        assert "env_check.py:" in message and "syntax error" in message
    unharmed = [f"{t['name']}: {t['status']}: {t['output'][-800:]}" for t in others]
    assert others and all(t["status"] == "passed" for t in others), "\n".join(unharmed)


def test_function_that_never_returns_fails_within_the_timeout(grader, tmp_path):
    submission = copy_solutions(tmp_path)
    script = submission / "00_environment" / "env_check.py"
    source = script.read_text().replace(
        "def cuda_device_count() -> int:\n",
        "def cuda_device_count() -> int:\n    while True:\n        pass\n",
    )
    script.write_text(source)
    files = lesson_test_files(registry.get("00"))
    results, run = grade(
        grader,
        tmp_path,
        files,
        f"--impl={submission}",
        "-k",
        "zero_when",
        "-o",
        "timeout=3",
        timeout=60,
    )
    (test,) = results["tests"]
    assert test["status"] == "failed" and test["score"] == 0
    assert "Timeout" in test["output"]
    assert run.seconds < 30


@pytest.mark.mutation
@pytest.mark.parametrize(
    "top, words",
    [
        ("import time\ntime.sleep(10**6)  # waits at import\n", "did not finish within"),
        ("import not_a_module_of_the_course\n", "fails at import at train.py:"),
    ],
    ids=["hangs", "raises"],
)
def test_a_submission_broken_at_import_fails_its_lesson_at_once(grader, tmp_path, top, words):
    """Lesson 03 whose file hangs (or raises) at import: every test of the lesson fails with
    the same one line, as soon as the grader's import check knows, instead of each test
    waiting out its own deadline (the launches alone wait 120 s). `--import-deadline`
    shortens the check's wait (the line names it)."""
    submission = tmp_path / "submission"
    shutil.copytree(REPO_ROOT / "solutions" / "03_ddp_spawn", submission / "03_ddp_spawn")
    script = submission / "03_ddp_spawn" / "train.py"
    source = script.read_text()
    script.write_text(source.replace("\nimport torch\n", f"\n{top}import torch\n", 1))
    deadline = f"--import-deadline={SHORT_IMPORT_DEADLINE_S}"
    files = lesson_test_files(registry.get("03"))
    results, run = grade(grader, tmp_path, files, f"--impl={submission}", deadline)
    graded = [t for t in results["tests"] if t["status"] != "skipped"]
    assert graded and all(t["status"] == "failed" for t in graded), run.describe(30)
    reasons = {t["output"].strip() for t in graded}
    assert len(reasons) == 1 and words in (reason := reasons.pop()), f"one shared line: {reasons}"
    assert "within" not in reason or waited_the_short_deadline(reason), reason
    limit = (SHORT_IMPORT_DEADLINE_S + 60) * launch.timeout_scale()  # the check, pytest's start
    assert run.seconds < limit, (
        f"the lesson took {run.seconds:.0f} s to grade; a broken import should end it within "
        f"{limit:.0f} s (each launch alone waits up to 120 s)"
    )


def _reading(test_file, exercise: str) -> set[str]:
    """The tests of `test_file` marked @pytest.mark.exercise(`exercise`)."""
    names = set()
    for node in ast.parse(test_file.read_text()).body:
        if isinstance(node, ast.FunctionDef) and any(
            isinstance(d, ast.Call) and ast.unparse(d.func) == "pytest.mark.exercise"
            and exercise in [a.value for a in d.args] for d in node.decorator_list
        ):  # fmt: skip
            names.add(node.name)
    return names


@pytest.mark.mutation
@pytest.mark.parametrize(
    "number, exercise, top, words",
    [
        (
            "12",
            "ring.py",
            "import time\ntime.sleep(10**6)  # waits at import\n",
            "importing lesson 12's ring.py did not finish within",
        ),
        (
            "11",
            "tensor.py",
            "import not_a_module_of_the_course\n",
            "lesson 11's tensor.py fails at import at tensor.py:",
        ),
    ],  # fmt: skip
    ids=["12-ring.py-hangs", "11-tensor.py-raises"],
)
def test_a_broken_exercise_file_fails_its_own_tests_alone(grader, tmp_path, number, exercise,
                                                          top, words):  # fmt: skip
    """A lesson of several files, one of them broken at import (not the first): the tests
    of that file fail with one line that names it, within the import deadline, and every
    other test of the lesson passes (a case child or a launch shared with it included)."""
    from course.tools.instructor.grading_cost import measured_seconds

    lesson = registry.get(number)
    submission = tmp_path / "submission"
    shutil.copytree(REPO_ROOT / "solutions" / lesson.slug, submission / lesson.slug)
    script = submission / lesson.slug / exercise
    source = script.read_text()
    assert "\nimport torch\n" in source
    script.write_text(source.replace("\nimport torch\n", f"\n{top}import torch\n", 1))
    (test_file,) = lesson_test_files(lesson)
    start = time.monotonic()
    results, run = grade(grader, tmp_path, [test_file], f"--impl={submission}",
                         f"--import-deadline={SHORT_IMPORT_DEADLINE_S}")  # fmt: skip
    seconds = time.monotonic() - start
    graded = [t for t in results["tests"] if t["status"] != "skipped"]
    failed = {t["name"].split("::")[-1].split("[")[0] for t in graded if t["status"] == "failed"}
    assert failed == _reading(test_file, exercise), (
        f"failed: {sorted(failed)}; expected exactly the tests of {exercise}\n{run.describe(30)}"
    )
    reasons = {t["output"].strip() for t in graded if t["status"] == "failed"}
    assert len(reasons) == 1 and words in (reason := reasons.pop()), f"one shared line: {reasons}"
    assert "within" not in reason or waited_the_short_deadline(reason), reason
    # The import check, then the rest of the lesson as long as it was measured to take on
    # this kind of machine (twice, for load), and pytest's start.
    graded = measured_seconds(number) or 60
    limit = (SHORT_IMPORT_DEADLINE_S + 2 * graded + 30) * launch.timeout_scale()
    assert seconds < limit, (
        f"the lesson took {seconds:.0f} s to grade, more than {limit:.0f} s (its grading was "
        f"measured at {graded:.0f} s on this kind of machine)"
    )


def test_a_killed_grading_leaves_a_zero_score_file(grader, tmp_path):
    """The results file is written when the session starts (score 0) and, for real,
    only at its end: a grading killed halfway (by a test, or by a submission that
    kills its parent) leaves a valid file with no points, never a stale or partial one."""
    planted = tmp_path / "test_98_planted.py"
    planted.write_text(
        textwrap.dedent(
            """
            import os

            def test_passes():
                assert True

            def test_kills_the_grader():
                os._exit(3)

            def test_never_reached():
                assert True
            """
        )
    )
    (tmp_path / "results.json").write_text('{"score": 99, "max_score": 99, "tests": []}')
    results, run = grade(
        grader, tmp_path, [planted], "-o", "addopts=", "-p", "course.grader.plugin"
    )
    assert run.returncode == 3
    assert results["score"] == 0 and results["tests"] == [], results


def test_pytest_timeouts_stretch_with_course_timeout_scale(tmp_path):
    """pytest-timeout's limits follow COURSE_TIMEOUT_SCALE like every launch's deadline."""
    planted = tmp_path / "test_97_slow.py"
    planted.write_text(
        "import time, pytest\n\n"
        "def test_default_limit():\n    time.sleep(1.6)\n\n"
        "@pytest.mark.timeout(1)\ndef test_marked_limit():\n    time.sleep(1.6)\n"
    )
    args = [sys.executable, "-m", "pytest", str(planted), "-q", "-p", "no:cacheprovider"]
    args += ["-p", "no:xdist", "-o", "addopts=", "-p", "course.grader.plugin", "-o", "timeout=1"]
    for scale, failed in (("1", 2), ("3", 0)):
        run = launch.run(args, timeout=60, cwd=tmp_path, env={"COURSE_TIMEOUT_SCALE": scale})
        assert f"{failed} failed" in run.output if failed else "2 passed" in run.output, (
            f"COURSE_TIMEOUT_SCALE={scale}: expected {failed} of 2 tests past their 1 s "
            f"limit to fail\n{run.describe()}"
        )
        assert failed == 0 or "Timeout" in run.output, run.describe()


def test_a_failed_check_shows_its_message_first(tmp_path):
    """The grader's message (expected, seen, likely cause) is the first line a student
    reads, in the terminal and in the results file, with the checking source after it."""
    planted = tmp_path / "test_96_planted.py"
    planted.write_text(
        "def helper(x):\n" + "".join(f"    y{i} = x + {i}\n" for i in range(30))
        + "    assert x == 2, 'expected 2 ranks, saw 3: likely cause: the world size'\n\n"
        "def test_checks():\n    helper(3)\n"
    )  # fmt: skip
    results = tmp_path / "results.json"
    args = [sys.executable, "-m", "pytest", str(planted), "-q", "-p", "no:cacheprovider",
            "-p", "no:xdist", "-o", "addopts=", "-p", "course.grader.plugin",
            f"--grade-json={results}"]  # fmt: skip
    run = launch.run(args, timeout=60, cwd=tmp_path)
    assert run.returncode == 1, run.describe()
    (test,) = json.loads(results.read_text())["tests"]
    first = test["output"].strip().splitlines()[0]
    assert first.startswith("expected 2 ranks, saw 3: likely cause: the world size"), test["output"]
    assert "y29 = x + 29" in test["output"]  # the source is still there, after
    shown = run.output.index("expected 2 ranks, saw 3")
    assert shown < run.output.index("y0 = x + 0"), run.output
