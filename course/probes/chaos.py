"""Fault injection for tests and demos: kill a rank on purpose, at a known moment.

Fault tolerance that was never exercised does not exist. The faults are
injected from inside the lesson's processes, driven by the environment, and
need nothing from the lesson's code: course/probes/_site/sitecustomize.py calls
`install()` in every process that `python -m course run` or the grader
starts (it is on their PYTHONPATH).

    COURSE_KILL_RANK=1 COURSE_KILL_AT_STEP=6    rank 1 SIGKILLs itself right
                                                after its optimizer step 6
    COURSE_KILL_AT_STEP=6,3                     ... and, restarted, after the 3rd
                                                step of the second attempt
    COURSE_KILL_IN_SAVE=snapshot.pt:2           the process SIGKILLs itself the
                                                2nd time it puts a file named
                                                snapshot.pt in place (see below)
    COURSE_SWAP_ALL_REDUCE=1                    rank 1's first torch.distributed.
                                                all_reduce runs a broadcast instead:
                                                ranks out of step (lesson 09's hang)
    COURSE_LATE_ALL_REDUCE=1:8                  rank 1 reaches its first all_reduce 8 s
                                                late (lesson 09: does a collective give up
                                                after the group's timeout?)
    COURSE_SLOW_STORE_READ=1:1                  rank 1's TCPStore reads (get, multi_get)
                                                each take 1 s more (lesson 09: does rank
                                                0 keep the store until the others read?)

"Putting a file in place" is what a crash interrupts: for a careful writer,
the rename of a finished temporary file onto snapshot.pt (the process dies
just before it, so the old snapshot stays); for a writer that opens
snapshot.pt itself (open or torch.save to that name), the overwrite (the
process leaves the old file cut to half its size, as a crash mid-write
would, and dies).

SIGKILL, not an exception: a real crash (out of memory, a lost node, a
segfault) runs no `finally`, no atexit and no destroy_process_group, and
only SIGKILL behaves that way. A fault fires on the first attempt only
(torchrun's TORCHELASTIC_RESTART_COUNT is "0" or unset), except the step
kills listed for later attempts, so a restarted group runs to the end.
Steps are counted per process: a restarted rank counts from 1 again.
Before dying, the process prints one line with the wall-clock time; after a
restart, every process prints the time of its first optimizer step: the
difference is the restart overhead.
"""

from __future__ import annotations

import os
import signal
import sys
import time

KILL_RANK = "COURSE_KILL_RANK"
KILL_AT_STEP = "COURSE_KILL_AT_STEP"
KILL_IN_SAVE = "COURSE_KILL_IN_SAVE"
SWAP_ALL_REDUCE = "COURSE_SWAP_ALL_REDUCE"
LATE_ALL_REDUCE = "COURSE_LATE_ALL_REDUCE"
SLOW_STORE_READ = "COURSE_SLOW_STORE_READ"


def first_attempt() -> bool:
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


# --8<-- [start:kill]
def _die(what: str) -> None:
    # stderr: a lesson may silence stdout on ranks other than 0
    sys.stderr.write(f"chaos: {what}, SIGKILL at t={time.time():.3f}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def kill_after_step(rank: int, at: int) -> None:
    """SIGKILL this process right after its optimizer step `at`, if it is `rank`."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from course.probes.write_log import current_rank

    steps = 0

    def after_step(_optimizer, _args, _kwargs) -> None:
        nonlocal steps
        steps += 1
        if steps == at and current_rank() == rank:
            _die(f"rank {rank} killed after step {at}")

    register_optimizer_step_post_hook(after_step)


# --8<-- [end:kill]


def kill_in_save(name: str, nth: int) -> None:
    """SIGKILL this process the nth time it puts a file called `name` in place."""
    from course.probes.write_log import opened_for_writing

    count = 0

    def placed(path: str) -> bool:
        nonlocal count
        if os.path.basename(os.fsdecode(path)) != name:
            return False
        count += 1
        return count == nth

    def overwrite_interrupted(path: str) -> None:
        if os.path.isfile(path):
            os.truncate(path, os.path.getsize(path) // 2)
        _die(f"killed while overwriting {name} in place (left half of it)")

    def hook(event: str, args) -> None:
        if event == "os.rename" and placed(args[1]):
            _die(f"killed just before renaming a finished temporary file onto {name}")
        elif event == "open":
            path = opened_for_writing(args)
            if path is not None and placed(path):
                overwrite_interrupted(path)

    sys.addaudithook(hook)

    import torch

    save = torch.save

    def save_or_die(obj, f, *a, **kw):
        if isinstance(f, (str, bytes, os.PathLike)) and placed(f):
            overwrite_interrupted(os.fsdecode(f))
        return save(obj, f, *a, **kw)

    torch.save = save_or_die


def swap_first_all_reduce(rank: int) -> None:
    """On `rank`, the first torch.distributed.all_reduce runs a broadcast instead: one rank
    calls another collective than its peers, planted in any code that all-reduces through
    the module's function (lesson 09's `hang.py --diagnose` is graded on it)."""
    import torch.distributed as dist

    from course.probes.write_log import current_rank

    all_reduce, swapped = dist.all_reduce, False

    def all_reduce_or_broadcast(tensor, *args, **kwargs):
        nonlocal swapped
        if swapped or current_rank() != rank:
            return all_reduce(tensor, *args, **kwargs)
        swapped = True
        sys.stderr.write(f"chaos: rank {rank} broadcasts where its peers all-reduce\n")
        sys.stderr.flush()
        return dist.broadcast(tensor, src=0 if rank else 1, group=kwargs.get("group"))

    dist.all_reduce = all_reduce_or_broadcast


def rank_and_seconds(value: str) -> tuple[int, float]:
    """ "1:8" -> (1, 8.0): a probe's rank and its seconds."""
    rank, _, seconds = value.partition(":")
    return int(rank), float(seconds)


