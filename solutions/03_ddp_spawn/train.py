"""Lesson 03 - DistributedDataParallel with mp.spawn: one process per device.

    python lessons/03_ddp_spawn/train.py --nproc 2 --backend gloo      # 2 CPU processes
    python lessons/03_ddp_spawn/train.py --backend nccl                # one process per GPU
    python lessons/03_ddp_spawn/train.py --backend nccl --sync-bn      # BatchNorm over all GPUs
    python -m course run 03 --nproc 2 --backend gloo -- --epochs 2     # the same, via the CLI
    python -m course grade 03                                          # grade your version

Without --backend: nccl with every GPU when CUDA works, else gloo with 2 CPU processes.

Lesson 01's loop, run by `world_size` processes at once. Each process is a
*rank* (0 .. world_size-1, unique across all machines); its *local rank* is
its number on its own machine and picks its GPU; with one machine, as here,
the two are equal. Every rank builds the same model, reads its own shard of
each epoch (DistributedSampler) and trains on it. DistributedDataParallel
(DDP) keeps the copies identical:
  - at construction it broadcasts rank 0's parameters and buffers to all
    ranks, so every copy starts from the same weights;
  - in backward, gradients are grouped into buckets (~25 MB); as soon as a
    bucket's gradients are ready it is all-reduced (summed over the ranks,
    then divided by world_size) while backward computes the rest, so the
    communication hides behind computation. After backward every rank holds
    the same *averaged* gradient, the optimizer steps take identical steps,
    and the copies stay identical without ever sending weights again.
So N ranks with batch B compute the same update as one process with batch
N x B: the global batch. Only the BatchNorm layers see the difference (below).
"""

from __future__ import annotations

import argparse
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

from course import checkpoint, data, models
from course.dist import (
    cpu_share,
    free_port,
    no_per_step_buffer_sync,
    process_group_timeout,
    redirect_output_for_rank,
)
from course.train_utils import (
    ArgumentParser,
    add_speed_options,
    exit_with_one_line,
    memory_format,
    non_negative_int,
    positive_float,
    positive_int,
    seed_everything,
    show_progress,
    write_json,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = ArgumentParser(prog="train.py", description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=positive_int, help="ranks (default: GPUs, or 2 with gloo)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl if CUDA works")
    p.add_argument("--data", default="digits", help="digits, synthetic, cifar10 or a folder")
    p.add_argument("--data-dir", default="data", help="where cifar10 is downloaded")
    p.add_argument("--image-size", type=positive_int, help="resize folder/cifar images")
    p.add_argument("--model", default="cnn", choices=models.NAMES)
    p.add_argument("--norm", default="batch", choices=models.NORMS, help="cnn: batch or none")
    p.add_argument("--sync-bn", action="store_true", help="BatchNorm statistics over all ranks")
    p.add_argument("--epochs", type=positive_int, default=3)
    p.add_argument("--batch-size", type=positive_int, default=64, help="per rank")
    p.add_argument("--lr", type=positive_float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=positive_int, help="stop after this many steps in all")
    p.add_argument("--checkpoint", help="rank 0 saves here after every epoch (atomically)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--metrics-out", help="rank 0 writes per-epoch metrics here as JSON")
    p.add_argument("--record-shards", action="store_true", help="metrics: each rank's samples")
    p.add_argument("--num-workers", type=non_negative_int, help="DataLoader worker processes")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_speed_options(p)  # --amp bf16, --channels-last (what `python -m course bench` varies)
    args = p.parse_args(argv)
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint PATH")
    return args


# --8<-- [start:setup]
def setup(rank: int, world_size: int, backend: str) -> torch.device:
    """Join the process group as `rank` of `world_size`; returns this rank's device."""
    # One machine: the local rank is the rank, and it picks the GPU.
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    # TODO: join the process group as rank `rank` of `world_size`. With a GPU, first make
    # it this process's current device: NCCL builds its communicator on the current
    # device, and without that every rank piles onto cuda:0. MASTER_ADDR and MASTER_PORT
    # come from the environment the parent set up.
    # HINT 1: Two calls, in this order: choose the device, then join the group.
    # HINT 2: torch.cuda.set_device(device) (GPU only), then
    #   dist.init_process_group(backend, rank=..., world_size=...,
    #   timeout=process_group_timeout(), device_id=...).
    # HINT 3: device_id=device on a GPU, None on the CPU;
    #   timeout=process_group_timeout() keeps a hang shorter than the grader's deadline.
    ### BEGIN SOLUTION
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        rank=rank,
        world_size=world_size,
        timeout=process_group_timeout(),  # a rank that never shows up is an error, not a hang
        device_id=device if device.type == "cuda" else None,
    )
    ### END SOLUTION
    return device


