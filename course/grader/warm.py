"""Many gradings, one warm Python: pytest and torch imported once, a fork per grading.

tests/mutants/test_mutants.py grades about ninety copies of the solutions, each as
`python -m pytest tests/lessons/test_NN_*.py --impl=COPY ...` would. A fresh interpreter spends
3 s of CPU importing pytest and torch before it collects a test (2 cores, measured
2026-12-01), a quarter of a typical mutant's grading. Here one server process,
started with the environment `launch.run` gives a grading, imports them once; for each
request it forks a child that runs `pytest.main(args)`, in a session of its own, with
output to a file. The child imports the test modules, the grader plugin and the
submission's helpers itself, as a fresh grading does, so no state of one grading
reaches the next. The caller keeps the deadline and kills the child's whole group,
exactly as `launch.run` does, and gets the same `launch.RunResult`.

    with warm.Server(root) as server:
        result = server.run(grading, timeout=300, cwd=root)

`grading` (course/grader/grading.py) is what `python -m course grade` runs: its pytest
arguments are what the child runs, and the server starts its command the ordinary way
if the server cannot (it died, or this platform cannot fork).
"""

from __future__ import annotations

import functools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from course import launch
from course.launch import deadline
from course.launch.warm import pool  # the gradings' launches start warm

if TYPE_CHECKING:
    from course.grader.grading import Grading

# What a lesson's tests import, loaded once in the server (not the test modules, the
# conftest or course.grader.plugin: pytest imports those itself, to rewrite their asserts).
# Third-party modules by name; the course's own by import statements (_preload_course),
# so that the layout test and a reader see them.
PRELOAD = (
    "pytest",
    "torch",
    "torch.distributed",
    "torch._dynamo",  # for the gradings' zygotes (pool.fork_zygote): 3 s each, else
    "torch.multiprocessing",
    "torch.utils.data",
)


def _preload_course() -> None:
    import course.checkpoint  # noqa: F401
    import course.grader.case_runs  # noqa: F401
    import course.grader.judge  # noqa: F401
    import course.grader.launches  # noqa: F401
    import course.probes.ddp_log  # noqa: F401
    import course.probes.weight_log  # noqa: F401


def preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    _preload_course()


def serve() -> None:
    """The server's loop: one JSON request per line on stdin, two replies per request
    on stdout ({"pid"} when the child started, {"pid", "status"} when it ended)."""
    preload()

    replies = os.fdopen(os.dup(1), "w", buffering=1)
    for line in sys.stdin:
        job = json.loads(line)
        out = os.open(job["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            sys.argv = ["pytest", *job["args"]]
            launch.child_exit(functools.partial(_grade, job["args"]), out, job["cwd"])
        os.close(out)
        replies.write(json.dumps({"pid": pid}) + "\n")
        status = os.waitpid(pid, 0)[1]
        replies.write(json.dumps({"pid": pid, "status": status}) + "\n")


def _grade(args: list[str]) -> int:
    """One grading, in a fork of the server. Its launches' Python processes are forks of
    a zygote (course/launch/warm/) that is itself a fork of this process, made before
    pytest starts: torch and torch._dynamo imported already, and nothing of pytest's run."""
    import pytest

    pool.fork_zygote()
    return pytest.main(args)


class Server:
    """A warm grading server for the course at `root` (its tests and grader)."""

    def __init__(self, root: str | Path, env: dict[str, str | None] | None = None):
        """env: variables every grading it runs gets on top of launch's (a GPU box's
        mutants grade on gloo with CUDA_VISIBLE_DEVICES="": no CUDA start-up per rank)."""
        self.root, self.env = Path(root), env
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        if sys.platform.startswith("linux"):
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "course.grader.warm"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=self.root,
                env=launch.child_env(self.env, course_root=self.root),
                start_new_session=True,
                text=True,
            )
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            launch.kill_group(self.proc.pid)
            self.proc.wait()
            self.proc = None

    def _reply(self, deadline: float | None) -> dict | None:
        """The server's next reply; None at the deadline, or if the server is gone."""
        stream = self.proc.stdout
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if select.select([stream], [], [], left)[0]:
            line = stream.readline()
            return json.loads(line) if line else None
        return None

    def run(self, grading: Grading, *, timeout: float, cwd: str | Path) -> launch.RunResult:
        """`launch.run(grading.command(), timeout=timeout, cwd=cwd, course_root=root)`, warm."""
        command = grading.command()
        if self.proc is None or self.proc.poll() is not None:
            return launch.run(command, timeout=timeout, cwd=cwd, env=self.env,
                              course_root=self.root)  # fmt: skip
        args = grading.pytest_args()
        start, unscaled, timeout = time.monotonic(), timeout, timeout * launch.timeout_scale()
        with tempfile.NamedTemporaryFile(prefix="course-grade-", suffix=".out") as out:
            request = {"args": args, "cwd": str(cwd), "output": out.name}
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            started = self._reply(time.monotonic() + 60)
            if started is None:  # the server died: grade the ordinary way
                self.proc.kill()
                return launch.run(command, timeout=unscaled, cwd=cwd, course_root=self.root)
            pid, ended = started["pid"], {}

            def finished(seconds: float) -> bool:
                reply = self._reply(time.monotonic() + seconds)
                if reply is not None:
                    ended.update(reply)
                return reply is not None or self.proc.poll() is not None

            timed_out = deadline.watch(finished, start + timeout) == deadline.TIMED_OUT
            if timed_out:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                ended.update(self._reply(time.monotonic() + 30) or {})
            deadline.end_group(pid)  # what the grading started does not outlive it
            output = Path(out.name).read_text(errors="replace")
        status = ended.get("status")
        return launch.RunResult(
            args=[str(a) for a in command],
            returncode=None if timed_out or status is None else os.waitstatus_to_exitcode(status),
            output=output,
            timed_out=timed_out,
            seconds=time.monotonic() - start,
            timeout=timeout,
            pgid=pid,
        )


def grade_once(args: list[str]) -> int:
    """One grading in this process, with its zygote forked from it first: what `python -m
    course grade` runs without -n (`python -m course.grader.warm --once PYTEST_ARGS`, a
    Grading's warm_command). A
    plain `python -m pytest` imports torch for the tests, and its zygote imports it again
    in an interpreter of its own: lesson 00's grading took 9.7-10.8 s of CPU that way,
    5.4-5.6 s this way (2 cores, idle, 2026-12-04). Where no zygote can be forked (GPUs, another
    user for the children), nothing is preloaded: pytest starts as it would."""

    from course.launch.warm import protocol

    if launch.can_fork() and protocol.allowed(launch.child_env()):
        preload()
    return _grade(args)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--once"]:
        sys.exit(grade_once(sys.argv[2:]))
    serve()
