"""Each rank's output in a file of its own, so that a hang or a crash can be
traced to the rank that caused it.

With COURSE_RANK_LOG_DIR=DIR in the environment (course.launch sets it for
the grader's distributed runs), every process of a lesson that knows its
rank sends its stdout and stderr to DIR/rank<R>.log. The lessons never call
this; course/probes/__init__.py installs it at start-up:

- a process started by torchrun knows its rank from $RANK at once;
- a process started by mp.spawn learns it when mp.spawn's wrapper calls the
  worker with its index: that wrapper is wrapped, before the child unpickles
  its task.

Processes without a rank (the mp.spawn parent, torchrun's agent) keep their
output where it was, so the launcher's own messages stay in the main log.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback

LOG_DIR_ENV = "COURSE_RANK_LOG_DIR"


def redirect_output_for_rank(rank: int) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to DIR/rank<R>.log."""
    log_dir = os.environ.get(LOG_DIR_ENV)
    if not log_dir:
        return
    os.makedirs(log_dir, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(
        os.path.join(log_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
    )
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _traced(fn, *args, **kwargs):
    """Run an mp.spawn worker; if it raises, write its error, one line, to this rank's log.
    mp.spawn sends a failed worker's traceback to the parent, which prints only the first
    failure it sees: when a collective times out on rank 0, rank 1 fails a moment later
    ("Connection closed by peer"), and the parent may show rank 1's error alone. Seen in a
    CI run (2026-12-03): the timeout, the one line that says "hang", was in no output.
    One line, not the traceback: the log's last lines also show where the rank was."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        line = traceback.format_exception_only(exc)[-1].strip()
        print(f"rank error: {line}", file=sys.stderr, flush=True)
        raise


def install() -> None:
    rank = os.environ.get("RANK", "")
    if rank.isdigit():
        redirect_output_for_rank(int(rank))
    elif "--multiprocessing-fork" in sys.argv:  # a child of multiprocessing's spawn method
        import importlib

        try:  # by name: torch.multiprocessing's attribute `spawn` is the function
            spawn = importlib.import_module("torch.multiprocessing.spawn")
        except ImportError:
            return
        original = spawn._wrap

        def _wrap(fn, i, *args, **kwargs):
            redirect_output_for_rank(i)
            return original(functools.partial(_traced, fn), i, *args, **kwargs)

        spawn._wrap = _wrap
