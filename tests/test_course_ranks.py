"""course.ranks: CPU shares, backend choice, the torchrun check, means over ranks."""

from __future__ import annotations

import os

import pytest

from course.ranks import cpu_share


def test_cpu_share_splits_the_cores_between_the_ranks(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert cpu_share(1) == cores
    assert cpu_share(2) == max(1, cores // 2)
    assert cpu_share(10 * cores) == 1  # never zero threads


def test_omp_num_threads_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_share(2) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "not a number")
    assert cpu_share(1) == len(os.sched_getaffinity(0))


def test_backend_and_world_size_without_gpus(monkeypatch):
    import torch

    from course import ranks

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ranks.backend_and_world_size(None, None) == ("gloo", 2)
    assert ranks.backend_and_world_size("gloo", 3) == ("gloo", 3)
    with pytest.raises(ValueError, match="needs CUDA GPUs and this machine has none"):
        ranks.backend_and_world_size("nccl", 2)
    with pytest.raises(ValueError, match="needs CUDA GPUs and this machine has none"):
        ranks.backend_and_world_size("nccl", None)  # used to give 0 ranks and exit 0
    with pytest.raises(ValueError, match="--sync-bn needs --backend nccl"):
        ranks.backend_and_world_size(None, None, sync_bn=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="needs 2 GPUs"):
        ranks.backend_and_world_size("nccl", 2)


def test_require_torchrun(monkeypatch, capsys):
    import torch

    from course import ranks

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(ValueError, match="start me with torchrun"):
        ranks.require_torchrun()
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ranks.require_torchrun() == "gloo"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in capsys.readouterr().out


def test_mean_over_ranks_in_a_one_rank_group(tmp_path):
    import torch.distributed as dist

    from course import ranks

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        assert ranks.mean_over_ranks(0.5, 4) == (0.5, 4)
        assert ranks.mean_over_ranks(0.0, 0) == (0.0, 0)  # an epoch with nothing left to train
    finally:
        dist.destroy_process_group()


GROUP_THREADS = """
import gc, os, sys
if sys.argv[1] == "early":
    from course import ranks  # imports torch._dynamo: before the group exists
import torch, torch.distributed as dist
threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))])  # imports torch._dynamo, if not yet
dist.barrier()
dist.destroy_process_group()
gc.collect()
print(before, threads())
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_destroy_process_group_frees_the_group_after_course_ranks(tmp_path):
    """Imported before the group exists (course.ranks does it), torch._dynamo holds no
    reference to it, and destroy_process_group() ends the group's threads; imported after,
    as the first optimizer or DDP does, it keeps the group, whose worker threads then abort
    a process at shutdown now and then (see course/ranks.py)."""
    import sys

    from course import procs

    counts = {}
    for order in ("early", "late"):
        result = procs.run(
            args=[sys.executable, "-c", GROUP_THREADS, order, str(tmp_path / f"{order}.store")],
            timeout=60,
        )
        assert result.returncode == 0, result.describe()
        counts[order] = [int(n) for n in result.output.split()[-2:]]
    before, after = counts["early"]
    assert after <= before, (
        f"with course.ranks imported first, the process had {before} threads before the group "
        f"and {after} after destroy_process_group: the group outlived it"
    )
    before, after = counts["late"]
    # The control, measured with PyTorch 2.14.1: imported late, the group survives. A
    # PyTorch that fixed this prints so; the early import then costs only its time.
    print(f"torch._dynamo imported after the group: {before} threads before, {after} after")
