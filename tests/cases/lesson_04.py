"""Lesson 04's functions, called in a child process (course/grader/calls.py).

Run by tests/test_04_torchrun.py as `python lesson_04.py LESSON_FILE OUT_DIR`.
"""

from __future__ import annotations

import os

from course.grader.calls import Cases, raised

cases = Cases()


@cases.case
def main_without_torchrun(lesson):
    """Started without torchrun (no LOCAL_RANK), the script must say how to start it."""
    os.environ.pop("LOCAL_RANK", None)
    return raised(lesson.main, [])


if __name__ == "__main__":
    cases.run(requires=("main",))
