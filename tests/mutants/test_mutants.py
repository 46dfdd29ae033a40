"""Mutation testing: the grade rejects realistic wrong versions and accepts honest different ones.

Each mutant in tests/mutants/lesson_NN.py is a mistake a student makes,
written into a copy of the reference solution; the lesson's tests named in
`caught_by` must fail on it. Each alternative is a correct solution written
differently (its own atomic save instead of course.checkpoint.save, say);
every test of the lesson must pass on it. Each case grades one lesson in a
subprocess, as `python -m course grade` would, on gloo.

Every case is graded by a copy of the course that has no solutions/ folder
(conftest.py's `course_without_solutions`), as in a class deployment: a grader
that read the reference instead of `--impl` would pass every mutant, and the alternatives,
which run every test of their lesson, show that each lesson grades a correct
submission in full without the reference beside it. Every lesson has at least
one alternative, so together they grade the whole course once that way
(test_integrity.py used to grade it a second time, inside the suite).

A mutant stops at its first failing test (`-x`): one rejection is enough. A mutant with
`gpus=N` is one only CUDA shows (a generator CPU code never draws from): it is graded
where N GPUs are visible, and skipped elsewhere.
They run in the normal suite (CI included), marked `mutation`, so
`-m "not mutation"` skips them while iterating; `python -m course durations`
shows what each costs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from course import REPO_ROOT, launch, registry
from course.grader import rules, warm
from course.grader.grading import of_lessons
from course.tools.author import mutants, release
from course.tools.author.mutants import MUTANT_DIR, load


def cases(kind: str):
    for number, file, case in mutants.cases(kind):
        yield pytest.param(number, file, case, id=f"{number}-{case['name']}")


def apply(tmp_path: Path, file: str, case: dict) -> Path:
    """A copy of the solution's lesson folder with `case` written into it; returns --impl."""
    return mutants.apply(tmp_path, file, case)


@pytest.fixture(scope="module")
def grader(course_without_solutions):
    """One warm grading server per test process (course/grader/warm.py): each case is
    graded by a fresh fork of a Python that imported pytest and torch once. Mutants grade
    on gloo: a GPU box's GPUs are hidden from them (each rank would start CUDA for
    nothing), except for a mutant that needs them (`gpus=N`, graded cold)."""
    with warm.Server(course_without_solutions, env=CPU_ONLY) as server:
        yield server


CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def grade(grader: warm.Server, number: str, impl: Path, *options: str, gpus: int = 0):
    grading = of_lessons([number], impl, root=grader.root).with_options(*options)
    if gpus:  # the GPUs visible: not the warm server's environment
        return launch.run(grading.command(), timeout=300, cwd=grader.root,
                          course_root=grader.root)  # fmt: skip
    return grader.run(grading, timeout=300, cwd=grader.root)


def _visible_gpus() -> int:
    from course.runtime import visible_gpus

    return visible_gpus()


def todo_blocks(source: str) -> list[tuple[int, int]]:
    """(first, last) character offsets of each ### BEGIN/END SOLUTION or BUG block."""
    blocks, start = [], None
    offset = 0
    for line in source.splitlines(keepends=True):
        if line.strip() in (release.BEGIN, release.BUG):
            start = offset
        elif line.strip() in (release.END, release.END_BUG) and start is not None:
            blocks.append((start, offset + len(line)))
            start = None
        offset += len(line)
    return blocks