# --8<-- [end:setup]


# --8<-- [start:loaders]
def make_loaders(train_set, test_set, args, device: torch.device, rank: int, world_size: int):
    # TODO: give this rank its own shard of the training set: disjoint from the other
    # ranks' shards, together covering the epoch, shuffled, and of equal length on every
    # rank (a rank with one batch more would wait forever in its all-reduce).
    # HINT 1: Every rank shuffles all indices with the same seed and takes every
    #   world_size-th one, starting at its rank. PyTorch has a sampler that does exactly
    #   that, padding the shards to equal length.
    # HINT 2: torch.utils.data.DistributedSampler(dataset, num_replicas=..., rank=...,
    #   shuffle=True, seed=...).
    # HINT 3: DistributedSampler(train_set, num_replicas=world_size, rank=rank,
    #   shuffle=True, seed=args.seed).
    ### BEGIN SOLUTION
    sampler = DistributedSampler(
        train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed
    )
    ### END SOLUTION
    # The sampler does the shuffling now (shuffle= and sampler= are exclusive).
    # data.loader: workers and pinned memory only where they help (lesson 01).
    workers = args.num_workers
    train = data.loader(train_set, args.batch_size, device, num_workers=workers, sampler=sampler)
    test = data.loader(test_set, args.batch_size, device, num_workers=workers)  # rank 0's
    return train, test, sampler


# --8<-- [end:loaders]


# --8<-- [start:train_step]
def train_one_epoch(model, loader, optimizer, device, max_steps=None, progress=False, amp=False):
    """One pass over `loader` (or `max_steps` steps); returns (mean loss, images, steps).

    amp: run the forward pass and the loss under bf16 autocast."""
    model.train()  # BatchNorm uses batch statistics and updates its running ones
    total_loss = torch.zeros((), device=device)
    images_seen = steps = 0
    bar = tqdm(loader, disable=not progress, leave=False, unit="batch")
    start = time.perf_counter()
    for images, labels in bar:
        # non_blocking: with pinned memory the copy overlaps with the GPU's work.
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradients, bucket by bucket, during this call
        optimizer.step()
        # detach: keep the number, not the graph; no .item() here, which would
        # make the CPU wait for the GPU at every step.
        total_loss += loss.detach() * len(labels)
        images_seen += len(labels)
        steps += 1
        if progress and steps % 10 == 0:
            rate = images_seen / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{loss.item():.3f}", img_s=f"{rate:.0f}")
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
        "rng": checkpoint.rng_state(),
    }


def restore(state: dict, model, optimizer) -> tuple[int, int]:
    """Load a checkpoint_state() dict into model and optimizer; returns (epoch, step)."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    checkpoint.set_rng_state(state["rng"])
    return state["epoch"], state["step"]


# --8<-- [end:checkpoint]


# --8<-- [start:model]
def build_ddp_model(args, num_classes, channels, device):
    """This rank's replica, wrapped in DDP (the plain model is `ddp.module`)."""
    model = models.build_model(args.model, num_classes, channels, args.norm)
    # BatchNorm normalises with the mean and variance of the batch it sees,
    # which under DDP is this rank's B images, not the global N x B: the
    # result differs from one process with the big batch (and gets noisy when
    # B is small). SyncBatchNorm all-reduces those statistics in every forward
    # pass, at the price of a collective per BatchNorm layer. In this PyTorch
    # it only runs on CUDA tensors (on CPU it raises "SyncBatchNorm expected
    # input tensor to be on GPU"), so --sync-bn needs nccl.
    if args.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device, memory_format=memory_format(args))
    # TODO: wrap the model so that backward() averages the gradients over all ranks: then
    # every rank takes the same step and the replicas stay identical.
    # HINT 1: DistributedDataParallel wraps a model that is already on its device, and
    #   needs to know which device that is on a GPU.
    # HINT 2: DDP(model, device_ids=[device.index] on a GPU, None on the CPU). For speed
    #   (the page's "How fast should it be?"): gradient_as_bucket_view=True and
    #   **no_per_step_buffer_sync().
    # HINT 3: DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
    #   gradient_as_bucket_view=True, **no_per_step_buffer_sync()).
    ### BEGIN SOLUTION
    ddp = DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        # The gradients live inside DDP's all-reduce buckets instead of being
        # copied into them and back: two copies per parameter per step fewer,
        # which counts when the CPU can barely launch kernels fast enough.
        gradient_as_bucket_view=True,
        # By default DDP re-sends rank 0's buffers (BatchNorm's running
        # statistics) to every rank before every forward pass. Only rank 0's
        # are ever read here (it alone evaluates and saves), so skip that
        # broadcast: one collective and ~160 small copies per step fewer.
        **no_per_step_buffer_sync(),  # broadcast_buffers=False, renamed in torch 2.14
    )
    ### END SOLUTION
    return ddp


