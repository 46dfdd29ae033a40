"""Every bound a lesson test allows, declared beside the test and measured over many seeds.

A test declares the bound it grades with, what it measures, the test function that measures
it, and the seeds it is measured over:

    EQUIVALENCE = tolerance("03.equivalence", high=1e-3, test="test_two_ranks_equal_...",
                            what="largest weight difference from one process, 24 steps")
    SEED = seed(3)        # the seed the test uses; `course tolerances` runs it with others
    ...
    EQUIVALENCE.note(worst)
    assert worst <= EQUIVALENCE.high, "..."

A bound on a timing (a bubble, a data wait) declares `busy=2`: the tool measures it beside
two processes that spin on a core each, as the CI's two pytest workers load the machine.

`python -m course tolerances` runs each declaring test on the reference solution once per
seed, with COURSE_TOLERANCE_SEED set (`seed()` returns it) and COURSE_TOLERANCE_LOG naming a
file that `note()` appends what it saw to. It writes the distribution, with provenance, to
docs/results/tolerances/cpu.json; the pages quote it from there (``[[tolerance:03:equivalence]]``),
and tests/course/grader/test_tolerances.py fails when a bound changes without being measured again,
or
leaves too little room above the worst value seen. In a grading, neither variable is set:
`seed()` returns the test's own seed and `note()` writes nothing.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

SEED_ENV = "COURSE_TOLERANCE_SEED"
LOG_ENV = "COURSE_TOLERANCE_LOG"
SEEDS = tuple(range(12))  # the default measurement: seeds 0-11


@dataclass(frozen=True)
class Tolerance:
    key: str  # "NN.name": the lesson and what is bounded
    what: str  # what the test measures, in a phrase the pages can quote
    test: str  # the test function(s) in the declaring file that note() it, space-separated
    high: float | None = None  # seen <= high passes
    low: float | None = None  # seen >= low passes
    seeds: tuple[int, ...] = SEEDS
    room: float = 2.0  # a `high`-only bound is at least this many times the worst seen
    busy: int = 0  # a timing bound: measured beside this many busy loops, as a loaded CI runs it
    file: str = field(default="", compare=False)  # the declaring test file, relative

    @property
    def lesson(self) -> str:
        return self.key.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split(".", 1)[1]

    def bounds(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{self.low:.3g} to {self.high:.3g}"
        return f"at most {self.high:.3g}" if self.high is not None else f"at least {self.low:.3g}"

    def holds(self, seen: float) -> bool:
        return (self.high is None or seen <= self.high) and (self.low is None or seen >= self.low)

    def note(self, seen: float, backend: str | None = None) -> None:
        """Append what the test saw to the measurement's log, if one is being taken."""
        path = os.environ.get(LOG_ENV)
        if not path:
            return
        line = {"key": self.key, "seen": float(seen), "seed": _override(), "backend": backend}
        line["test"] = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
        with open(path, "a", encoding="utf-8") as log:  # one short line: appends stay whole
            log.write(json.dumps(line) + "\n")


# The bounds the lesson tests imported so far declared, by key: read through declared().
_DECLARED: dict[str, Tolerance] = {}


def tolerance(key: str, *, what: str, test: str, high: float | None = None,
              low: float | None = None, seeds: tuple[int, ...] = SEEDS,
              room: float = 2.0, busy: int = 0) -> Tolerance:  # fmt: skip
    """Declare a bound (see the module's docstring); called at a test module's top level."""
    if "." not in key or (high is None and low is None):
        raise ValueError(f"tolerance {key!r}: a key 'NN.name' and a high or low bound")
    caller = sys._getframe(1).f_globals.get("__file__", "")
    made = Tolerance(key, " ".join(what.split()), test, high, low, tuple(seeds), room, busy,
                     _relative(caller))  # fmt: skip
    known = _DECLARED.get(key)
    if known is not None and known.file != made.file:
        raise ValueError(f"tolerance {key!r} is declared in {known.file} and in {made.file}")
    _DECLARED[key] = made
    return made


def declared() -> dict[str, Tolerance]:
    """Every bound declared by the test modules imported in this process, by key (a copy)."""
    return dict(sorted(_DECLARED.items()))


def seed(default: int) -> int:
    """The test's seed, or the one `python -m course tolerances` is measuring."""
    chosen = _override()
    return default if chosen is None else chosen


def _override() -> int | None:
    value = os.environ.get(SEED_ENV, "")
    return int(value) if value.strip() else None


def _relative(path: str) -> str:
    from course import REPO_ROOT

    try:
        return os.path.relpath(path, REPO_ROOT) if path else ""
    except ValueError:  # another drive
        return path
