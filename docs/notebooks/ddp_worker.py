"""A tiny DDP training job that lives in a file, for the "DDP from a notebook" notebook.

Spawned processes find their function by importing the module it was defined
in. A function defined in a notebook has no module file to import; one defined
here does. The same file also runs under torchrun:

    torchrun --nproc-per-node=2 docs/notebooks/ddp_worker.py --out /tmp/ddp
"""

from __future__ import annotations

import argparse
import gc
import json
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

# Short enough that a rank waiting for a partner that died fails while you watch.
TIMEOUT = timedelta(seconds=60)


def train(rank: int, world_size: int, out: Path, steps: int = 5) -> None:
    """Train a linear model for a few steps; every rank writes what it ended with."""
    torch.manual_seed(0)  # the same initial weights on every rank
    model = DDP(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(100 + rank)  # a different shard per rank
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 4, generator=data)
        y = x.sum(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients of all ranks here
        optimizer.step()
        losses.append(round(loss.item(), 4))
    weights = [round(w, 6) for w in model.module.weight.detach().flatten().tolist()]
    result = {"rank": rank, "world_size": world_size, "losses": losses, "weights": weights}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    print(f"rank {rank}/{world_size}: final loss {losses[-1]}", flush=True)
    # Free DDP's reducer, which holds the process group, before the group is destroyed.
    del model, optimizer
    gc.collect()


def run(rank: int, world_size: int, port: int, out: str) -> None:
    """Entry point for mp.spawn: the rank comes first, the rest from `args=`."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=TIMEOUT,
    )
    try:
        train(rank, world_size, Path(out))
        dist.barrier()  # nobody tears down the group while a partner still uses it
    finally:
        dist.destroy_process_group()


def main() -> None:
    """Entry point for torchrun, which passes rank and rendezvous through the environment."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the per-rank results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=TIMEOUT)  # env://: RANK, WORLD_SIZE, MASTER_*
    try:
        train(dist.get_rank(), dist.get_world_size(), Path(args.out))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
