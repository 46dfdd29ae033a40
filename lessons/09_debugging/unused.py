"""Lesson 09, exercise 2 - "Expected to have finished reduction in the prior iteration".

Run it:
    python lessons/09_debugging/unused.py                 # fails at the second step
    TORCH_DISTRIBUTED_DEBUG=DETAIL python lessons/09_debugging/unused.py   # names the parameter
    python -m course grade 09 -k unused                   # grade your fix
    python lessons/09_debugging/unused.py --compare-find-unused --steps 20   # what it costs
"""

import statistics
import sys
import time

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
    p.add_argument("--compare-find-unused", action="store_true",
                   help="time steps with and without find_unused_parameters=True")  # fmt: skip
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


def train(rank: int, world: int, steps: int, batch_size: int, seed: int = 0,
          find_unused: bool = False, times: list | None = None) -> dict:  # fmt: skip
    """`steps` steps of DDP on this rank's shard; returns the trained weights. `times`, if
    given, gets each step's seconds, and then nothing is printed."""
    seed_everything(seed)  # the same initial weights on every rank
    model = DDP(Net(), find_unused_parameters=find_unused)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    train_set, *_ = data.digits()
    images, labels = train_set.tensors
    for step in range(steps):
        began = time.perf_counter()
        start = (step * world + rank) * batch_size  # disjoint slices: this rank's shard
        x, y = images[start : start + batch_size], labels[start : start + batch_size]
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if times is not None:
            times.append(time.perf_counter() - began)
        elif rank == 0:
            print(f"step {step + 1}: loss {loss.item():.4f}")
    return model.module.state_dict()


def compare(rank: int, world: int, args) -> None:
    """The fixed model's step time without and with find_unused_parameters=True, in turns
    (three each, so that a busy moment of the machine falls on both), first steps left out."""
    times = {False: [], True: []}
    for _ in range(3):
        for find in times:
            steps: list = []
            train(rank, world, args.steps, args.batch_size, find_unused=find, times=steps)
            times[find] += steps[2:]
    if rank == 0:
        plain, found = (statistics.median(times[f]) * 1e3 for f in times)
        print(f"median step: {plain:.2f} ms; with find_unused_parameters=True "
              f"{found:.2f} ms ({found / plain:.2f}x)")  # fmt: skip


def run(rank: int, world: int, port: int, args) -> None:
    ranks.join_local(rank, world, "gloo", port)
    try:
        if args.compare_find_unused:
            compare(rank, world, args)
        else:
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
