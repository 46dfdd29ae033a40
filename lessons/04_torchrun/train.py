"""Lesson 04 - torchrun: the same DDP training, started by torchrun, surviving a crash.

    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1     # reliable restarts (see main())
    torchrun --standalone --nproc_per_node=2 lessons/04_torchrun/train.py --backend gloo
    torchrun --standalone --nproc_per_node=gpu lessons/04_torchrun/train.py --backend nccl
    torchrun --standalone --nproc_per_node=2 --max-restarts 3 lessons/04_torchrun/train.py \
        --backend gloo --snapshot runs/04/snapshot.pt --snapshot-every 5
    COURSE_KILL_RANK=1 COURSE_KILL_AT_STEP=7 python -m course run 04 ...  # rank 1 dies at step 7
    python -m course run 04 --nproc 2 --backend gloo -- --snapshot runs/04/snapshot.pt
    python -m course grade 04                                          # grade your version

(`torchrun` is `python -m torch.distributed.run`.) Lesson 03's script
started its own ranks with mp.spawn and picked a port; here torchrun does
both. It starts --nproc_per_node copies of this script and gives each one
its identity in the environment: RANK (unique over all machines),
LOCAL_RANK (on this machine: picks the GPU), WORLD_SIZE, and MASTER_ADDR /
MASTER_PORT of the rendezvous (init_process_group's default "env://" reads
them). The same file then runs unchanged on one machine or many.

torchrun is also an *elastic agent*: it watches its workers, and when one
dies it stops the others and starts the whole group again, up to
--max-restarts times. A restart is a fresh start of every process, so the
script must find its own way back: every --snapshot-every steps rank 0
writes a snapshot (model, optimizer, epoch, batches done in that epoch,
step, every rank's random generators) atomically; on start every rank loads
the newest snapshot and skips the batches already done, so no step is lost
or repeated, and the result is bit-identical to a run that never crashed.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from itertools import islice
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler
from tqdm import tqdm

from course import checkpoint, data, models
from course.dist import (
    cpu_share,
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
    p.add_argument("--snapshot", help="snapshot file: resume from it, update it every K steps")
    p.add_argument("--snapshot-every", type=positive_int, default=20, metavar="K")
    p.add_argument("--metrics-out", help="rank 0 writes per-epoch metrics here as JSON")
    p.add_argument("--record-shards", action="store_true", help="metrics: each rank's samples")
    p.add_argument("--num-workers", type=non_negative_int, help="DataLoader worker processes")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_speed_options(p)  # --amp bf16, --channels-last (what `python -m course bench` varies)
    return p.parse_args(argv)


# --8<-- [start:setup]
def setup(backend: str) -> tuple[int, int, int, torch.device]:
    """Join the process group torchrun set up; returns (rank, local rank, world size, device)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    # TODO: find out who this process is from the environment torchrun set (its local rank
    # on this machine, its global rank, the world size), pick its device (refuse a GPU
    # that does not exist), and join the process group. torchrun also set the rendezvous
    # address and port.
    raise NotImplementedError("TODO at 04_torchrun/train.py:103 is not done yet")
    # Bit-identical resumes on GPUs also need deterministic kernels: cuDNN may
    # otherwise pick a different (or atomics-based) convolution algorithm.
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    return rank, local_rank, world_size, device


# --8<-- [end:setup]


# --8<-- [start:loaders]
class ResumableSampler(DistributedSampler):
    """A DistributedSampler that can start an epoch part-way: it skips the
    first `skip` indices of this rank's shard (the batches already trained on).

    The shard of an epoch depends only on (seed, epoch, rank), so a restarted
    process rebuilds exactly the order the crashed one had, and skipping
    `batches done x batch size` indices lands on the next batch to train.
    """

    skip = 0

    def __iter__(self):
        return islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return self.num_samples - self.skip


