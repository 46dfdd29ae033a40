"""The grading kit's seeded configurations: the rank counts, stage counts, the rank that
misbehaves and the order of messages a test plants are drawn from one seed per grading,
which the grade prints, so that a failure can be replayed.

    from course.measure.draws import draw
    stages = draw("11.script_stages", (3, 4))

The grading seed comes from COURSE_GRADE_SEED; the grader sets it once per grading when it
is not given (course/grader/plugin.py), before any worker starts, and prints it beside the
points ("grading seed 12345: COURSE_GRADE_SEED=12345 replays these configurations"). Each
draw is a function of the seed and its own name, so adding a draw changes no other.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence

SEED_ENV = "COURSE_GRADE_SEED"


def grade_seed() -> int:
    value = os.environ.get(SEED_ENV, "").strip()
    if not value:
        return 0  # outside a grading (a test's own import, a tool): seed 0's configurations
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"course: {SEED_ENV}={value!r} is not an integer") from None


def choose_seed() -> int:
    """The seed of a new grading: COURSE_GRADE_SEED if set, else a new one, set in this
    process's environment so that every process it starts draws the same."""
    if not os.environ.get(SEED_ENV, "").strip():
        os.environ[SEED_ENV] = str(random.SystemRandom().randrange(1, 100_000))
    return grade_seed()


def _random(name: str) -> random.Random:
    return random.Random(f"{grade_seed()}/{name}")


def generator(name: str) -> random.Random:
    """A random generator of its own for this seed and name: for a test that draws many
    numbers (a hidden configuration's every size)."""
    return _random(name)


def draw(name: str, options: Sequence):
    """One of `options`, the same for a given seed and name in every process."""
    return _random(name).choice(list(options))


def shuffled(name: str, items: Sequence) -> list:
    """`items` in an order drawn from the seed."""
    order = list(items)
    _random(name).shuffle(order)
    return order
