"""Lesson 09, exercise 2 - "Expected to have finished reduction in the prior iteration".

Run it:
    python lessons/09_debugging/unused.py                 # fails at the second step
    TORCH_DISTRIBUTED_DEBUG=DETAIL python lessons/09_debugging/unused.py   # names the parameter
    python -m course grade 09 -k unused                   # grade your fix
"""

import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course import data, models, options, ranks
from course.runtime import exit_with_one_line, seed_everything


def parse_args(argv=None):
    p = options.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=options.positive_int, default=2, help="gloo ranks (default 2)")
    p.add_argument("--steps", type=options.positive_int, default=5)
    p.add_argument("--batch-size", type=options.positive_int, default=32, help="per rank")
    return p.parse_args(argv)


class Net(nn.Module):
    """Lesson 01's model, and a second head for an experiment that was never finished."""

    def __init__(self, classes: int = 10, channels: int = 1):
        super().__init__()
        self.body = models.SmallCNN(classes, channels, norm="none")
        # TODO: DDP waits for a gradient of every parameter in every step. Find the
        # parameter that never gets one (TORCH_DISTRIBUTED_DEBUG=DETAIL names it), and
        # remove what the model does not use.
        self.aux = nn.Linear(2 * 32, classes)  # a second head, planned for later

    def forward(self, x):
        return self.body(x)


def train(rank: int, world: int, steps: int, batch_size: int, seed: int = 0) -> dict:
    """`steps` steps of DDP on this rank's shard; returns the trained weights."""
    seed_everything(seed)  # the same initial weights on every rank
    model = DDP(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    train_set, *_ = data.digits()
    images, labels = train_set.tensors
    for step in range(steps):
        start = (step * world + rank) * batch_size  # disjoint slices: this rank's shard
        x, y = images[start : start + batch_size], labels[start : start + batch_size]
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"step {step + 1}: loss {loss.item():.4f}, {len(x)} images x {world} ranks")
    return model.module.state_dict()


def run(rank: int, world: int, port: int, args) -> None:
    ranks.join_local(rank, world, "gloo", port)
    try:
        train(rank, world, args.steps, args.batch_size)
    finally:
        dist.destroy_process_group()


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(ranks.cpu_share(args.nproc))
    mp.spawn(run, args=(args.nproc, ranks.free_port(), args), nprocs=args.nproc)
    print("done: every step finished")


if __name__ == "__main__":
    sys.exit(exit_with_one_line(main))
