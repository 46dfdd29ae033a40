"""Lesson 03's functions, called in a child process (course/calls.py).

Run by tests/test_03_ddp_spawn.py as `python lesson_03.py LESSON_FILE OUT_DIR`.
"""

from __future__ import annotations

from course.calls import Cases

cases = Cases()


@cases.case
def sync_bn_with_gloo(lesson):
    """--sync-bn with gloo must be refused before any process starts."""
    try:
        lesson.main(["--sync-bn", "--backend", "gloo"])
    except ValueError as err:
        return {"raised": "ValueError", "message": str(err)}
    return {"raised": None}


if __name__ == "__main__":
    cases.run(requires=("main",))
