"""Lesson 03 - DistributedDataParallel with mp.spawn: one process per device.

Run it:
    python lessons/03_ddp_spawn/train.py --nproc 2 --backend gloo      # 2 CPU processes
    python lessons/03_ddp_spawn/train.py --backend nccl --sync-bn      # one process per GPU
    python -m course grade 03                                          # grade your version
"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler
from tqdm import tqdm

from course import checkpoint, data, models, options, ranks

# Plain names for the checkpoint code: save is torch.save through a temporary file and a
# rename (a crash leaves the old file whole); rng_state/set_rng_state cover every generator
# a run draws from (torch's on the CPU and each GPU, NumPy's, Python's).
from course.checkpoint import rng_state, save, set_rng_state
from course.metrics import RunLog
from course.runtime import exit_with_one_line, seed_everything

# DDP's keyword for "do not re-send rank 0's buffers before every forward", set once for the
# torch installed: broadcast_buffers=False, forward_sync_buffers=False since PyTorch 2.13
# (course/ranks.py). Only rank 0's BatchNorm statistics are ever read: one collective less.
NO_BUFFER_SYNC = ranks.no_per_step_buffer_sync()


def parse_args(argv=None):
    p = options.parser(__doc__, per="per rank")
    p.add_argument("--nproc", type=options.positive_int, help="ranks (default: GPUs, or 2)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl if CUDA works")
    p.add_argument("--sync-bn", action="store_true", help="BatchNorm statistics over all ranks")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    return options.parse(p, argv)


# --8<-- [start:setup]
def setup(rank: int, world_size: int, backend: str) -> torch.device:
    """Join the process group as `rank` of `world_size`; returns this rank's device."""
    # One machine: the local rank is the rank, and it picks the GPU.
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    # COURSE_PG_TIMEOUT seconds (the grader's is below its deadline; else 120 s), read as the
    # rank joins: a rank that never arrives ends in PyTorch's own error, not a long hang.
    limit = ranks.process_group_timeout()
    # TODO: join the process group as rank `rank` of `world_size`, on this rank's own GPU
    # (NCCL builds its communicator on the current device; unset, every rank uses cuda:0).
    raise NotImplementedError("TODO at 03_ddp_spawn/train.py:56 is not done yet")
    return device


# --8<-- [end:setup]


# --8<-- [start:train_step]
def train_one_epoch(model, loader, optimizer, device, max_steps=None, progress=False, amp=False):
    """One pass over `loader` (or `max_steps` steps); returns (mean loss, images, steps).

    amp: run the forward pass and the loss under bf16 autocast."""
    model.train()  # BatchNorm uses batch statistics and updates its running ones
    total_loss = torch.zeros((), device=device)
    images_seen = steps = 0
    for images, labels in tqdm(loader, disable=not progress, leave=False, unit="batch"):
        # non_blocking: with pinned memory the copy overlaps with the GPU's work.
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradients, bucket by bucket, during this call
        optimizer.step()
        # detach, no .item(): keep the number on the device, don't wait for the GPU.
        total_loss += loss.detach() * len(labels)
        images_seen += len(labels)
        steps += 1
        if max_steps is not None and steps >= max_steps:
            break
    return (total_loss / max(images_seen, 1)).item(), images_seen, steps


# --8<-- [end:train_step]


# --8<-- [start:evaluate]
@torch.no_grad()  # no graph: evaluation needs no gradients and half the memory
def evaluate(model, loader, device) -> tuple[float, float]:
    """(mean loss, accuracy) of `model` on `loader`."""
    model.eval()  # BatchNorm uses its running statistics: results don't depend on the batch
    total_loss, correct, seen = 0.0, 0, 0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        logits = model(images)
        total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += (logits.argmax(dim=1) == labels).sum().item()
        seen += len(labels)
    return total_loss / max(seen, 1), correct / max(seen, 1)


# --8<-- [end:evaluate]


# --8<-- [start:checkpoint]
def checkpoint_state(model, optimizer, epoch: int, step: int) -> dict:
    """Everything a resumed run needs; `epoch` counts the epochs completed."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": epoch,
        "step": step,
        "rng": rng_state(),
    }


def restore(state: dict, model, optimizer) -> tuple[int, int]:
    """Load a checkpoint_state() dict into model and optimizer; returns (epoch, step)."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"])
    return state["epoch"], state["step"]


# --8<-- [end:checkpoint]


