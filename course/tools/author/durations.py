"""Where the test suite's time goes: seconds by file and by kind of test.

    python -m pytest -n 2 --junitxml=runs/suite.xml      # any run of the suite
    python -m course durations runs/suite.xml            # the tables

The grader (course/grader/plugin.py) writes each test's markers into the JUnit file
as a property, so the report can sort the tests into the suite's kinds:

    mutation   grades a mutant, an honest alternative or a cheat (tests/mutants/)
    gpus       a test that needs GPUs (its nccl variant, or marked gpus without one)
    lessons    the lesson tests (tests/lessons/test_NN_*.py) that grade the reference
    other      the course's own unit tests, the site, the notebooks, the container

A test's seconds are its setup, call and teardown, as pytest reports them; a
launch shared by several tests counts for the first one that waits for it. With
`-n 2` the sums exceed the wall time (two tests run at once): the wall time is
the JUnit file's own total.

The budget (docs/contributing.md): a lesson's tests and its mutation cases
together add at most LESSON_BUDGET_S to `.ci/run` on two cores, that is twice
that in test time (two workers). The "by lesson" table adds them up and marks
a lesson over budget.
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from course.grader.rules import MARKERS_PROPERTY, lesson_of

SUITE_BUDGET_S = 1200  # `.ci/run` in full on two cores, install included
QUICK_BUDGET_S = 300  # `pytest -m "not mutation" -n 2`
LESSON_BUDGET_S = 120  # what one lesson (tests and mutants) adds to `.ci/run`
WORKERS = 2  # the suite's `-n 2`: a second of wall time is two seconds of test time
MUTANT_ID = re.compile(r"\[(\d\d)-")
KINDS = ("mutation", "gpus", "lessons", "other")


@dataclass
class Test:
    file: str
    name: str
    seconds: float
    markers: tuple[str, ...]
    outcome: str

    @property
    def lesson(self) -> str | None:
        """The lesson a test grades: tests/lessons/test_NN_*.py, or a mutation case NN-..."""
        if number := lesson_of(self.file):
            return number
        if "mutation" in self.markers and (found := MUTANT_ID.search(self.name)):
            return found.group(1)
        return None

    @property
    def kind(self) -> str:
        if "mutation" in self.markers:
            return "mutation"
        if "gpus" in self.markers and "[gloo" not in self.name:
            return "gpus"
        if lesson_of(self.file):
            return "lessons"
        return "other"


def read(path: Path) -> tuple[list[Test], float]:
    """The tests of a JUnit XML file, and the run's wall time (seconds)."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    tests, wall = [], 0.0
    for suite in suites:
        wall = max(wall, float(suite.get("time", 0)))
        for case in suite.iter("testcase"):
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            markers = tuple(filter(None, (props.get(MARKERS_PROPERTY) or "").split(",")))
            outcome = "passed"
            for tag in ("failure", "error", "skipped"):
                if case.find(tag) is not None:
                    outcome = {"failure": "failed"}.get(tag, tag)
            classname = case.get("classname", "")
            file = classname.replace(".", "/") + ".py" if classname else "?"
            tests.append(
                Test(file, case.get("name", "?"), float(case.get("time", 0)), markers, outcome)
            )
    return tests, wall


def table(title: str, rows: dict[str, list[Test]], total: float) -> list[str]:
    lines = [f"{title:<44}{'tests':>7}{'seconds':>10}{'share':>8}{'slowest':>10}"]
    for key, group in sorted(rows.items(), key=lambda kv: -sum(t.seconds for t in kv[1])):
        seconds = sum(t.seconds for t in group)
        slowest = max((t.seconds for t in group), default=0.0)
        share = f"{100 * seconds / total:.0f}%" if total else "-"
        lines.append(f"{key[:43]:<44}{len(group):>7}{seconds:>10.0f}{share:>8}{slowest:>10.0f}")
    return lines


def report(tests: list[Test], wall: float) -> str:
    total = sum(t.seconds for t in tests)
    by_file: dict[str, list[Test]] = defaultdict(list)
    by_kind: dict[str, list[Test]] = {kind: [] for kind in KINDS}
    for test in tests:
        by_file[test.file].append(test)
        by_kind[test.kind].append(test)
    failed = sum(t.outcome in ("failed", "error") for t in tests)
    lessons: dict[str, list[Test]] = defaultdict(list)
    for test in tests:
        if test.lesson:
            lessons[test.lesson].append(test)
    lines = [
        f"{len(tests)} tests ({failed} failed), {total:.0f} s of test time, {wall:.0f} s wall time",
        "",
        *table("by kind", {k: v for k, v in by_kind.items() if v}, total),
        "",
        *table("by file", by_file, total),
        "",
        *by_lesson(lessons),
    ]
    return "\n".join(lines)


def by_lesson(lessons: dict[str, list[Test]]) -> list[str]:
    """Each lesson's tests and mutation cases, as wall time on WORKERS workers, against
    LESSON_BUDGET_S."""
    lines = [f"{'by lesson (tests + mutants)':<36}{'tests':>7}{'mutants':>9}{'~wall':>8}  budget"]
    for number, group in sorted(lessons.items()):
        own = sum(t.seconds for t in group if t.kind != "mutation")
        mutants = sum(t.seconds for t in group if t.kind == "mutation")
        wall = (own + mutants) / WORKERS
        verdict = "ok" if wall <= LESSON_BUDGET_S else f"OVER {LESSON_BUDGET_S} s"
        lines.append(f"{'lesson ' + number:<36}{own:>7.0f}{mutants:>9.0f}{wall:>8.0f}  {verdict}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course durations", description=__doc__.splitlines()[0]
    )
    parser.add_argument("junit", type=Path, help="the file of pytest --junitxml=PATH")
    args = parser.parse_args(argv)
    try:
        tests, wall = read(args.junit)
    except (OSError, ET.ParseError) as err:
        print(f"course durations: cannot read {args.junit}: {err}", file=sys.stderr)
        return 2
    print(report(tests, wall))
    return 0


if __name__ == "__main__":
    sys.exit(main())