# --8<-- [end:model]


def gather_shards(sampler) -> list[list[int]]:
    """Every rank's sample indices for this epoch, on every rank (for --record-shards)."""
    shards = [None] * dist.get_world_size()
    dist.all_gather_object(shards, list(sampler))
    return shards


# --8<-- [start:train]
def train(rank: int, world_size: int, device: torch.device, args) -> dict | None:
    """Lesson 01's main, run by every rank; returns the metrics on rank 0."""
    log = print if rank == 0 else (lambda *_: None)  # one voice: rank 0 talks, the others work
    seed_everything(args.seed)  # the same seed on every rank: the same split and initial weights
    train_set, test_set, num_classes, channels = data.build_datasets(
        args.data,
        args.data_dir,
        args.image_size,
        device,  # tensors go to the device once
    )
    train_loader, test_loader, sampler = make_loaders(
        train_set, test_set, args, device, rank, world_size
    )
    model = build_ddp_model(args, num_classes, channels, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)

    start_epoch = step = 0
    if args.resume:  # every rank loads the file into its replica (model.module: no prefix)
        start_epoch, step = restore(checkpoint.load(args.checkpoint), model.module, optimizer)
        log(f"resumed from {args.checkpoint}: {start_epoch} epoch(s), {step} step(s) done")
    log(f"training {args.model} on {args.data} ({len(train_set)} images) on {world_size} ranks")
    global_batch = args.batch_size * world_size  # what one optimizer step averages over
    log(f"{world_size} ranks x batch {args.batch_size} per rank = global batch {global_batch}")

    metrics = {"backend": dist.get_backend(), "data": args.data, "model": args.model, "epochs": []}
    metrics.update(start_epoch=start_epoch, world_size=world_size, global_batch_size=global_batch)
    metrics["shards"] = []  # with --record-shards: [epoch][rank] -> sample indices
    images_total, train_seconds, accuracy = 0, 0.0, None
    for epoch in range(start_epoch, args.epochs):
        # TODO: make each epoch shuffle differently. The sampler shuffles with seed +
        # epoch; left at epoch 0, every rank sees the same shard in the same order every
        # epoch: no error, just a quietly worse model.
        # HINT 1: The sampler cannot know the epoch by itself: tell it, at the start of
        #   every epoch, before the loader is iterated.
        # HINT 2: sampler.set_epoch(epoch).
        ### BEGIN SOLUTION
        sampler.set_epoch(epoch)
        ### END SOLUTION
        if args.record_shards:
            metrics["shards"].append(gather_shards(train_loader.sampler))
        left = None if args.max_steps is None else args.max_steps - step
        if left is not None and left <= 0:
            break
        tic = time.perf_counter()
        train_loss, images, steps = train_one_epoch(
            model, train_loader, optimizer, device, left, rank == 0 and show_progress(args.quiet),
            amp=args.amp == "bf16",
        )  # fmt: skip
        seconds = time.perf_counter() - tic  # .item() in train_one_epoch waited for the GPU
        # Each rank knows its own shard's loss and count: add them up over the ranks.
        totals = torch.tensor([train_loss * images, images], dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        train_loss, images = (totals[0] / totals[1]).item(), int(totals[1].item())
        step += steps
        images_total += images
        train_seconds += seconds
        complete = steps == len(train_loader)
        if rank == 0:
            # model.module, the plain model: a forward through the DDP wrapper on
            # one rank alone may wait for the others (buffer broadcast) and hang.
            test_loss, accuracy = evaluate(model.module, test_loader, device)
            metrics["epochs"].append(
                {
                    "epoch": epoch + 1,
                    "train_loss": train_loss,
                    "test_loss": test_loss,
                    "test_accuracy": accuracy,
                    "images_per_second": images / seconds,
                    "steps": steps,
                    "complete": complete,
                }
            )
            log(
                f"epoch {epoch + 1}/{args.epochs}: train loss {train_loss:.4f}, test loss "
                f"{test_loss:.4f}, test accuracy {accuracy:.2%}, {images / seconds:,.0f} img/s"
            )
        # Only a complete epoch is saved: a resumed run restarts at an epoch boundary.
        # TODO: save the checkpoint once per completed epoch, from one rank only, in a
        # form lesson 01's plain model loads; then make every rank wait until the file is
        # complete. All ranks hold the same weights, and N writers would race on one file.
        # HINT 1: The DDP wrapper's own weights are named "module.<name>"; the model
        #   inside is the plain one. The other ranks must not run ahead (or exit) while
        #   rank 0 writes.
        # HINT 2: if rank == 0 and args.checkpoint and complete:
        #   checkpoint.save(checkpoint_state(model.module, optimizer, epoch + 1, step),
        #   args.checkpoint); then dist.barrier() on every rank.
        # HINT 3: the barrier goes outside the `if rank == 0`: a barrier only rank 0
        #   reaches hangs the others until the timeout.
        ### BEGIN SOLUTION
        if rank == 0 and args.checkpoint and complete:
            checkpoint.save(
                checkpoint_state(model.module, optimizer, epoch + 1, step), args.checkpoint
            )
        dist.barrier()
        ### END SOLUTION

    if rank != 0:
        return None
    if accuracy is None:  # resumed a run that was already finished
        _, accuracy = evaluate(model.module, test_loader, device)
    metrics.update(
        final_accuracy=accuracy,
        steps=step,
        images_per_second=images_total / train_seconds if train_seconds else 0.0,
        train_seconds=train_seconds,
    )
    log(f"final test accuracy {accuracy:.2%} after {step} steps ({train_seconds:.1f} s training)")
    if args.metrics_out:
        write_json(metrics, args.metrics_out)
    return metrics


# --8<-- [end:train]


# --8<-- [start:spawn]
def worker(rank: int, world_size: int, backend: str, args) -> None:
    """What each of the `world_size` processes runs; mp.spawn passes `rank` first."""
    redirect_output_for_rank(rank)  # the grader's per-rank logs; a no-op otherwise
    # A fresh process starts one CPU thread per core; N ranks on one machine
    # would then fight over the cores, and two GPUs ran several times slower than one
    # (see the page). Each rank takes its share (OMP_NUM_THREADS, if set, wins).
    torch.set_num_threads(cpu_share(world_size))
    device = setup(rank, world_size, backend)
    try:
        train(rank, world_size, device, args)
    finally:  # also on error: leave no half-open connections behind
        dist.destroy_process_group()


def main(argv=None) -> None:
    args = parse_args(argv)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = args.backend or ("nccl" if gpus and dist.is_nccl_available() else "gloo")
    world_size = args.nproc or (gpus if backend == "nccl" else 2)
    if backend == "nccl" and world_size > gpus:
        raise ValueError(f"--backend nccl with {world_size} ranks needs {world_size} GPUs: {gpus}")
    if args.sync_bn and backend != "nccl":
        raise ValueError("--sync-bn needs --backend nccl: SyncBatchNorm runs on CUDA tensors only")
    # TODO: start world_size processes that find each other. They meet at rank 0's address
    # and port, which they read from the environment they inherit; the port must be free
    # (a fixed number collides as soon as two jobs share a machine).
    # HINT 1: Set the rendezvous address and port in this process's environment, then
    #   start the processes: the children inherit the environment.
    # HINT 2: os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] =
    #   str(free_port()); torch.multiprocessing.spawn runs worker(rank, *args) in nprocs
    #   processes.
    # HINT 3: mp.spawn(worker, args=(world_size, backend, args), nprocs=world_size). If
    #   any rank raises, mp.spawn stops the others and raises here.
    ### BEGIN SOLUTION
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    mp.spawn(worker, args=(world_size, backend, args), nprocs=world_size)
    ### END SOLUTION


# --8<-- [end:spawn]


if __name__ == "__main__":
    # A wrong flag or a missing folder prints one line and exits 2; a bug still shows its traceback.
    sys.exit(exit_with_one_line(main, prog="train.py"))
