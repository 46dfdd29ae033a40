"""python -m course grading-cost: each lesson graded on its own and timed, into a record that
`course figures` knows and the Adopting page renders."""

from __future__ import annotations

import json
import sys

from course import REPO_ROOT, launch, registry
from course.grader import rules
from course.tools.author import figures
from course.tools.instructor import grading_cost


def test_grading_cost_times_a_lesson_and_keeps_its_grade(tmp_path):
    """The starter of lesson 00 graded and timed: as many tests as the grader collects for
    the lesson, none passed, no points, seconds and CPU seconds measured; the record is one
    that `course figures` can make again, and the table shows it."""
    out = tmp_path / "docs" / "results" / "grading" / "cost.json"
    run = launch.run(
        args=[sys.executable, "-m", "course", "grading-cost", "--lessons", "0", "--impl",
              "lessons", "--out", str(out)],
        timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.describe()
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    collected = rules.collect_graded_tests(
        REPO_ROOT / "tests" / "lessons" / "test_00_environment.py"
    )
    cases = sum(test.total_cases for test in collected)  # each parametrized case counts
    assert row["lesson"] == "00" and row["tests"] == cases, (row, cases)
    assert row["passed"] == 0 and row["points"] == 0 and row["max_points"] > 0, row
    assert row["finished"] and row["seconds"] > 0 and row["cpu_seconds"] > 0, row
    assert doc["provenance"]["cpus"] and doc["provenance"]["course"], doc["provenance"]
    made = figures.recipe(out, tmp_path)
    assert made.verb == "grading-cost" and made.gpus == 0
    assert made.command[-2:] == ("--out", "docs/results/grading/cost.json"), made.command
    assert f"| 00 | Environment check | {row['tests']} | 0 |" in grading_cost.table(doc, True)


def test_grading_cost_refuses_an_unknown_lesson_in_one_line():
    run = launch.run(
        args=[sys.executable, "-m", "course", "grading-cost", "--lessons", "99"], timeout=60
    )
    assert run.returncode == 2, run.describe()
    assert run.output.strip().splitlines() == [
        "python -m course grading-cost: error: no lesson '99'; the lessons are "
        + ", ".join(lesson.number for lesson in registry.LESSONS)
        + " (python -m course list)"
    ], run.output


def test_measured_seconds_read_this_kind_of_machines_record(tmp_path, monkeypatch):
    """Deadlines follow measured durations: the record of the machine's kind, else the CPU
    record's three times over (a GPU box without its own record), else None."""
    cpu, gpu = tmp_path / "cpu.json", tmp_path / "gpu.json"
    cpu.write_text(json.dumps({"rows": [{"lesson": "09", "seconds": 50.0}]}))
    monkeypatch.setattr(grading_cost, "RECORDS", {"cpu": cpu, "gpu": gpu})
    assert grading_cost.measured_seconds("09", "cpu") == 50.0
    assert grading_cost.measured_seconds("09", "gpu") == 150.0
    gpu.write_text(json.dumps({"rows": [{"lesson": "09", "seconds": 70.0}]}))
    assert grading_cost.measured_seconds("09", "gpu") == 70.0
    assert grading_cost.measured_seconds("15", "gpu") is None
