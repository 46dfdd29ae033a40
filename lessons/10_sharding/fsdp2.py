"""Lesson 10 - sharding, part 3: PyTorch's FSDP2, and checkpoints any number of ranks resume.

Run it:
    python lessons/10_sharding/fsdp2.py --nproc 2 --steps 30 --checkpoint ckpt   # save at 30
    python lessons/10_sharding/fsdp2.py --nproc 1 --steps 60 --checkpoint ckpt   # resume on 1
    python lessons/10_sharding/fsdp2.py --compute-dtype bf16 --no-reshard-after-forward
    python -m course grade 10                                                  # grade yours
"""

import argparse
import os
import shutil
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from course import data, models, options, ranks
from course.runtime import exit_with_one_line

# torch 2.8's checkpoint writer (the course container's) asks storage() and warns about it.
warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning)
VOCAB, BATCH = 64, 48  # BATCH sequences a step in all, whatever the rank count: 48 = 1x2x3x8
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args(argv=None):
    p = options.ArgumentParser(prog="fsdp2.py", description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=options.positive_int, help="ranks (default: GPUs, or 2)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl if CUDA works")
    p.add_argument("--compute-dtype", choices=DTYPES, default="fp32")
    p.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction,
                   default=True, help="free each block's full weights after forward")  # fmt: skip
    p.add_argument("--dim", type=options.positive_int, default=64, help="model width")
    p.add_argument("--depth", type=options.positive_int, default=2, help="blocks")
    p.add_argument("--steps", type=options.positive_int, default=60, help="train up to this step")
    p.add_argument("--checkpoint", type=Path, help="resume from its latest step; save there")
    p.add_argument("--seed", type=int, default=0, help="the initial weights' seed")
    return p.parse_args(argv)


# --8<-- [start:shard]
def shard(model: models.TinyLM, compute_dtype, reshard: bool) -> None:
    """FSDP2 on `model`, in place: each block its own unit (gathered just before it runs),
    then the root, which takes what is left (the embedding, tied to the head, and the norm).
    Weights are gathered and used in `compute_dtype`; gradients are reduced in fp32."""
    # The ranks and the device the shards live on. Without a mesh FSDP2 picks CUDA
    # whenever a GPU is visible, even for a CPU model on gloo: name the model's device.
    mesh = init_device_mesh(next(model.parameters()).device.type, (dist.get_world_size(),))
    # TODO: build a MixedPrecisionPolicy whose param_dtype is compute_dtype (None keeps fp32)
    #   and whose reduce_dtype is fp32, then call fully_shard on every block, then on the
    #   root, each with the mesh, that policy and reshard_after_forward=reshard.
    raise NotImplementedError("TODO at 10_sharding/fsdp2.py:62 is not done yet")


# --8<-- [end:shard]
# --8<-- [start:checkpoint]
def save(model, optimizer, step: int, folder: Path) -> Path:
    """Every rank writes its own shards of the model and the optimizer, and rank 0 the
    step, into folder/step-NNNNNN, at once: a crash mid-save leaves no such folder."""
    final = folder / f"step-{step:06d}"
    temporary = folder / f".step-{step:06d}.tmp"
    # TODO: get the model's and the optimizer's state dicts (sharded: each rank's own
    #   part), save them and the step with torch.distributed.checkpoint into `temporary`,
    #   and once every rank is done, let rank 0 rename it to `final`.
    raise NotImplementedError("TODO at 10_sharding/fsdp2.py:75 is not done yet")
    return final


def latest(folder: Path) -> Path | None:
    """The newest complete checkpoint in `folder`, or None."""
    done = sorted(folder.glob("step-*")) if folder.is_dir() else []
    return done[-1] if done else None


def load(model, optimizer, path: Path) -> int:
    """Fill the sharded model and optimizer from `path`, however many ranks saved it;
    returns the step it was saved at."""
    # TODO: load into state dicts shaped for *this* run (get_state_dict), with
    #   torch.distributed.checkpoint, then put them into the model and the optimizer.
    raise NotImplementedError("TODO at 10_sharding/fsdp2.py:90 is not done yet")


# --8<-- [end:checkpoint]


def train(rank: int, world_size: int, device, args) -> None:
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = models.TinyLM(VOCAB, args.dim, args.depth).to(device)
    shard(model, DTYPES[args.compute_dtype], args.reshard_after_forward)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    summed = not ranks.reduce_scatter_averages()  # PyTorch 2.8 on gloo: see the page
    start = 0
    if args.checkpoint and (found := latest(args.checkpoint)):
        start = load(model, optimizer, found)
        if rank == 0:
            print(f"resumed from {found} (step {start}) on {world_size} ranks")
        if start >= args.steps and rank == 0:  # a re-run of the same command: say so
            print(
                f"nothing to train: {found} is at step {start}, --steps {args.steps} (a "
                "higher --steps trains on; another --checkpoint folder starts afresh)"
            )
    for step in range(start + 1, args.steps + 1):
        tokens, targets = data.lookup_tokens(step, 0, BATCH, VOCAB)  # the global batch
        tokens, targets = (t.chunk(world_size)[rank].to(device) for t in (tokens, targets))
        logits = model(tokens)
        if step == start + 1 and rank == 0:  # sharded parameters are DTensors, whole ones not
            whole = [not isinstance(p, DTensor) for b in model.blocks for p in b.parameters()]
            print(f"{world_size} ranks, logits in {logits.dtype}; after forward "
                  f"{sum(whole)} of {len(whole)} block parameters are whole")  # fmt: skip
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()  # FSDP2 reduce-scatters each block's gradient as backward leaves it
        for p in model.parameters() if summed else ():  # it asked for the mean, got the sum
            p.grad /= world_size
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mean, _ = ranks.mean_over_ranks(loss.item(), len(tokens))
        if rank == 0 and (step % 20 == 0 or step in (start + 1, args.steps)):
            print(f"step {step}/{args.steps}: loss {mean:.4f}")
    if args.checkpoint and start < args.steps:
        args.checkpoint.mkdir(parents=True, exist_ok=True)
        path = save(model, optimizer, args.steps, args.checkpoint)
        if rank == 0:
            print(f"saved {path} on {world_size} ranks")


def worker(rank: int, world_size: int, backend: str, port: int, args) -> None:
    torch.set_num_threads(ranks.cpu_share(world_size))
    device = ranks.join_local(rank, world_size, backend, port)
    try:
        train(rank, world_size, device, args)  # its model and optimizer are gone on return
        dist.barrier()  # leave together
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    args = parse_args(argv)
    backend, world_size = ranks.backend_and_world_size(args.backend, args.nproc)
    if BATCH % world_size:
        raise ValueError(f"{world_size} ranks do not divide the global batch of {BATCH}")
    if args.checkpoint and args.checkpoint.is_dir():  # a save that a crash cut short
        for partial in args.checkpoint.glob(".step-*.tmp"):
            shutil.rmtree(partial)
    mp.spawn(worker, args=(world_size, backend, ranks.free_port(), args), nprocs=world_size)


if __name__ == "__main__":
    # A wrong flag prints one line and exits 2; a bug still shows its traceback.
    sys.exit(exit_with_one_line(main))