def late_first_all_reduce(rank: int, seconds: float) -> None:
    """On `rank`, the first torch.distributed.all_reduce starts `seconds` late: its peers
    wait in theirs, as behind a slow rank, until the group's timeout ends the wait."""
    import torch.distributed as dist

    from course.probes.write_log import current_rank

    all_reduce, late = dist.all_reduce, False

    def all_reduce_late(tensor, *args, **kwargs):
        nonlocal late
        if not late and current_rank() == rank:
            late = True
            sys.stderr.write(f"chaos: rank {rank} reaches its all_reduce {seconds:g} s late\n")
            sys.stderr.flush()
            time.sleep(seconds)
        return all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = all_reduce_late


def slow_store_reads(rank: int, seconds: float) -> None:
    """On `rank`, every TCPStore get and multi_get waits `seconds` first: a rank that
    reads the store late, after a peer that does not wait for it may have left."""
    import torch.distributed as dist

    from course.probes.write_log import current_rank

    if current_rank() != rank:
        return
    for name in ("get", "multi_get"):
        read = getattr(dist.TCPStore, name)

        def slow(self, *args, _read=read, **kwargs):
            time.sleep(seconds)
            return _read(self, *args, **kwargs)

        setattr(dist.TCPStore, name, slow)


def note_first_step() -> None:
    """On rank 0, print the wall-clock time of this process's first optimizer step:
    after a restart, minus the kill's time, it is the restart overhead."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from course.probes.write_log import current_rank

    done = False

    def after_step(_optimizer, _args, _kwargs) -> None:
        nonlocal done  # (removing the hook inside it would mutate the dict being iterated)
        if not done and current_rank() <= 0:
            done = True
            sys.stderr.write(f"chaos: first step after the restart done at t={time.time():.3f}\n")
            sys.stderr.flush()

    register_optimizer_step_post_hook(after_step)


def install() -> None:
    """Arm the faults the environment asks for, for this attempt."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    steps = [s for s in os.environ.get(KILL_AT_STEP, "").split(",") if s.strip()]
    if attempt > 0 and (steps or os.environ.get(KILL_IN_SAVE)):
        note_first_step()
    if attempt < len(steps):
        kill_after_step(int(os.environ.get(KILL_RANK, "0")), int(steps[attempt]))
    if not first_attempt():
        return
    if os.environ.get(KILL_IN_SAVE):
        target, _, nth = os.environ[KILL_IN_SAVE].rpartition(":")
        kill_in_save(target, int(nth))
    if os.environ.get(SWAP_ALL_REDUCE):
        swap_first_all_reduce(int(os.environ[SWAP_ALL_REDUCE]))
    if os.environ.get(LATE_ALL_REDUCE):
        late_first_all_reduce(*rank_and_seconds(os.environ[LATE_ALL_REDUCE]))
    if os.environ.get(SLOW_STORE_READ):
        slow_store_reads(*rank_and_seconds(os.environ[SLOW_STORE_READ]))
