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
