"""Small helpers that distributed lessons share: ports, timeouts, per-rank logs.

They are plumbing, not the lesson: the lessons still call init_process_group,
mp.spawn and torchrun themselves.
"""

from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta

from course.procs import RANK_LOG_ENV


def free_port(host: str = "127.0.0.1") -> int:
    """Ask the OS for a port nobody is listening on.

    A hard-coded MASTER_PORT collides as soon as two jobs (or two tests) run
    on one machine; port 0 lets the kernel pick an unused one.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def no_per_step_buffer_sync() -> dict[str, bool]:
    """DDP's keyword for "do not re-send rank 0's buffers before every forward".

    PyTorch renamed it: up to 2.13 it is `broadcast_buffers=False` (which also
    skips the sync at construction); from 2.14 that name warns, and
    `forward_sync_buffers=False` skips only the per-step sync (buffers are still
    made equal once, when DDP is built). Either way no collective per step.
    """
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def cpu_share(ranks_on_this_machine: int) -> int:
    """How many CPU threads one rank should use for its own CPU math.

    PyTorch starts one OpenMP thread per core in *every* process. N ranks on
    one machine then run N x cores threads that spin-wait for each other, and
    the CPU work of each step (collating, copying, launching kernels) crawls:
    on 2x H200 lesson 03 once ran several times slower on two GPUs than on
    one. So each rank takes its share of the cores. OMP_NUM_THREADS, when set
    (torchrun sets it to 1 for several ranks), wins: it is the user's choice.
    """
    if os.environ.get("OMP_NUM_THREADS", "").strip().isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, ranks_on_this_machine))


def process_group_timeout() -> timedelta:
    """How long a collective may wait for the other ranks before it raises.

    PyTorch's default is 10 minutes (NCCL) or 30 minutes (gloo): far too long
    to notice a mistake while learning. COURSE_PG_TIMEOUT overrides it (seconds).
    """
    return timedelta(seconds=float(os.environ.get("COURSE_PG_TIMEOUT", "120")))


def redirect_output_for_rank(rank: int) -> None:
    """When the grader asks for it, send this rank's stdout and stderr to its
    own file, so that a hang or crash can be traced to the rank that caused it."""
    log_dir = os.environ.get(RANK_LOG_ENV)
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