def test_every_todo_has_a_mutant_and_every_case_applies_once():
    """Fast (no grading): each case's `old` occurs exactly once in its solution, and
    every TODO block of every lesson is changed by at least one mutant."""
    lessons_seen = set()
    for path in sorted(MUTANT_DIR.glob("lesson_*.py")):
        module = load(path)
        lessons_seen.add(module.FILE.split("/")[0])
        files = {module.FILE} | {c.get("file", module.FILE) for c in module.MUTANTS}
        for name in sorted(files):
            source = (REPO_ROOT / "solutions" / name).read_text()
            for case in [*module.MUTANTS, *module.ALTERNATIVES]:
                for edit in [case, *case.get("also", ())]:
                    if edit.get("file", case.get("file", module.FILE)) == name:
                        assert source.count(edit["old"]) == 1, (
                            f"{path.name}: {case['name']}: `old` not unique in {name}"
                        )
            mine = [c for c in module.MUTANTS if c.get("file", module.FILE) == name]
            starts = [source.index(case["old"]) for case in mine]
            for first, last in todo_blocks(source):
                hit = any(first <= at < last for at in starts) or any(
                    at < first < at + len(case["old"])
                    for at, case in zip(starts, mine, strict=True)
                )
                line = source[:first].count("\n") + 1
                assert hit, f"{name}:{line}: this TODO block has no mutant in {path.name}"
        folder = REPO_ROOT / "solutions" / module.FILE.split("/")[0]
        with_todos = [p for p in folder.glob("*.py") if todo_blocks(p.read_text())]
        unmutated = {p.relative_to(REPO_ROOT / "solutions").as_posix() for p in with_todos} - files
        assert not unmutated, f"{path.name}: files with TODOs and no mutant: {sorted(unmutated)}"
        # Each mutant's `caught_by` (a -k expression: words joined by " or ") names tests
        # that exist, read with the grader's own rules (course/grader/rules.py).
        number = path.stem.removeprefix("lesson_")
        names = [
            t.name
            for test_file in registry.tests(number)
            for t in rules.collect_graded_tests(test_file)
        ]
        for case in module.MUTANTS:
            for word in case["caught_by"].split(" or "):
                assert any(word.strip() in name for name in names), (
                    f"{path.name}: {case['name']}: caught_by {word.strip()!r} matches no test "
                    f"of lesson {number}"
                )
    solved = {p.parent.name for p in (REPO_ROOT / "solutions").glob("*/*.py")}
    assert solved <= lessons_seen, f"lessons without mutants: {sorted(solved - lessons_seen)}"
    # The alternatives are also what grades each lesson in full without solutions/.
    bare = [
        path.name for path in sorted(MUTANT_DIR.glob("lesson_*.py")) if not load(path).ALTERNATIVES
    ]
    assert not bare, f"lessons without an honest alternative: {bare}"


@pytest.mark.mutation
@pytest.mark.parametrize(("number", "file", "case"), list(cases("MUTANTS")))
def test_mutant_is_rejected(tmp_path, grader, number, file, case):
    if case.get("gpus", 0) > (visible := _visible_gpus()):
        pytest.skip(f"caught on {case['gpus']} CUDA GPU(s) only; this machine has {visible}")
    impl = apply(tmp_path, file, case)
    run = grade(grader, number, impl, "-k", case["caught_by"], "-x", gpus=case.get("gpus", 0))
    assert not run.timed_out, run.describe()
    assert "passed" in run.output or "failed" in run.output, run.describe()
    assert run.returncode != 0, (
        f"lesson {number}: the mutant '{case['name']}' ({case['why']}) passed the tests "
        f"matching '{case['caught_by']}'\n{run.describe()}"
    )
    missing = [words for words in case.get("says", ()) if words not in run.output]
    assert not missing, (
        f"lesson {number}: the mutant '{case['name']}' was rejected, but the report does not "
        f"say {missing}\n{run.output[-3000:]}"
    )
    assert not launch.group_alive(run.pgid), f"{case['name']}: processes outlived the grade"
    if "spares" in case:  # a mistake in one exercise costs that exercise's points only
        kept = grade(grader, number, impl, "-k", case["spares"])
        assert kept.returncode == 0 and "passed" in kept.output, (
            f"lesson {number}: the mutant '{case['name']}' also failed the tests matching "
            f"'{case['spares']}', which it does not touch\n{kept.describe()}"
        )


@pytest.mark.mutation
@pytest.mark.parametrize(("number", "file", "case"), list(cases("ALTERNATIVES")))
def test_honest_alternative_passes(tmp_path, grader, number, file, case):
    run = grade(grader, number, apply(tmp_path, file, case))
    assert run.returncode == 0, (
        f"lesson {number}: the correct alternative '{case['name']}' ({case['why']}) "
        f"lost points\n{run.describe(lines=40)}"
    )
