"""A GitHub Classroom workflow for a student's copy of the course.

    python -m course classroom [--out .github/workflows/classroom.yml] [--lessons 00 03]

Writes the workflow GitHub Classroom runs on every push to a student's repository: a CPU
runner installs a CPU build of this PyTorch and the course, then each lesson is one
autograding step (classroom-resources/autograding-command-grader) that runs
`python -m course grade NN` on the student's lessons/ and is worth the lesson's points on
a CPU (tests that need GPUs skip there); the reporter sums the steps. A command grader
gives a step all its points or none: the student sees every test in the step's log.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from course import REPO_ROOT, launch, registry
from course.grader.grading import Grading

# Minutes a lesson's step may take on GitHub's hosted runner (2 or 4 cores; a lesson grades
# in under 45 s on 2): the command grader stops the step at the limit, worth 0.
STEP_MINUTES = 10

HEADER = """\
# Written by `python -m course classroom`: GitHub Classroom grades each lesson on a push.
name: Autograding Tests
"on": [push, repository_dispatch]
permissions:
  checks: write
  actions: read
  contents: read
jobs:
  run-autograding-tests:
    runs-on: ubuntu-latest
    if: github.actor != 'github-classroom[bot]'
    steps:
      - name: Checkout code
        uses: actions/checkout@v4
      - name: Set up Python
        uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - name: Install the course (CPU PyTorch {torch})
        run: {install}
"""

STEP = """\
      - name: "{number} {title}"
        id: lesson-{number}
        uses: classroom-resources/autograding-command-grader@v1
        with:
          test-name: "{number} {title}"
          command: "{command}"
          timeout: {minutes}
          max-score: {points}
"""


def install_command() -> str:
    from importlib.metadata import version

    import torch

    torch_version = torch.__version__.split("+")[0]
    vision = version("torchvision").split("+")[0]
    return (
        "python -m pip install --index-url https://download.pytorch.org/whl/cpu "
        f"torch=={torch_version} torchvision=={vision} && python -m pip install -e ."
    )


def grade_command(number: str) -> str:
    return f"python -m course grade {number}"


def cpu_points(numbers: list[str]) -> dict[str, float]:
    """Each lesson's points on a machine without GPUs: its tests' points, less those that
    need GPUs (they skip there), as pytest collects them with the grader's plugin."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "points.json"
        files = [str(f) for n in numbers for f in registry.tests(n)]
        points = ("--collect-only", "-p", "course.tools.instructor.classroom")
        command = Grading(tuple(files), options=points).command()
        run = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                             env={**launch.child_env(), POINTS_FILE_ENV: str(out)})  # fmt: skip
        if run.returncode != 0 or not out.exists():
            raise RuntimeError(f"collecting the lessons' tests failed:\n{run.stdout[-2000:]}")
        found = json.loads(out.read_text())
    return {n: found.get(n, 0.0) for n in numbers}


POINTS_FILE_ENV = "COURSE_CLASSROOM_POINTS"


def pytest_collection_finish(session) -> None:
    """(A pytest plugin, in cpu_points' collection only.) Points by lesson, GPU tests out."""
    import os

    from course.grader.rules import LESSON_PROPERTY, POINTS_PROPERTY

    points: dict[str, float] = {}
    for item in session.items:
        props = dict(item.user_properties)
        if POINTS_PROPERTY not in props or item.get_closest_marker("gpus") is not None:
            continue
        lesson = props.get(LESSON_PROPERTY, "--")
        points[lesson] = points.get(lesson, 0.0) + float(props[POINTS_PROPERTY])
    Path(os.environ[POINTS_FILE_ENV]).write_text(json.dumps(points))


def workflow(numbers: list[str]) -> str:
    points = cpu_points(numbers)
    text = HEADER.format(torch=install_command().split("torch==")[1].split()[0],
                         install=install_command())  # fmt: skip
    for number in numbers:
        lesson = registry.get(number)
        text += STEP.format(number=number, title=lesson.title, command=grade_command(number),
                            minutes=STEP_MINUTES, points=f"{points[number]:g}")  # fmt: skip
    ids = [f"lesson-{n}" for n in numbers]
    text += "      - name: Autograding Reporter\n"
    text += "        uses: classroom-resources/autograding-grading-reporter@v1\n"
    text += "        env:\n"
    for step in ids:
        text += f'          {step.upper()}_RESULTS: "${{{{steps.{step}.outputs.result}}}}"\n'
    text += f"        with:\n          runners: {','.join(ids)}\n"
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course classroom",
                                description=__doc__.split("\n")[0])  # fmt: skip
    p.add_argument("--out", type=Path, default=Path(".github/workflows/classroom.yml"))
    p.add_argument("--lessons", nargs="*", default=[], help="lesson numbers (default: all)")
    args = p.parse_args(argv)
    try:
        numbers = [registry.get(n).number for n in args.lessons] or [
            lesson.number for lesson in registry.LESSONS
        ]
    except registry.UnknownLesson as err:
        p.error(str(err))
    text = workflow(numbers)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"{args.out}: {len(numbers)} lessons, one autograding step each; commit it to the "
          "assignment's template repository")  # fmt: skip
    return 0