def make_loaders(train_set, test_set, args, device: torch.device, rank: int, world_size: int):
    sampler = ResumableSampler(
        train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed
    )
    workers = args.num_workers
    train = data.loader(train_set, args.batch_size, device, num_workers=workers, sampler=sampler)
    test = data.loader(test_set, args.batch_size, device, num_workers=workers)  # rank 0's
    return train, test, sampler


# --8<-- [end:loaders]


# --8<-- [start:train_step]
def train_one_epoch(
    model, loader, optimizer, device, max_steps=None, progress=False, on_step=None, amp=False
):
    """One pass over `loader` (or `max_steps` steps); returns (mean loss, images, steps).

    on_step(steps) runs after every optimizer step: snapshots happen there.
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
        if on_step is not None:
            on_step(steps)
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


# --8<-- [end:checkpoint]


# --8<-- [start:snapshot]
def save_snapshot(path, model, optimizer, epoch: int, batches_done: int, step: int) -> None:
    """Every rank calls this at the same step; rank 0 writes the file."""
    # Each rank's generators are its own: gather them, so each gets its own back.
    rng = [None] * dist.get_world_size()
    dist.all_gather_object(rng, checkpoint.rng_state())
    # TODO: write a snapshot from which a restarted group continues exactly where this one
    # stopped, even mid-epoch. One rank writes it, and a crash while writing must leave
    # the previous snapshot intact.
    raise NotImplementedError("TODO at 04_torchrun/train.py:229 is not done yet")
    # No barrier: only a restarted group reads the file, and torchrun restarts a
    # group only after every process of the old one has exited.


def load_snapshot(path, model, optimizer, device) -> tuple[int, int, int]:
    """Restore a snapshot on every rank; returns (epoch, batches done, step)."""
    # TODO: load a snapshot back into this rank and return (epoch, batches_done, step).
    # Refuse, with a ValueError, a snapshot written by another number of ranks: its shards
    # and batch positions would not line up with this run's.
    raise NotImplementedError("TODO at 04_torchrun/train.py:239 is not done yet")


# --8<-- [end:snapshot]


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
    # TODO: wrap the model so that backward() averages the gradients over all ranks, as in
    # lesson 03.
    raise NotImplementedError("TODO at 04_torchrun/train.py:261 is not done yet")
    return ddp


# --8<-- [end:model]


def gather_shards(sampler) -> list[list[int]]:
    """Every rank's sample indices for this epoch, on every rank (for --record-shards)."""
    shards = [None] * dist.get_world_size()
    dist.all_gather_object(shards, list(sampler))
    return shards


