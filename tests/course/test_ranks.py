"""course.ranks: CPU shares, backend choice, the torchrun check, means over ranks."""

from __future__ import annotations

import io
import os
import sys

import pytest

from course.ranks import cpu_share, from_environment


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


class _Writes(io.RawIOBase):
    """A raw stream that keeps each write apart, as a pipe's write(2) calls are."""

    def __init__(self):
        self.calls: list[bytes] = []

    def writable(self):
        return True

    def write(self, b):
        self.calls.append(bytes(b))
        return len(b)


def test_say_writes_whole_lines_at_once_where_print_splits_them(monkeypatch):
    from course import ranks

    raw = _Writes()  # stdout as a launch makes it: PYTHONUNBUFFERED, the text layer writes through
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, write_through=True))
    print("stage 0: a line", flush=True)
    assert raw.calls == [b"stage 0: a line", b"\n"]  # the splice ranks can make, if print did it
    raw.calls.clear()
    ranks.say("stage 1: one", "stage 1: two")
    assert raw.calls == [b"stage 1: one\nstage 1: two\n"]


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


GROUP_HOLDERS = """
import gc, sys
if sys.argv[1] == "early":
    from course import ranks  # imports torch._dynamo: before the group exists
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))])  # imports torch._dynamo, if not yet
dist.barrier()
group = dist.group.WORLD
dist.destroy_process_group()
gc.collect()
print(sys.getrefcount(group) - 2)  # references besides `group` and getrefcount's argument
"""


def test_destroy_process_group_leaves_no_reference_after_course_ranks(tmp_path):
    """Imported before the group exists (course.ranks does it), torch._dynamo keeps no
    reference to it, and destroy_process_group() leaves nothing holding the group. Imported
    after, as the first optimizer or DDP does, it keeps the group (ten references with
    PyTorch 2.14.1), whose gloo worker threads then live into interpreter shutdown and now
    and then abort the process there (see course/ranks.py)."""
    import sys

    from course import launch

    held = {}
    for order in ("early", "late"):
        result = launch.run(
            args=[sys.executable, "-c", GROUP_HOLDERS, order, str(tmp_path / f"{order}.store")],
            timeout=60,
        )
        assert result.returncode == 0, result.describe()
        held[order] = int(result.output.split()[-1])
    # The control: imported late, the group is held (a PyTorch that fixed this prints 0,
    # and the early import in course/ranks.py then costs only its time).
    print(f"references left to the destroyed group: {held}")
    assert held["early"] == 0, (
        f"with course.ranks imported first, {held['early']} references still hold the process "
        f"group after destroy_process_group() (imported late: {held['late']}): its threads "
        "will outlive it"
    )


FSDP2_SCALE = """
import sys, torch, torch.distributed as dist, torch.multiprocessing as mp
from course import ranks

def fsdp2_gradient(rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4, bias=False)
    fully_shard(layer, mesh=init_device_mesh("cpu", (2,)))
    x = torch.full((1, 4), float(rank + 1))  # rank 0 sends 1s, rank 1 sends 2s
    layer(x).sum().backward()
    # d(sum of outputs)/dW is x in every row: the mean over the ranks is 1.5, the sum 3.
    return layer.weight.grad.full_tensor().mean().item()

def rank_main(rank, port):
    ranks.join_local(rank, 2, "gloo", port)
    averages = ranks.reduce_scatter_averages()
    # The FSDP2 layer holds the group; it is gone on return, so that destroy_process_group()
    # frees the group's gloo threads before the interpreter shuts down (see course/ranks.py).
    mean = fsdp2_gradient(rank)
    if rank == 0:
        print(averages, mean)
    dist.barrier()  # leave together
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(rank_main, args=(ranks.free_port(),), nprocs=2)
"""


def test_reduce_scatter_averages_says_what_fsdp2_will_do(tmp_path):
    """course.ranks.reduce_scatter_averages() is True exactly where FSDP2's gradients come
    back averaged over 2 gloo ranks, and False where they come back summed (PyTorch 2.8:
    its gloo reduce-scatter ignores ReduceOp.AVG), whichever this PyTorch does."""
    import sys

    from course import launch

    script = tmp_path / "scale.py"
    script.write_text(FSDP2_SCALE)
    result = launch.run(args=[sys.executable, str(script)], timeout=90, cwd=tmp_path)
    assert result.returncode == 0, result.describe()
    said, mean = result.output.split()[-2:]
    assert float(mean) in (1.5, 3.0), f"FSDP2's gradient is {mean}, neither mean nor sum"
    assert (said == "True") == (float(mean) == 1.5), (
        f"reduce_scatter_averages() said {said}, and FSDP2's gradient was {mean} "
        "(1.5 is the mean over the ranks, 3.0 the sum)"
    )


@pytest.mark.parametrize(
    "env, words",
    [
        ({}, "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "MASTER_PORT not set"),
        ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK='x'"),
        ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK=2"),
    ],
)
def test_from_environment_says_what_is_wrong_in_one_line(monkeypatch, env, words):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as err:
        from_environment()
    assert words in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_from_environment_reads_what_torchrun_sets(monkeypatch):
    for name, value in {
        "RANK": "1",
        "WORLD_SIZE": "3",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "29500",
    }.items():
        monkeypatch.setenv(name, value)
    assert from_environment() == (1, 3, "h", 29500)
