"""Fault injection for tests and demos: kill a rank on purpose, at a known moment.

Fault tolerance that was never exercised does not exist. PyTorch's own
elastic tests kill workers from inside, driven by the environment; so does
this module, so a lesson's code only calls `maybe_kill(rank, step)` and
reads as ordinary training code:

    COURSE_KILL_RANK=1 COURSE_KILL_AT_STEP=6    rank 1 SIGKILLs itself right
                                                after its optimizer step 6
    COURSE_KILL_IN_SAVE=snapshot.pt:2           the process SIGKILLs itself in its
                                                2nd course.checkpoint.save to a file
                                                named snapshot.pt (plain "2": to any
                                                file), after half the temporary file
                                                is written and before the rename

SIGKILL, not an exception: a real crash (out of memory, a lost node, a
segfault) runs no `finally`, no atexit and no destroy_process_group, and
only SIGKILL behaves that way. Each fault fires on the first attempt only
(torchrun's TORCHELASTIC_RESTART_COUNT is "0" or unset), so a restarted
group runs to the end. Before dying, the process prints one line with the
wall-clock time, which the lesson's "first step after the restart" line
turns into a restart overhead.
"""

from __future__ import annotations

import os
import signal
import sys
import time

KILL_RANK = "COURSE_KILL_RANK"
KILL_AT_STEP = "COURSE_KILL_AT_STEP"
KILL_IN_SAVE = "COURSE_KILL_IN_SAVE"

_saves: dict[str, int] = {}


def first_attempt() -> bool:
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


# --8<-- [start:kill]
def _die(what: str) -> None:
    sys.stdout.write(f"chaos: {what}, SIGKILL at t={time.time():.3f}\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def maybe_kill(rank: int, step: int) -> None:
    """SIGKILL this process if the environment asks for `rank` to die at `step`."""
    at = os.environ.get(KILL_AT_STEP)
    if at is None or not first_attempt():
        return
    if int(os.environ.get(KILL_RANK, "0")) == rank and int(at) == step:
        _die(f"rank {rank} killed after step {step}")


# --8<-- [end:kill]


def during_save(file, path) -> None:
    """Called by course.checkpoint.save once the temporary file is written and
    before it is renamed; with COURSE_KILL_IN_SAVE=[NAME:]N, the N-th call (for
    a file named NAME) cuts the file to half its size (a write the crash
    interrupted) and kills the process."""
    name = os.path.basename(path)
    _saves[name] = _saves.get(name, 0) + 1
    _saves[""] = _saves.get("", 0) + 1
    wanted = os.environ.get(KILL_IN_SAVE)
    if wanted is None or not first_attempt():
        return
    target, _, count = wanted.rpartition(":")
    if target not in ("", name) or int(count) != _saves[target]:
        return
    file.flush()
    file.truncate(file.tell() // 2)
    file.flush()
    os.fsync(file.fileno())
    _die(f"killed while writing {os.path.basename(path)} (temporary file half written)")
