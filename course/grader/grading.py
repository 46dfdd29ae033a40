"""One grading as data: the tests, the submission, pytest's options. The one owner of a
grading's command line; each caller asks for the form it needs, and nobody parses one back.

    grading = of_lessons(["12"], "lessons")                # `python -m course grade 12`
    grading.with_options("-k", "ring", "-x").command()    # python -m pytest ... (cold)
    grading.warm_command()                                 # one process, launches forked
    warm.Server(root).run(grading, timeout=300, cwd=root)  # a fork of a warm server
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from course import REPO_ROOT, registry

# pytest's options for a grading in one process: no cache in the student's folder, no xdist,
# and none of the plugins a grading never uses, each costly in every grading's start (2
# cores, idle, in a warm fork, measured 2026-12-07): anyio's imports its event loops and
# platformdirs' its package, both rewritten by pytest (0.4 s); xdist's looponfail brings
# xdist back in; unraisableexception's clean-up runs gc.collect twice over torch's (0.38 s).
ONE_PROCESS = (
    *("-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:xdist.looponfail"),
    *("-p", "no:anyio", "-p", "no:platformdirs", "-p", "no:unraisableexception"),
)
QUIET = ("-q", "--no-header")


@dataclasses.dataclass(frozen=True)
class Grading:
    """pytest over `tests` (files or node ids) with `--impl=impl` (the plugin's default
    where None), then `options`; in one process, or over `workers` xdist workers."""

    tests: tuple[str, ...]
    impl: str | None = None
    options: tuple[str, ...] = ()
    workers: int = 0

    def with_options(self, *more: str) -> Grading:
        return dataclasses.replace(self, options=(*self.options, *more))

    def pytest_args(self) -> list[str]:
        impl = [f"--impl={self.impl}"] if self.impl is not None else []
        processes = ["-n", str(self.workers)] if self.workers else list(ONE_PROCESS)
        return [*self.tests, *impl, *QUIET, *self.options, *processes]

    def command(self) -> list[str]:
        """`python -m pytest ...`: a plain grading, cold."""
        return [sys.executable, "-m", "pytest", *self.pytest_args()]

    def warm_command(self) -> list[str]:
        """One process whose launches fork from it (course/grader/warm.py: grade_once);
        with workers, the plain command."""
        if self.workers:
            return self.command()
        return [sys.executable, "-m", "course.grader.warm", "--once", *self.pytest_args()]


def of_lessons(numbers, impl, grade_json=None, workers: int = 0, root: Path = REPO_ROOT,
               keyword: str | None = None) -> Grading:  # fmt: skip
    """The grading of lessons `numbers` (all when empty) of `impl`, with the tests of the
    course at `root`; with `keyword`, only the tests it selects."""
    chosen = [registry.get(n) for n in numbers] or list(registry.LESSONS)
    files = []
    for lesson in chosen:
        found = registry.tests(lesson, root)
        if not found:
            raise FileNotFoundError(f"lesson {lesson.number} has no tests in tests/")
        files += [str(f) for f in found]
    options = ["-rN", *([f"--grade-json={grade_json}"] if grade_json else [])]
    options += ["-k", keyword] if keyword else []
    return Grading(tuple(files), str(impl), tuple(options), workers)
