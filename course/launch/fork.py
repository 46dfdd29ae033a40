"""A Python function run in a fork of this process, with `run`'s deadline and group kill."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from course.launch import deadline as core
from course.launch.environment import CHILD_USER_ENV, limit
from course.launch.result import RunResult, timeout_scale


def can_fork() -> bool:
    """Whether `forked` may be used here: Linux, one thread (a fork keeps only the calling
    thread, and a lock another thread held stays held in the child), no
    COURSE_CHILD_USER to switch to (a fork would keep the grader's user), and not an
    xdist worker. A worker talks to its controller through descriptors that the child
    closes; files and sockets the child opens then take their numbers, and what the
    inherited worker code sends its controller (a warning, a log record) lands in them.
    Measured: a gloo rank of lesson 09's case script, forked from a worker's fork, died of
    SIGBUS in every run (never outside xdist), and passed once the child dropped the
    inherited logging handlers and warning hook.

    One thread means one thread of the OS too, not only of Python: CUDA's threads once a
    test has used the GPU, or an OpenMP pool once torch has computed on several threads
    (a grader run without OMP_NUM_THREADS=1), would be forked mid-state (on an H200 the
    import check forked a process with CUDA's threads; Python 3.12 warned of deadlocks).
    There a new interpreter starts instead."""
    return (
        sys.platform.startswith("linux")
        and threading.active_count() == 1
        and _os_threads() == 1
        and not os.environ.get(CHILD_USER_ENV)
        and not os.environ.get("PYTEST_XDIST_WORKER")
    )


def _os_threads() -> int:
    """This process's threads as the OS counts them (native threads included)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def child_exit(fn: Callable[[], object], out: int, cwd: str | Path | None) -> None:
    """In a just-forked child: its own session, output to `out`, run fn, never return."""
    code = 1
    try:
        os.setsid()
        limit(os.getpid())
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # nothing of the parent's stays open
        # pytest's capture replaced sys.stdout and sys.stderr: write to the fds again.
        sys.stdout = open(1, "w", buffering=1, errors="replace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, errors="replace", closefd=False)
        import faulthandler

        # pytest enables faulthandler on a copy of its stderr, a descriptor closed above:
        # a later file can take its number, and a crash report would land in that file.
        if faulthandler.is_enabled():
            faulthandler.enable(file=sys.stderr)
        if cwd is not None:
            os.chdir(cwd)
        result = fn()
        code = result if isinstance(result, int) else 0
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
    except BaseException:  # noqa: BLE001 - the child reports everything, then exits
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def forked(
    fn: Callable[[], object],
    *,
    args: list[str],
    timeout: float,
    cwd: str | Path | None = None,
    cancel: core.Cancel | None = None,
) -> RunResult:
    """`run` for a Python function instead of a command: fn() runs in a fork of this
    process (its own session, the same deadline and group kill, output to a file), so a
    child that needs what this process has imported (torch: 2 s of CPU per interpreter)
    starts in milliseconds. fn's int result, or SystemExit's code, is the exit code.
    `args` only names the work in describe(); cancel: as run's. Only where can_fork()."""
    if not can_fork():
        raise RuntimeError("launch.forked needs a single-threaded process on Linux")
    timeout = timeout * timeout_scale()
    if cancel is not None and cancel.refuses(args):
        return RunResult.not_launched(args, timeout, cancel.refuses(args))
    start = time.monotonic()
    with tempfile.TemporaryFile() as out:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            child_exit(fn, out.fileno(), cwd)
        status = None

        def ended(seconds: float) -> bool:
            nonlocal status
            until = time.monotonic() + seconds
            while True:
                done, raw = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = raw
                    return True
                if time.monotonic() >= until:
                    return False
                time.sleep(0.02)

        timed_out = core.watch(ended, start + timeout) == core.TIMED_OUT
        if timed_out:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:  # killed before its setsid()
                os.kill(pid, signal.SIGKILL)
            status = os.waitpid(pid, 0)[1]
        core.end_group(pid)  # also on success: what the child started does not outlive it
        out.seek(0)
        output = out.read().decode(errors="replace")
    return RunResult(
        args=[str(a) for a in args],
        returncode=None if timed_out else os.waitstatus_to_exitcode(status),
        output=output,
        timed_out=timed_out,
        seconds=time.monotonic() - start,
        timeout=timeout,
        pgid=pid,
    )