# --8<-- [start:train]
def train(rank: int, world_size: int, device: torch.device, args) -> dict | None:
    """Lesson 03's train(), with snapshots; returns the metrics on rank 0."""
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
    batches_per_epoch = math.ceil(sampler.num_samples / args.batch_size)

    start_epoch = skip = step = 0
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if args.snapshot and Path(args.snapshot).is_file():
        start_epoch, skip, step = load_snapshot(args.snapshot, model, optimizer, device)
        where = f"step {step}, epoch {start_epoch + 1} batch {skip + 1}"
        log(f"attempt {attempt}: resumed from {args.snapshot} at {where}")
    log(f"training {args.model} on {args.data} ({len(train_set)} images) on {world_size} ranks")
    global_batch = args.batch_size * world_size  # what one optimizer step averages over
    log(f"{world_size} ranks x batch {args.batch_size} per rank = global batch {global_batch}")

    metrics = {"backend": dist.get_backend(), "data": args.data, "model": args.model, "epochs": []}
    metrics.update(start_epoch=start_epoch, world_size=world_size, global_batch_size=global_batch)
    metrics.update(start_step=step, restart_count=int(attempt))
    metrics["shards"] = []  # with --record-shards: [epoch][rank] -> sample indices
    images_total, train_seconds, accuracy = 0, 0.0, None
    resumed_at = step if step else None
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        # TODO: after a restart in the middle of an epoch, train only the batches the
        # snapshot did not cover, and remember how many were done before the restart in
        # `done_before`: a snapshot taken later in this epoch must count them too, or a
        # second crash resumes at the wrong batch. Later epochs start at the top.
        raise NotImplementedError("TODO at 04_torchrun/train.py:315 is not done yet")
        if args.record_shards:
            metrics["shards"].append(gather_shards(train_loader.sampler))
        left = None if args.max_steps is None else args.max_steps - step
        if left is not None and left <= 0:
            break

        # Bound as defaults: the function must see this epoch's values.
        def after_step(steps_this_pass: int, epoch=epoch, done_before=done_before) -> None:
            nonlocal step
            step += 1
            if step - 1 == resumed_at:  # the restart overhead ends here (see the lesson page)
                log(f"first step after the restart done at t={time.time():.3f}")
            if args.snapshot and step % args.snapshot_every == 0:
                done = done_before + steps_this_pass  # batches of this epoch trained so far
                at_end = done == batches_per_epoch  # then the next thing to do is a new epoch
                where = (epoch + 1, 0) if at_end else (epoch, done)
                save_snapshot(args.snapshot, model, optimizer, *where, step)

        tic = time.perf_counter()
        train_loss, images, steps = train_one_epoch(
            model, train_loader, optimizer, device, left, rank == 0 and show_progress(args.quiet),
            after_step, amp=args.amp == "bf16",
        )  # fmt: skip
        seconds = time.perf_counter() - tic  # .item() in train_one_epoch waited for the GPU
        # Each rank knows its own shard's loss and count: add them up over the ranks.
        totals = torch.tensor([train_loss * images, images], dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        train_loss, images = (totals[0] / totals[1]).item(), int(totals[1].item())
        images_total += images
        train_seconds += seconds
        complete = done_before + steps == batches_per_epoch
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
                    "images_per_second": images / max(seconds, 1e-9),
                    "steps": steps,
                    "complete": complete,
                }
            )
            log(
                f"epoch {epoch + 1}/{args.epochs}: train loss {train_loss:.4f}, test loss "
                f"{test_loss:.4f}, test accuracy {accuracy:.2%}, {images / seconds:,.0f} img/s"
            )
        # Only a complete epoch is saved: the snapshot is what resumes mid-epoch.
        if rank == 0 and args.checkpoint and complete:
            checkpoint.save(
                checkpoint_state(model.module, optimizer, epoch + 1, step), args.checkpoint
            )
        dist.barrier()

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


# --8<-- [start:main]
# @record: if this process dies of an exception, torchrun's error file gets
# the traceback, and the agent's failure summary shows it for this rank.
@record
def main(argv=None) -> None:
    args = parse_args(argv)
    if "LOCAL_RANK" not in os.environ:
        raise ValueError("start me with torchrun: torchrun --standalone --nproc_per_node=2 ...")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = args.backend or ("nccl" if gpus and dist.is_nccl_available() else "gloo")
    if args.sync_bn and backend != "nccl":
        raise ValueError("--sync-bn needs --backend nccl: SyncBatchNorm runs on CUDA tensors only")
    redirect_output_for_rank(int(os.environ["RANK"]))  # the grader's per-rank logs
    if os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1" and os.environ["RANK"] == "0":
        # torchrun's shared store can hand a restarted group the old attempt's
        # addresses (pytorch/pytorch#135712, #167288): restarts then fail to connect.
        print("warning: set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for reliable restarts")
    # torchrun already sets OMP_NUM_THREADS=1 for several ranks per machine;
    # cpu_share respects it (lesson 03 explains why each rank needs a share).
    torch.set_num_threads(cpu_share(int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    rank, _local_rank, world_size, device = setup(backend)
    try:
        train(rank, world_size, device, args)
    finally:  # also on error: leave no half-open connections behind
        dist.destroy_process_group()


# --8<-- [end:main]


if __name__ == "__main__":
    # A wrong flag or a missing folder prints one line and exits 2; a bug still shows its traceback.
    sys.exit(exit_with_one_line(main, prog="train.py"))