# --8<-- [start:train]
def train(rank: int, world_size: int, device: torch.device, args) -> dict | None:
    """The whole run, on every rank; returns the metrics on rank 0."""
    seed_everything(args.seed)  # the same seed on every rank: the same initial weights
    # The data set's tensors go to the device once (course/data.py).
    train_set, test_set, classes, channels = data.build_datasets(
        args.data, args.data_dir, args.image_size, device
    )
    # --8<-- [start:loaders]
    # TODO: this rank's own shard of the training set: disjoint from the other ranks',
    # covering the epoch together, shuffled, and of equal length on every rank (a rank
    # with one batch more would wait forever in its all-reduce).
    raise NotImplementedError("TODO at 03_ddp_spawn/train.py:145 is not done yet")
    train_loader = data.loader(
        train_set, args.batch_size, device, args.num_workers, sampler=sampler
    )
    test_loader = data.loader(test_set, args.batch_size, device, args.num_workers)
    # --8<-- [end:loaders]
    # --8<-- [start:model]
    model = models.build_model(args.model, classes, channels, args.norm)
    if args.sync_bn:  # BatchNorm statistics over the global batch: a collective per layer
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device, memory_format=args.memory_format)
    # TODO: wrap the model so that backward() averages the gradients over all ranks: then
    # every rank takes the same step and the replicas stay identical.
    raise NotImplementedError("TODO at 03_ddp_spawn/train.py:158 is not done yet")
    # --8<-- [end:model]
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)

    start_epoch = step = 0
    if args.resume:  # every rank loads the file into its replica (model.module: no prefix)
        start_epoch, step = restore(checkpoint.load(args.checkpoint), model.module, optimizer)
        print(f"resumed from {args.checkpoint}: {start_epoch} epoch(s), {step} step(s) done")
    print(f"training {args.model} on {args.data} ({len(train_set)} images) on {device}")
    batch = args.batch_size * world_size  # what one optimizer step averages over
    print(f"{world_size} ranks x batch {args.batch_size} per rank = global batch {batch}")
    log = RunLog(args, start_epoch, world_size=world_size, global_batch_size=batch)
    for epoch in range(start_epoch, args.epochs):
        # TODO: a different shuffle every epoch. The sampler shuffles with seed + epoch; left
        # at epoch 0, each rank sees the same shard in the same order: a quietly worse model.
        raise NotImplementedError("TODO at 03_ddp_spawn/train.py:173 is not done yet")
        if (left := options.steps_left(args, step)) == 0:
            break
        tic = time.perf_counter()
        train_loss, images, steps = train_one_epoch(
            model, train_loader, optimizer, device, left, rank == 0 and args.progress,
            amp=args.amp == "bf16",
        )  # fmt: skip
        seconds = time.perf_counter() - tic  # .item() in train_one_epoch waited for the GPU
        step += steps
        train_loss, images = ranks.mean_over_ranks(train_loss, images)  # each knew its shard
        complete = steps == len(train_loader)
        if rank == 0:  # the replicas are identical: one evaluates (model.module, no DDP hooks)
            test_loss, accuracy = evaluate(model.module, test_loader, device)
            log.epoch(epoch + 1, train_loss, test_loss, accuracy, images, seconds, steps, complete)
        # Only a complete epoch is saved: a resumed run restarts at an epoch boundary.
        # TODO: save the checkpoint of each complete epoch from one rank, loadable by lesson
        # 01's plain model, and let no rank run ahead (or exit) before the file is complete.
        raise NotImplementedError("TODO at 03_ddp_spawn/train.py:191 is not done yet")
    return log.finish(evaluate(model.module, test_loader, device)[1], step) if rank == 0 else None


# --8<-- [end:train]


# --8<-- [start:spawn]
def worker(rank: int, world_size: int, backend: str, args) -> None:
    """What each of the `world_size` processes runs; mp.spawn passes `rank` first."""
    if rank != 0:  # one voice: rank 0 prints, the others work (their errors still show)
        sys.stdout = open(os.devnull, "w")
    torch.set_num_threads(ranks.cpu_share(world_size))  # N ranks share the cores (see page)
    device = setup(rank, world_size, backend)
    try:
        train(rank, world_size, device, args)
        dist.barrier()  # leave together: gloo can abort a rank that tears down alone
    finally:  # also on error: leave no half-open connections behind
        dist.destroy_process_group()


def main(argv=None) -> None:
    args = parse_args(argv)
    # nccl and one rank per GPU where CUDA works, else gloo and 2 CPU ranks (lesson 00)
    backend, world_size = ranks.backend_and_world_size(args.backend, args.nproc, args.sync_bn)
    # A port nobody listens on, picked by the OS: a fixed number collides as soon as two
    # jobs share a machine.
    port = ranks.free_port()
    # TODO: start world_size processes that find each other at rank 0's address and `port`,
    # read from the environment they inherit.
    raise NotImplementedError("TODO at 03_ddp_spawn/train.py:221 is not done yet")


# --8<-- [end:spawn]


if __name__ == "__main__":
    # A wrong flag or a missing folder prints one line and exits 2; a bug still shows its traceback.
    sys.exit(exit_with_one_line(main))
