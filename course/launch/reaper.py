"""Killing what a launch started: its process group, and orphans that left the group."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def group_alive(pgid: int) -> bool:
    _reap(pgid)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap(pgid: int) -> None:
    """Collect the exit status of this group's dead processes that are our children
    (orphans adopted by a subreaper): otherwise they linger as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_group(pgid: int, grace: float = 3.0) -> None:
    """SIGTERM the group, give it `grace` seconds to exit, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return
            time.sleep(0.05)


def become_subreaper() -> bool:
    """Make this process adopt every orphan among its descendants (Linux).

    A child that double-forks or calls setsid leaves its process group, and
    kill_group cannot reach it; as a subreaper this process still finds it
    (kill_descendants). False where the platform has no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    pr_set_child_subreaper = 36
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) == 0


def descendants(pid: int | None = None) -> list[int]:
    """Every living descendant of `pid` (this process by default), from /proc."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) "
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants() -> list[int]:
    """SIGKILL every descendant of this process; returns their pids."""
    pids = descendants()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:  # reap the ones that are our children (the adopted orphans)
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    return pids
