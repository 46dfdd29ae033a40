"""Lesson 04 - torchrun: the same DDP training, started by torchrun, surviving a crash.

Run it:
    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1     # reliable restarts (see the page)
    torchrun --standalone --nproc_per_node=2 --max-restarts 3 lessons/04_torchrun/train.py \
        --backend gloo --snapshot runs/04/snapshot.pt --snapshot-every 5
    python -m course grade 04                                          # grade your version
"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
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
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl if CUDA works")
    p.add_argument("--snapshot", help="snapshot file: resume from it, update it every K steps")
    p.add_argument("--snapshot-every", type=options.positive_int, default=20, metavar="K")
    return options.parse(p, argv)


# --8<-- [start:setup]
def setup(backend: str) -> tuple[int, int, torch.device]:
    """Join the process group torchrun set up; returns (rank, world size, device)."""
    # COURSE_PG_TIMEOUT seconds (the grader's is below its deadline; else 120 s), read as the
    # rank joins: a rank that never arrives ends in PyTorch's own error, not a long hang.
    limit = ranks.process_group_timeout()
    # TODO: who is this process? torchrun says it in the environment: its local rank on this
    # machine (which picks its GPU), its global rank, the world size and where to meet.
    # HINT 1: torchrun passes everything through environment variables, as strings. As
    #   in lesson 03, set the current GPU before joining.
    # HINT 2: LOCAL_RANK, RANK, WORLD_SIZE; dist.init_process_group(backend,
    #   timeout=limit, device_id=...) with no rank, world_size or init_method: its
    #   default "env://" reads them.
    # HINT 3: local_rank = int(os.environ["LOCAL_RANK"]); device = torch.device("cuda",
    #   local_rank) with nccl, else cpu; torch.cuda.set_device(device) on a GPU; then
    #   init_process_group.
    ### BEGIN SOLUTION
    local_rank = int(os.environ["LOCAL_RANK"])
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpu = torch.device("cuda", local_rank) if backend == "nccl" else None
    if gpu is not None:
        torch.cuda.set_device(gpu)
    dist.init_process_group(backend, timeout=limit, device_id=gpu)
    return rank, world_size, gpu or torch.device("cpu")
    ### END SOLUTION


# --8<-- [end:setup]


# --8<-- [start:train_step]
def train_one_epoch(
    model, loader, optimizer, device, max_steps=None, progress=False, amp=False, on_step=None
):
    """One pass over `loader` (or `max_steps` steps); returns (mean loss, images, steps).

    amp: run the forward pass and the loss under bf16 autocast.
    on_step(steps): called after every optimizer step; snapshots happen there."""
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
        if on_step is not None:
            on_step(steps)
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


# --8<-- [end:checkpoint]


# --8<-- [start:snapshot]
def save_snapshot(path, model, optimizer, epoch: int, batches_done: int, step: int) -> None:
    """Every rank calls this at the same step; one rank writes the file."""
    rng = [None] * dist.get_world_size()  # each rank's generators are its own: gather them
    dist.all_gather_object(rng, rng_state())
    # TODO: write a snapshot from which a restarted group continues exactly where this one
    # stopped, even mid-epoch. One rank writes it; a crash while writing must leave the
    # previous snapshot intact.
    # HINT 1: Besides lesson 01's weights, optimizer and RNG, a mid-epoch restart needs
    #   to know how many batches of the epoch are done, and which world size the shards
    #   were cut for. Write to a temporary file and rename it onto the name: a rename is
    #   atomic.
    # HINT 2: save(state, path), imported at the top, is torch.save to a temporary file
    #   renamed onto the name; the keys "model" (model.module.state_dict()), "optimizer",
    #   "epoch", "batches_done", "step", "rng" (the list of every rank's) and "world_size".
    # HINT 3: if dist.get_rank() == 0: save({...}, path).
    ### BEGIN SOLUTION
    if dist.get_rank() == 0:
        state = checkpoint_state(model.module, optimizer, epoch, step)
        state.update(rng=rng, batches_done=batches_done, world_size=dist.get_world_size())
        save(state, path)
    ### END SOLUTION
    # No barrier: only a restarted group reads the file, and torchrun restarts a
    # group only after every process of the old one has exited.


def load_snapshot(path, model, optimizer, device) -> tuple[int, int, int]:
    """Restore a snapshot on every rank; returns (epoch, batches done, step)."""
    # torch.load with weights_only=True onto `device`: a snapshot holds data, never code.
    state, world_size = checkpoint.load(path, device), dist.get_world_size()
    # TODO: put the snapshot `state` into this rank and return (epoch, batches_done, step).
    # Refuse, with a ValueError, one written by another number of ranks than `world_size`:
    # its shards and batch positions would not line up with this run's.
    # HINT 1: Undo save_snapshot: the weights into the plain model inside DDP, the
    #   optimizer, and this rank's own random generators.
    # HINT 2: state["world_size"] against world_size; model.module.load_state_dict;
    #   optimizer.load_state_dict; set_rng_state(state["rng"][rank]) (imported at the top).
    # HINT 3: return state["epoch"], state["batches_done"], state["step"].
    ### BEGIN SOLUTION
    if state["world_size"] != world_size:
        raise ValueError(f"{path} is from {state['world_size']} ranks, this job has {world_size}")
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"][dist.get_rank()])
    return state["epoch"], state["batches_done"], state["step"]
    ### END SOLUTION


# --8<-- [end:snapshot]


# --8<-- [start:train]
def train(rank: int, world_size: int, device: torch.device, args) -> dict | None:
    """The whole run, on every rank; returns the metrics on rank 0."""
    seed_everything(args.seed)  # the same seed on every rank: the same initial weights
    # The data set's tensors go to the device once (course/data.py).
    train_set, test_set, classes, channels = data.build_datasets(
        args.data, args.data_dir, args.image_size, device
    )
    # --8<-- [start:loaders]
    # A DistributedSampler that can skip the start of its shard (course/data.py).
    sampler = data.ResumableSampler(train_set, num_replicas=world_size, rank=rank, seed=args.seed)
    train_loader = data.loader(
        train_set, args.batch_size, device, args.num_workers, sampler=sampler
    )
    test_loader = data.loader(test_set, args.batch_size, device, args.num_workers)
    # --8<-- [end:loaders]
    # --8<-- [start:model]
    model = models.build_model(args.model, classes, channels, args.norm)
    model = model.to(device, memory_format=args.memory_format)
    # gradient_as_bucket_view: the gradients live in the all-reduce buckets, no copies;
    # NO_BUFFER_SYNC: only rank 0 reads BatchNorm's buffers, skip their broadcast.
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                gradient_as_bucket_view=True, **NO_BUFFER_SYNC)  # fmt: skip
    # --8<-- [end:model]
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)

    start_epoch = done = step = 0
    if args.snapshot and os.path.isfile(args.snapshot):  # every restart begins here
        start_epoch, done, step = load_snapshot(args.snapshot, model, optimizer, device)
        print(f"resumed from {args.snapshot} at step {step} (epoch {start_epoch + 1})")
    print(f"training {args.model} on {args.data} ({len(train_set)} images) on {device}")
    batch = args.batch_size * world_size  # what one optimizer step averages over
    print(f"{world_size} ranks x batch {args.batch_size} per rank = global batch {batch}")
    log = RunLog(args, start_epoch, world_size=world_size, global_batch_size=batch)
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        # TODO: in a resumed epoch, train only the batches the snapshot does not cover; the
        # epochs after it start at their first batch (`done` is reset below).
        # HINT 1: The sampler built above (a DistributedSampler that can resume) can skip
        #   a number of *indices* at the start of its shard; `done` counts *batches*. Leave
        #   `done` as it is until the epoch ends: this epoch's snapshots add the batches
        #   trained since the restart to it.
        # HINT 2: sampler.skip = done * args.batch_size.
        ### BEGIN SOLUTION
        sampler.skip = done * args.batch_size
        ### END SOLUTION
        if (left := options.steps_left(args, step)) == 0:
            break

        # After each step: a snapshot every K steps, saying where this epoch stands.
        def after_step(steps: int, epoch=epoch, done=done, first=step) -> None:
            if args.snapshot and (first + steps) % args.snapshot_every == 0:
                save_snapshot(args.snapshot, model, optimizer, epoch, done + steps, first + steps)

        tic = time.perf_counter()
        train_loss, images, steps = train_one_epoch(
            model, train_loader, optimizer, device, left, rank == 0 and args.progress,
            amp=args.amp == "bf16", on_step=after_step,
        )  # fmt: skip
        seconds = time.perf_counter() - tic  # .item() in train_one_epoch waited for the GPU
        step += steps
        train_loss, images = ranks.mean_over_ranks(train_loss, images)  # each knew its shard
        complete = steps == len(train_loader)
        if rank == 0:  # the replicas are identical: one evaluates (model.module, no DDP hooks)
            test_loss, accuracy = evaluate(model.module, test_loader, device)
            log.epoch(epoch + 1, train_loss, test_loss, accuracy, images, seconds, steps, complete)
        # Only a complete epoch is saved: a resumed run restarts at an epoch boundary.
        if rank == 0 and args.checkpoint and complete:
            state = checkpoint_state(model.module, optimizer, epoch + 1, step)
            save(state, args.checkpoint)
        dist.barrier()
        done = 0  # the next epoch starts at its first batch
    return log.finish(evaluate(model.module, test_loader, device)[1], step) if rank == 0 else None


# --8<-- [end:train]


# --8<-- [start:main]
@record  # a rank that dies of an exception: torchrun's failure report shows its traceback
def main(argv=None) -> None:
    args = parse_args(argv)
    backend = ranks.require_torchrun(args.backend)  # a clear error without torchrun
    rank, world_size, device = setup(backend)
    if rank != 0:  # one voice: rank 0 prints, the others work (their errors still show)
        sys.stdout = open(os.devnull, "w")
    # N ranks on this machine share its cores (lesson 03's page)
    torch.set_num_threads(ranks.cpu_share(int(os.environ["LOCAL_WORLD_SIZE"])))
    # Bit-identical resumes on GPUs need deterministic cuDNN algorithms, every attempt alike.
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        train(rank, world_size, device, args)
        dist.barrier()  # leave together: gloo can abort a rank that tears down alone
    finally:  # also on error: leave no half-open connections behind
        dist.destroy_process_group()


# --8<-- [end:main]


if __name__ == "__main__":
    # A wrong flag or a missing folder prints one line and exits 2; a bug still shows its traceback.
    sys.exit(exit_with_one_line(main))
