"""The grader's launches survive hanging ranks: two planted hangs, a rank that never joins
a collective and a barrier that only rank 0 calls, end within their deadlines with every
process of the launch gone and one report that names the cause.

Their own file: the grader's scheduler (course/grader/plugin.py) sends a file's tests to
one worker, so that the two launches, which mostly wait, overlap
(tests/course/grader/test_plugin.py's
tests are spread test by test).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from course import launch

# Deadlines of the two planted hangs below. Both ranks printed 3.2-4.0 s after the start
# on an idle two-core machine (2026-12-01); importing torch is 2.7x slower with four busy
# loops (grading.IMPORT_DEADLINE_S), so about 11 s loaded. Beside a busy loop *and* the
# other worker's launches (2026-12-03, twice), that was not enough: the hang's rank 1 had
# not printed within 25 s, and the barrier's ranks, whose 18 s timeout had fired, had not
# exited 36 s after the start. The hang is now killed at 40 s, and the barrier's
# process-group timeout, half its 60 s deadline, leaves 30 s for the start and the exit.
HANG_DEADLINE_S = 40
BARRIER_DEADLINE_S = 60

# Neither script imports course.ranks (and with it torch._dynamo, 2.3 s of CPU a process):
# in a CI run beside a busy loop the barrier's three processes had not both reached the
# collective's timeout within the deadline, and the hang's rank 1 had not printed in 25 s.
FREE_PORT = """
def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
"""

HANG = (
    """
import sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
"""
    + FREE_PORT
    + """

def worker(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    if rank == 1:
        print("rank 1 skips the all-reduce", flush=True)
        time.sleep(3600)
    print("rank 0 waits in all_reduce", flush=True)
    dist.all_reduce(torch.ones(1))

if __name__ == "__main__":
    mp.spawn(worker, args=(free_port(),), nprocs=2)
"""
)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The two planted hangs below, launched at once when the first of their tests asks
    (both mostly wait: 40 s and 30 s together instead of one after the other); each test
    waits for its own. One left running when the module ends (its test ran on another
    xdist worker) is stopped then."""
    stop = threading.Event()
    scripts = {"hang": (HANG, HANG_DEADLINE_S), "barrier": (BARRIER_ON_RANK_0, BARRIER_DEADLINE_S)}
    pool = ThreadPoolExecutor(max_workers=len(scripts))
    futures = {}
    for name, (text, deadline) in scripts.items():
        folder = tmp_path_factory.mktemp(name)
        script = folder / f"{name}.py"
        script.write_text(text)
        futures[name] = pool.submit(
            launch.python, script, timeout=deadline, log_dir=folder / "ranks", cwd=folder, stop=stop
        )
    try:
        yield futures
    finally:
        stop.set()
        pool.shutdown(wait=True)


def test_rank_that_never_joins_a_collective_is_killed_with_its_group(planted):
    # Long enough for both ranks to start and print on a loaded 2-core machine
    # (the lines below are asserted; HANG_DEADLINE_S); the hang itself would last an hour.
    result = planted["hang"].result()
    assert result.timed_out and not result.ok
    assert not launch.group_alive(result.pgid), "processes outlived the timeout"
    message = result.describe()
    assert "did not finish within" in message
    assert "rank 1 skips the all-reduce" in message
    assert "rank 0 waits in all_reduce" in message
    assert launch.HANG_CAUSE in message, "a hang's report names its likely cause"


BARRIER_ON_RANK_0 = (
    """
import os, datetime
import torch, torch.distributed as dist, torch.multiprocessing as mp
"""
    + FREE_PORT
    + """
def worker(rank, port):
    timeout = datetime.timedelta(seconds=float(os.environ["COURSE_PG_TIMEOUT"]))  # course.launch
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timeout)
    for step in range(3):
        print(f"rank {rank} at step {step}", flush=True)
        if rank == 0:
            dist.barrier()  # the classic bug: a collective only one rank calls
        dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(free_port(),), nprocs=2)
"""
)


def test_a_rank_0_only_barrier_is_reported_once_before_the_deadline(planted):
    """The launch's process-group timeout is half its deadline, so PyTorch names the stuck
    collective before the grader has to kill anything; the report shows both ranks and the cause."""
    result = planted["barrier"].result()
    assert not result.ok
    assert not launch.group_alive(result.pgid), "processes outlived the launch"
    message = result.failure()
    assert not result.timed_out, f"PyTorch's timeout should fire before the deadline\n{message}"
    assert "rank 0 at step 0" in message and "rank 1 at step" in message, message
    assert message.count(launch.HANG_CAUSE) == 1, message
    assert "shared launch failed" in result.failure(), "a second test gets one line, not a copy"
