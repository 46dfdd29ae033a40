"""The starter generator (python -m course release) and the lesson registry."""

from __future__ import annotations

import pytest

from course import REPO_ROOT, registry
from course.tools.author import release

SOLUTION = """def area(r):
    # TODO: the area of a circle of radius r.
    ### BEGIN SOLUTION
    import math

    return math.pi * r * r
    ### END SOLUTION


for step in range(3):
        ### BEGIN SOLUTION
        print(step)
        ### END SOLUTION
"""


def test_blocks_become_todos_that_raise_at_their_own_line():
    starter = release.make_starter(SOLUTION, "demo.py")
    assert "math.pi" not in starter and "print(step)" not in starter
    assert "# TODO: the area of a circle of radius r." in starter
    lines = starter.splitlines()
    raises = [n for n, line in enumerate(lines, start=1) if "NotImplementedError" in line]
    assert len(raises) == 2
    for number in raises:
        assert f"demo.py:{number} is not done" in lines[number - 1]
    assert lines[raises[0] - 1].startswith("    raise")
    assert lines[raises[1] - 1].startswith("        raise")
    # The loop at module level runs first, and fails at its own TODO.
    with pytest.raises(NotImplementedError, match=f"demo.py:{raises[1]} "):
        exec(compile(starter, "demo.py", "exec"), {})


BUGGY = """def mean(xs):
    # TODO: the mean, not the sum.
    # HINT 1: divide by the count.
    ### BEGIN BUG
    #| return sum(xs)
    ### FIX
    # the count, once
    return sum(xs) / len(xs)
    ### END BUG
"""


def test_a_bug_block_gives_the_starter_the_broken_code_and_the_solution_the_fix():
    """Lesson 09's exercises: the starter runs the broken lines, the site's solution shows
    only the fix, and the TODO (with its hint and broken lines) points at the first one."""
    starter, todos = release.convert(BUGGY, "demo.py")
    assert "    return sum(xs)\n" in starter and "len(xs)" not in starter
    assert "### " not in starter and "# HINT" not in starter
    scope: dict = {}
    exec(compile(starter, "demo.py", "exec"), scope)
    assert scope["mean"]([1, 2, 3]) == 6  # the bug, as the student meets it
    line = starter.splitlines().index("    return sum(xs)") + 1
    assert todos == [
        {"id": f"TODO at demo.py:{line}", "goal": "the mean, not the sum.",
         "hints": ["divide by the count."], "bug": ["return sum(xs)"]}
    ]  # fmt: skip
    view = release.solution_view(BUGGY)
    assert view.splitlines() == ["def mean(xs):", "    # the count, once",
                                 "    return sum(xs) / len(xs)"]  # fmt: skip
    exec(compile(BUGGY, "solution.py", "exec"), scope)
    assert scope["mean"]([1, 2, 3]) == 2


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("### BEGIN BUG\n#| x = 1\n", "never closed"),
        ("### BEGIN BUG\n#| x = 1\n### END BUG\n", "before its"),
        ("### BEGIN BUG\nx = 1\n### FIX\n### END BUG\n", "must read"),
        ("### FIX\n", "without a"),
    ],
)
def test_unbalanced_bug_markers_are_reported(source, problem):
    with pytest.raises(release.ReleaseError, match=problem):
        release.make_starter(source, "bad.py")


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("### BEGIN SOLUTION\nx = 1\n", "never closed"),
        ("x = 1\n### END SOLUTION\n", "without a"),
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n", "inside the block"),
    ],
)
def test_unbalanced_markers_are_reported_with_their_line(source, problem):
    with pytest.raises(release.ReleaseError, match=problem):
        release.make_starter(source, "bad.py")


def test_committed_starters_are_up_to_date():
    stale = release.stale()
    assert not stale, f"run `python -m course release`; stale: {[str(p) for p in stale]}"


def test_release_writes_and_removes_files(tmp_path):
    solutions, starters = tmp_path / "solutions", tmp_path / "lessons"
    (solutions / "00_demo").mkdir(parents=True)
    (solutions / "00_demo" / "demo.py").write_text(SOLUTION)
    (starters / "00_demo").mkdir(parents=True)
    (starters / "00_demo" / "old.py").write_text("x = 1\n")
    changed = release.release(solutions, starters)
    assert sorted(p.name for p in changed) == ["demo.py", "hints.json", "old.py"]
    assert not (starters / "00_demo" / "old.py").exists()
    assert "NotImplementedError" in (starters / "00_demo" / "demo.py").read_text()
    assert release.stale(solutions, starters) == []


def test_every_lesson_folder_is_registered_with_its_script_and_tests():
    folders = {p.name for p in (REPO_ROOT / "solutions").iterdir() if p.is_dir()}
    folders.discard("__pycache__")
    assert folders == {lesson.slug for lesson in registry.LESSONS}
    for lesson in registry.LESSONS:
        assert lesson.slug.startswith(lesson.number + "_")
        assert lesson.launcher in registry.LAUNCHERS
        assert lesson.path(REPO_ROOT / "solutions").is_file()
        assert lesson.path(REPO_ROOT / "lessons").is_file()
        assert registry.tests(lesson), lesson.number
        source = lesson.path(REPO_ROOT / "solutions").read_text()
        assert source.startswith('"""') and "python " in source.split('"""')[1], (
            f"{lesson.slug}: the docstring must open with the commands that run it"
        )


def test_lookup_by_number_or_slug():
    assert registry.get(0) is registry.get("00") is registry.get("00_environment")
    with pytest.raises(registry.UnknownLesson, match="python -m course list"):
        registry.get("99")
