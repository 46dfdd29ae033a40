"""Lesson 03's functions, called in a child process (course/grader/calls.py).

Run by tests/test_03_ddp_spawn.py as `python lesson_03.py LESSON_FILE OUT_DIR`.
"""

from __future__ import annotations

from course.grader.calls import Cases, raised

cases = Cases()


@cases.case
def sync_bn_with_gloo(lesson):
    """--sync-bn with gloo must be refused before any process starts."""
    return raised(lesson.main, ["--sync-bn", "--backend", "gloo"])


if __name__ == "__main__":
    cases.run(requires=("main",))
