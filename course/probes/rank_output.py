"""Each rank's output in a file of its own, so that a hang or a crash can be
traced to the rank that caused it.

With COURSE_RANK_LOG_DIR=DIR in the environment (course.procs sets it for
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

import os
import sys

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
            return original(fn, i, *args, **kwargs)

        spawn._wrap = _wrap
