"""The one deadline-and-kill core: wait for a launch until it ends, its deadline passes,
or it is stopped or cancelled; then kill its whole process group.

`command.run` (a command), `fork.forked` (a function in a fork) and the grader's warm
grading server (course/grader/warm.py) wait through `watch`, each with its own way of
asking whether the child ended, and end with `end_group`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from course.launch.reaper import kill_group

EXITED, TIMED_OUT, STOPPED, CANCELLED = "exited", "timed out", "stopped", "cancelled"


class Cancel:
    """A reason to end every launch at once: the grader sets one per lesson and cancels it
    when the submission is known broken (it hangs or fails at import, course/grader/plugin.py),
    so that the lesson's other tests fail in a second instead of each waiting out its
    deadline."""

    def __init__(self, broken: dict[str, str] | None = None):
        self.event = threading.Event()
        self.reason = ""
        # Files of a lesson of several known broken ({path: why}): a launch that names one
        # is not started, whatever test asks for it (a launch shared by the lesson's
        # exercises among them), while the others run.
        self.broken = dict(broken or {})

    def set(self, reason: str) -> None:
        self.reason = reason
        self.event.set()

    def refuses(self, args) -> str | None:
        """Why a launch of `args` must not start, or None."""
        if self.event.is_set():
            return self.reason
        return next((self.broken[str(a)] for a in args if str(a) in self.broken), None)


def watch(
    ended: Callable[[float], bool],
    deadline: float,
    *,
    stop: threading.Event | None = None,
    cancel: Cancel | None = None,
    sooner: Callable[[], float | None] | None = None,
    tick: float = 0.2,
) -> str:
    """Wait until `ended(seconds)` (which waits at most that long for the child) says it
    ended, or the `deadline` (time.monotonic()) passes, or `stop` or `cancel` is set.
    `sooner()` may bring the deadline forward (a second deadline that starts when the child
    has imported torch). Returns EXITED, TIMED_OUT, STOPPED or CANCELLED."""
    while True:
        earlier = sooner() if sooner is not None else None
        if earlier is not None:
            deadline = min(deadline, earlier)
        left = deadline - time.monotonic()
        if ended(max(0.0, min(left, tick))):
            return EXITED
        if time.monotonic() >= deadline:
            return TIMED_OUT
        if stop is not None and stop.is_set():
            return STOPPED
        if cancel is not None and cancel.event.is_set():
            return CANCELLED


def end_group(pgid: int) -> None:
    """Kill what is left of the launch's group: also after a success, since a rank or
    worker that outlived its launcher is an orphan."""
    kill_group(pgid)
