"""course/grader/grading.py: one grading as data, each caller's form made from it."""

from __future__ import annotations

import sys

from course import REPO_ROOT, registry
from course.grader.grading import ONE_PROCESS, Grading, of_lessons


def test_a_lessons_grading_names_its_tests_submission_and_options():
    grading = of_lessons(["12"], "some/folder", grade_json="r.json", keyword="ring")
    files = [str(f) for f in registry.tests(registry.get("12"), REPO_ROOT)]
    args = grading.pytest_args()
    assert args[: len(files)] == files and "--impl=some/folder" in args
    assert args[args.index("-k") + 1] == "ring" and "--grade-json=r.json" in args
    assert args[-len(ONE_PROCESS) :] == list(ONE_PROCESS), "one process: no xdist, no cache"
    assert of_lessons([], "x").tests == tuple(
        str(f) for lesson in registry.LESSONS for f in registry.tests(lesson, REPO_ROOT)
    ), "no lesson named: every lesson's tests"


def test_each_form_is_made_from_the_same_arguments():
    grading = Grading(("t.py",), "impl").with_options("-x", "-k", "a")
    args = grading.pytest_args()
    assert grading.command() == [sys.executable, "-m", "pytest", *args]
    assert grading.warm_command() == [sys.executable, "-m", "course.grader.warm", "--once", *args]
    assert args.index("-x") < args.index("-k"), "options keep their order"
    spread = Grading(("t.py",), "impl", workers=3)
    assert spread.pytest_args()[-2:] == ["-n", "3"] and "no:xdist" not in spread.pytest_args()
    assert spread.warm_command() == spread.command(), "xdist's workers: the plain command"
    assert "--impl" not in " ".join(Grading(("t.py",)).pytest_args()), "the plugin's default"
