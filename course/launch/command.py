"""Run a command the way the grader does: in its own session, under a
deadline, with every process it started killed afterwards.

Distributed code fails by hanging more often than by crashing: one rank waits
in a collective that another rank never reaches. So every launch here has a
deadline, and on timeout the whole process group (the launcher, its ranks and
their DataLoader workers) is killed, and the last lines of each rank's log are
kept for the error message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from course.launch import deadline as core
from course.launch.deadline import Cancel
from course.launch.environment import (
    RANK_LOG_ENV,
    READY_ENV,
    WARM_LAUNCH_ENV,
    WARM_SOCKET_ENV,
    child_env,
    child_user,
    limit,
)
from course.launch.result import PG_TIMEOUT_SHARE, RunResult, timeout_scale

# The optional warm start (launch/warm/pool.py), found where a process loaded it: it builds
# on the launcher, and the launcher never imports it (tests/course/test_layout.py).
WARM_POOL = "course.launch.warm.pool"


def run(
    args: list[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    log_dir: str | Path | None = None,
    one_thread: bool = True,
    stop: threading.Event | None = None,
    cancel: Cancel | None = None,
    course_root: str | Path | None = None,
    after_import: float | None = None,
) -> RunResult:
    """Run `args` to completion or until `timeout` seconds pass (scaled by
    COURSE_TIMEOUT_SCALE), then make sure nothing it started is still alive.
    A launch also ends when `stop` is set (another launch of the same job failed) or
    `cancel` is (the grader's, for the test that asked: its lesson file is broken).
    course_root: the child runs another copy of the course.

    after_import: a second deadline, that many seconds (scaled) after the child finished
    importing torch (the COURSE_READY_LOG probe): a bound on what the child does, which
    a loaded machine's slow start does not eat into. `timeout` still bounds the whole."""
    timeout = timeout * timeout_scale()
    if cancel is not None and cancel.refuses(args):
        return RunResult.not_launched(args, timeout, cancel.refuses(args))
    extra = dict(env or {})
    extra.setdefault("COURSE_PG_TIMEOUT", f"{max(5.0, timeout * PG_TIMEOUT_SHARE):.0f}")
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        extra[RANK_LOG_ENV] = str(log_dir)
    ready_file = None
    if after_import is not None:
        after_import *= timeout_scale()
        ready_file = Path(tempfile.mkdtemp(prefix="course-ready-")) / "ready"
        extra[READY_ENV] = str(ready_file)
    env = child_env(extra, one_thread, course_root)
    # Warm only for the grader's one-thread launches: `course run` and `course bench`
    # start a lesson as a student's shell would; and only where this process loaded the
    # warm start (the grader and the tools do): the launcher never needs it.
    pool = sys.modules.get(WARM_POOL) if one_thread else None
    warm = pool.socket_for(env) if pool is not None else None
    if warm is not None:  # its Python processes start with torch imported (launch/warm/)
        env[WARM_SOCKET_ENV] = warm
        env[WARM_LAUNCH_ENV] = launch = os.urandom(8).hex()
    start, started = time.monotonic(), time.time()
    user = child_user(cwd, log_dir, ready_file and ready_file.parent)
    ready = None  # seconds from the start to the end of the child's `import torch`

    def sooner() -> float | None:  # the after_import deadline, once the child is ready
        nonlocal ready
        if ready is None and ready_file is not None:
            ready = _ready_at(ready_file, started)
        return None if ready is None else start + ready + after_import

    def ended(seconds: float) -> bool:
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return False
        return True

    # A file, not a pipe: a chatty child can never block on a full pipe buffer.
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            [str(a) for a in args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
            start_new_session=True,
            **user,
        )
        pgid = proc.pid
        limit(proc.pid)
        outcome = core.TIMED_OUT
        try:
            outcome = core.watch(ended, start + timeout, stop=stop, cancel=cancel, sooner=sooner)
        finally:
            if proc.poll() is None:  # stopped or timed out: end the launcher first, so
                proc.terminate()  # that its exit status is collected here, not reaped
                try:  # with the group's leftovers by the group kill
                    proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            core.end_group(pgid)
            proc.wait()
            if warm is not None:  # the clients are gone; their children too, by now
                pool.drain(warm, launch)
                pool.release(warm)
        out.seek(0)
        output = out.read().decode(errors="replace")
        if outcome == core.STOPPED:
            output += "\ncourse: stopped, because another launch of the same job failed\n"
        if outcome == core.CANCELLED:
            output += f"\ncourse: stopped: {cancel.reason}\n"
    if ready_file is not None:
        if ready is None:
            ready = _ready_at(ready_file, started)
        shutil.rmtree(ready_file.parent, ignore_errors=True)
    logs = {}
    if log_dir is not None:
        for path in sorted(Path(log_dir).glob("*.log")):
            logs[path.stem] = path.read_text(errors="replace")
    timed_out = outcome == core.TIMED_OUT
    return RunResult(
        args=[str(a) for a in args],
        returncode=None if timed_out or outcome == core.CANCELLED else proc.returncode,
        output=output,
        timed_out=timed_out,
        seconds=time.monotonic() - start,
        timeout=timeout,
        pgid=pgid,
        rank_logs=logs,
        started=started,
        ready=ready,
        after_import=after_import,
    )


def _ready_at(path: Path, started: float) -> float | None:
    """Seconds from `started` (time.time()) to the time the READY_ENV probe wrote."""
    try:
        return max(0.0, float(path.read_text()) - started)
    except (OSError, ValueError):  # not written yet, or being written
        return None


def python(*args: str | Path, **kwargs) -> RunResult:
    """`run` with this interpreter."""
    return run([sys.executable, *map(str, args)], **kwargs)


def run_all(
    jobs: dict[str, dict], fail_fast: bool = False, cancel: Cancel | None = None
) -> dict[str, RunResult]:
    """Several `run(**kwargs)` at once (independent launches overlap their start-up
    costs, which dominate on a small machine); {name: kwargs} -> {name: RunResult}.

    fail_fast: the launches are parts of one job (two torchrun agents, say): as
    soon as one fails, the others are stopped instead of waiting for peers that
    will never come until their timeout. cancel: each launch's, unless its kwargs name one."""
    from concurrent.futures import ThreadPoolExecutor

    stop = threading.Event() if fail_fast else None

    def one(kwargs):
        result = run(**{"cancel": cancel, **kwargs}, stop=stop)
        if stop is not None and not result.ok:
            stop.set()
        return result

    with ThreadPoolExecutor(max_workers=max(len(jobs), 1)) as executor:
        futures = {name: executor.submit(one, kwargs) for name, kwargs in jobs.items()}
        return {name: future.result() for name, future in futures.items()}
