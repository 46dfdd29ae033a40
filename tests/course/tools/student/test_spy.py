"""python -m course spy: each rank's stack once a job is stuck, and one-line errors."""

from __future__ import annotations

import sys

import pytest

from course import launch
from course.tools.student import spy

STUCK = """
import datetime, torch, torch.distributed as dist, torch.multiprocessing as mp
from course import ranks

def work(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))
    if rank == 0:
        dist.barrier()  # rank 1 never calls it
    else:
        dist.all_reduce(torch.ones(1))

if __name__ == "__main__":
    mp.spawn(work, args=(ranks.free_port(),), nprocs=2)
"""


def test_spy_prints_where_each_rank_waits(tmp_path):
    """Rank 0 waits in barrier(), rank 1 in all_reduce(): spy names each rank and its
    collective, then ends the job (exit 0, well before the group's 60 s timeout)."""
    if why := spy.unavailable():
        pytest.skip(why)
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    result = launch.run(args=[sys.executable, "-m", "course", "spy", str(script)], timeout=90)
    assert result.returncode == 0, result.describe()
    out = result.output
    rank0, rank1 = out.split("rank 0, main thread")[1].split("rank 1, main thread")
    assert "barrier (" in rank0 and "all_reduce (" not in rank0, out
    assert "all_reduce (" in rank1 and "barrier (" not in rank1, out
    assert "work (stuck.py:" in rank0 and "work (stuck.py:" in rank1, out


def test_spy_refuses_a_missing_script_in_one_line(tmp_path):
    result = launch.run(
        args=[sys.executable, "-m", "course", "spy", str(tmp_path / "nope.py")], timeout=60
    )
    assert result.returncode == 2
    assert (
        result.output.strip().splitlines()[-1]
        == (f"python -m course spy: error: {tmp_path / 'nope.py'}: no such script")
        or "py-spy is not installed" in result.output
    )


C10D = "torch/distributed/distributed_c10d.py"
JOINING = [
    ("_create_c10d_store", "torch/distributed/rendezvous.py", "215"),
    ("init_process_group", C10D, "2546"),
    ("run", "hang.py", "75"),
]
IN_ALL_REDUCE = [("all_reduce", C10D, "3913"), ("train", "hang.py", "50")]
IN_BARRIER = [("barrier", C10D, "4900"), ("train", "hang.py", "53")]


def test_spy_waits_for_every_rank_to_join_before_it_calls_a_job_stuck():
    """What a loaded CI run once printed as the answer: rank 2 alone, still joining the group
    while ranks 0 and 1 imported torch. A rank in the rendezvous, or ranks with a gap below
    them, are a job still starting; ranks 0..n-1 each in a collective are stuck."""
    assert not spy.stuck([(2, JOINING)])  # alone, and joining
    assert not spy.stuck([(2, IN_BARRIER)])  # ranks 0 and 1 not found yet
    assert not spy.stuck([(0, IN_ALL_REDUCE), (1, JOINING)])
    assert not spy.stuck([(0, [("<module>", "torch/distributed/__init__.py", "1")])])
    assert not spy.stuck([])
    assert spy.stuck([(0, IN_ALL_REDUCE), (1, IN_ALL_REDUCE), (2, IN_BARRIER)])
    assert spy.stuck([(0, IN_BARRIER)])  # a one-rank job waiting in a collective
