"""Cases, the grader's side: a case script started in a child, on a lesson file, and what
it sent back read as plain data (the protocol and the child's side: course/grader/cases.py).

    results = run_cases(CASES, lesson_file, folder)        # CaseResults
    results.value("pick_backend_no_gpu")                   # raises CaseFailed, one line

A test reads a lesson's cases through LessonCases, whose failures fail the test:

    cases = run_lesson_cases(impl, LESSON, CASES, folder)  # LessonCases
    cases("pick_backend_no_gpu"), cases.tensors("train_in_two_ranks")
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from course import registry
from course.grader import imports
from course.grader.cases import ONLY_ENV, RESULTS, TENSORS


class CaseFailed(AssertionError):
    pass


@dataclass
class CaseResults:
    """What the child sent back; `value` fails the calling test with one clear line."""

    run: object  # course.launch.RunResult
    data: dict | None
    tensor_file: Path
    _tensors: dict | None = field(default=None, repr=False)

    def value(self, name: str):
        if self.data is None:
            raise CaseFailed(
                "the grader's child process running this lesson's functions sent nothing back\n"
                + self.run.failure()
            )
        if "load_error" in self.data:
            raise CaseFailed(self.data["load_error"])
        case = self.data["cases"].get(name)
        if case is None:
            raise CaseFailed(f"case {name} did not run (the child stopped before it)")
        if "error" in case:
            err = case["error"]
            where = f" at {err['where']}" if err["where"] else ""
            raise CaseFailed(f"{err['type']}{where}: {err['message']}")
        return case["value"]

    def tensors(self, name: str) -> dict:
        """The tensors case `name` returned, read weights-only (no code can run)."""
        import torch

        keys = self.value(name)["tensors"]
        if self._tensors is None:  # one file for all cases: read it once
            self._tensors = torch.load(self.tensor_file, weights_only=True, map_location="cpu")
        return {key: self._tensors[f"{name}/{key}"] for key in keys}


def run_cases(
    script: Path, lesson_file: Path, folder: Path, timeout: float = 90, only=None, cancel=None
) -> CaseResults:
    """Run a case script on `lesson_file` in a child, in `folder` (only the cases named in
    `only`, when given); read what it sent. cancel (course.launch.Cancel): a lesson file
    known broken is not launched."""
    from course import launch

    out = Path(folder) / "cases-out"
    env = {ONLY_ENV: ",".join(only)} if only is not None else None
    # A new process (warm-started from the zygote where it can be: course/launch/warm/),
    # never a fork of the grader: a fork would hold the grader's models and its answers in
    # the memory the submission runs in.
    result = launch.python(
        script, lesson_file, out, timeout=timeout, cwd=folder, env=env, cancel=cancel
    )
    try:
        data = json.loads((out / RESULTS).read_text())
        if not isinstance(data, dict) or not isinstance(data.get("cases"), dict):
            data = None
    except (OSError, ValueError):
        data = None
    return CaseResults(result, data, out / TENSORS)


class LessonCases:
    """A lesson's functions as called in a child process by its case script
    (course/grader/cases.py): `cases("case")` is the value the case returned, and a
    case that raised fails the test with one line saying what and where."""

    def __init__(self, results: CaseResults, lesson_file: Path):
        self.results, self.lesson_file = results, lesson_file  # the file: to read, not import

    def _get(self, method, name):
        try:
            return method(name)
        except CaseFailed as err:
            message = str(err)
        pytest.fail(message, pytrace=False)  # outside `except`: no chained traceback

    def __call__(self, name: str):
        return self._get(self.results.value, name)

    def tensors(self, name: str) -> dict:
        return self._get(self.results.tensors, name)


def run_lesson_cases(
    impl, lesson: registry.Lesson, cases: Path, folder: Path, only=None, script: str = ""
) -> LessonCases:
    """Run the case script `cases` on the lesson file of `impl` (or on its file `script`,
    for a lesson of several) in a child, in `folder` (only the cases named in `only`, when
    given).

    The grading process never imports the submission (see course/grader/cases.py)."""
    path = lesson.path(impl).with_name(script) if script else lesson.path(impl)
    cancel = imports.lesson_cancel(lesson.number)  # its file known broken: launch nothing
    return LessonCases(run_cases(cases, path, folder, only=only, cancel=cancel), path)
