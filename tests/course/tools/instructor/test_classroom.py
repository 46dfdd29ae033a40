"""`python -m course classroom`: the GitHub Classroom workflow
(course/tools/instructor/classroom.py).

The workflow for lessons 00 and 03 is parsed and checked step by step, and the grading
command of lesson 00's step is run as written (with this machine's `python` first on
PATH) in a student's copy of the course: solved, it exits 0 with the step's max-score
earned; unsolved, it exits non-zero (the command grader then gives 0).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from course import REPO_ROOT, launch, registry

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (the dev extras)")


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    out = tmp_path_factory.mktemp("classroom") / "classroom.yml"
    command = [sys.executable, "-m", "course", "classroom", "--lessons", "00", "03"]
    run = launch.run([*command, "--out", str(out)], timeout=180)
    assert run.returncode == 0, run.describe()
    return yaml.safe_load(out.read_text())


def test_one_step_per_lesson_worth_its_cpu_points_and_a_reporter_of_them_all(workflow):
    assert set(workflow["on"]) == {"push", "repository_dispatch"}
    job = workflow["jobs"]["run-autograding-tests"]
    assert job["runs-on"] == "ubuntu-latest"
    steps = {step.get("id", step["name"]): step for step in job["steps"]}
    install = next(s for s in job["steps"] if s["name"].startswith("Install"))["run"]
    assert "download.pytorch.org/whl/cpu" in install and "pip install -e ." in install
    for number, points in (("00", 25), ("03", 17)):
        step = steps[f"lesson-{number}"]
        assert step["uses"].startswith("classroom-resources/autograding-command-grader@")
        assert step["with"]["command"] == f"python -m course grade {number}"
        assert step["with"]["test-name"].startswith(f"{number} {registry.get(number).title}")
        assert step["with"]["max-score"] == points, (number, step["with"])
    reporter = job["steps"][-1]
    assert reporter["uses"].startswith("classroom-resources/autograding-grading-reporter@")
    assert reporter["with"]["runners"] == "lesson-00,lesson-03"
    assert reporter["env"] == {
        f"LESSON-{n}_RESULTS": f"${{{{steps.lesson-{n}.outputs.result}}}}" for n in ("00", "03")
    }


def student_repo(root: Path, solved: bool) -> Path:
    """A student's copy of the course: course/, the tests, pyproject.toml, lessons/ (lesson
    00 solved or not), no solutions/."""
    for name in ("course", "tests"):
        shutil.copytree(REPO_ROOT / name, root / name, ignore=shutil.ignore_patterns("mutants"))
    shutil.copy(REPO_ROOT / "pyproject.toml", root)  # pytest's settings: the grader plugin
    folder = registry.get("00").path("lessons").parent.name
    source = REPO_ROOT / ("solutions" if solved else "lessons") / folder
    shutil.copytree(source, root / "lessons" / folder)
    return root


def test_lesson_00s_command_grades_a_students_repository(workflow, tmp_path):
    job = workflow["jobs"]["run-autograding-tests"]
    step = next(s for s in job["steps"] if s.get("id") == "lesson-00")
    command, points = step["with"]["command"], step["with"]["max-score"]
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    results = {}
    for solved in (True, False):
        repo = student_repo(tmp_path / f"solved-{solved}", solved)
        grade_json = repo / "results.json"
        run = launch.run(
            ["bash", "-c", f"{command} --grade-json {grade_json}"],
            timeout=240,
            cwd=repo,
            # The workflow installs PyTorch's CPU build: no GPU is visible there, whatever
            # the runner has. Hide this machine's, or its GPU tests add points (on an H200
            # machine lesson 00 scored 26 of the step's 25).
            env={"PATH": path, "CUDA_VISIBLE_DEVICES": ""},
            course_root=repo,  # its own course first on PYTHONPATH, not this one
        )
        assert not run.timed_out, run.describe()
        results[solved] = (run.returncode, json.loads(grade_json.read_text()))
    code, graded = results[True]
    assert code == 0 and graded["score"] == graded["max_score"] == points, (code, graded["score"])
    code, graded = results[False]
    assert code != 0 and graded["score"] < points, (code, graded["score"])
