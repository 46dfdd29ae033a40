"""Launches bound to one Cancel: what the grader hands a lesson's tests (the `launcher`
fixture), so that a launch naming a lesson file known broken is refused at once, and the
cancel travels as an argument, not through a global."""

from __future__ import annotations

from course.launch import command, fork, torchrun
from course.launch.deadline import Cancel
from course.launch.result import RunResult


class Launcher:
    def __init__(self, cancel: Cancel | None = None):
        self.cancel = cancel

    def run(self, args, **kwargs) -> RunResult:
        return command.run(args, cancel=self.cancel, **kwargs)

    def python(self, *args, **kwargs) -> RunResult:
        return command.python(*args, cancel=self.cancel, **kwargs)

    def run_all(self, jobs: dict[str, dict], fail_fast: bool = False) -> dict[str, RunResult]:
        return command.run_all(jobs, fail_fast, cancel=self.cancel)

    def run_torchrun(self, **kwargs) -> RunResult:
        return torchrun.run_torchrun(cancel=self.cancel, **kwargs)

    def forked(self, fn, **kwargs) -> RunResult:
        return fork.forked(fn, cancel=self.cancel, **kwargs)
