"""Lesson 05 - collectives: what DDP's all-reduce is made of, and a ring all-reduce by hand.

Run it:
    python lessons/05_collectives/collectives.py --nproc 4          # the tour, then your ring
    python lessons/05_collectives/collectives.py --backend nccl     # one rank per GPU
    python -m course grade 05                                        # grade your version
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from course import options, ranks
from course.runtime import exit_with_one_line


def parse_args(argv=None):
    p = options.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=options.positive_int, help="ranks (default: GPUs, or 2)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl if CUDA works")
    p.add_argument("--size", type=options.positive_int, default=10, help="ring test length")
    return p.parse_args(argv)


# --8<-- [start:tour]
def show(what: str, tensor: torch.Tensor) -> None:
    """Rank 0 prints every rank's `tensor`, gathered: one line per collective."""
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, tensor.tolist())
    if dist.get_rank() == 0:
        print(f"{what:<28}" + "  ".join(f"r{r}:{v}" for r, v in enumerate(values)))


def tour(rank: int, world: int, device: torch.device) -> None:
    """Each collective once, on tiny tensors: rank r starts with r + 1."""
    mine = lambda: torch.tensor([float(rank + 1)], device=device)  # noqa: E731
    show("start", mine())
    t = mine()
    dist.broadcast(t, src=0)  # everyone gets rank 0's tensor
    show("broadcast(src=0)", t)
    t = mine()
    dist.all_reduce(t)  # everyone gets the sum
    show("all_reduce(sum)", t)
    t = mine()
    dist.reduce(t, dst=0)  # only rank 0 is sure to hold the sum; the others: unspecified
    show("reduce(dst=0)", t)
    parts = [torch.zeros(1, device=device) for _ in range(world)]
    dist.all_gather(parts, mine())  # everyone gets every rank's tensor
    show("all_gather", torch.cat(parts))
    out = torch.zeros(1, device=device)  # piece r of the sum lands on rank r
    dist.reduce_scatter(out, [mine() * (i + 1) for i in range(world)])
    show("reduce_scatter", out)
    dist.barrier()  # nobody passes until everyone has arrived
    t = mine()
    if rank == 0:  # point to point: rank 0 sends its tensor to rank 1
        dist.send(t, dst=1)
    elif rank == 1:
        dist.recv(t, src=0)
    show("send 0 -> recv 1", t)


# --8<-- [end:tour]


# --8<-- [start:ring]
def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over all ranks, in place, as dist.all_reduce does; returns it.

    A reduce-scatter (each rank ends with the full sum of one chunk), then an
    all-gather (each rank passes the finished chunks on), around the ring
    rank -> rank + 1. Every step moves 1/world of the data per link, so the
    time hardly grows with the number of ranks."""
    world, rank = dist.get_world_size(), dist.get_rank()
    chunks = list(torch.tensor_split(tensor.view(-1), world))  # views: unequal if need be
    right, left = (rank + 1) % world, (rank - 1) % world

    # TODO: sum over the ranks with point-to-point messages around the ring: a
    # reduce-scatter, then an all-gather, world - 1 steps each. Avoid the classic deadlock:
    # when every rank makes a blocking send before it receives, they can all wait forever.
    raise NotImplementedError("TODO at 05_collectives/collectives.py:83 is not done yet")
    return tensor


# --8<-- [end:ring]


def worker(rank: int, world: int, backend: str, size: int) -> None:
    if rank != 0:  # one voice: rank 0 prints what show() gathers
        sys.stdout = open(os.devnull, "w")
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    limit = ranks.process_group_timeout()
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=limit)
    try:
        tour(rank, world, device)
        mine = torch.arange(size, dtype=torch.float32, device=device) * (rank + 1)
        expected = mine.clone()
        dist.all_reduce(expected)
        ring = ring_all_reduce(mine)
        show(f"your ring ({size} values)", ring)
        same = bool(torch.equal(ring, expected))
        print(f"your ring equals dist.all_reduce on rank 0: {same}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    args = parse_args(argv)
    backend, world = ranks.backend_and_world_size(args.backend, args.nproc)
    if world < 2:
        raise ValueError(f"--nproc {world}: a collective needs at least 2 ranks")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(ranks.free_port())
    mp.spawn(worker, args=(world, backend, args.size), nprocs=world)


if __name__ == "__main__":
    # A wrong flag prints one line and exits 2; a bug still shows its traceback.
    sys.exit(exit_with_one_line(main))
