"""Lesson 14 - composing the axes: pipeline, fully sharded data and tensor parallel, one mesh.

Run it:
    python lessons/14_composing/compose.py                          # pp 2 x dp 2 x tp 2: 8 ranks
    python lessons/14_composing/compose.py --pp 1 --dp 8 --tp 1     # the 1-D FSDP control
    python lessons/14_composing/compose.py --steps 20 --checkpoint ckpt            # save at 20
    python lessons/14_composing/compose.py --pp 1 --dp 4 --steps 40 --checkpoint ckpt  # resume
    python -m course grade 14                                       # grade your version
"""

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
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from course import data, models, options, ranks
from course.runtime import exit_with_one_line

# torch 2.8's checkpoint writer (the course container's) asks storage() and warns about it.
warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning)
VOCAB, BATCH = 64, 32  # BATCH sequences a step in all, whatever the mesh


def parse_args(argv=None):
    p = options.ArgumentParser(prog="compose.py", description=__doc__.splitlines()[0])
    p.add_argument("--pp", type=options.positive_int, default=2, help="pipeline stages")
    p.add_argument("--dp", type=options.positive_int, default=2, help="FSDP shards")
    p.add_argument("--tp", type=options.positive_int, default=2, help="ranks per block's MLP")
    p.add_argument("--nproc", type=options.positive_int, help="ranks (default: pp x dp x tp)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl if CUDA works")
    p.add_argument("--micro-batches", type=options.positive_int, default=4)
    p.add_argument("--dim", type=options.positive_int, default=64, help="model width")
    p.add_argument("--depth", type=options.positive_int, default=4, help="blocks, all stages")
    p.add_argument("--steps", type=options.positive_int, default=40, help="train up to this step")
    p.add_argument("--checkpoint", type=Path, help="resume from its latest step; save there")
    p.add_argument("--log-every", type=options.positive_int, default=10, help="steps a line")
    p.add_argument("--seed", type=int, default=0, help="the initial weights' seed")
    args = p.parse_args(argv)
    world = args.pp * args.dp * args.tp
    if args.nproc not in (None, world):
        p.error(f"--pp {args.pp} x --dp {args.dp} x --tp {args.tp} is {world} ranks, "
                f"not --nproc {args.nproc}")  # fmt: skip
    if args.depth % args.pp:
        p.error(f"--depth {args.depth} blocks do not split evenly into --pp {args.pp} stages")
    if 4 * args.dim % args.tp:
        p.error(f"{4 * args.dim} hidden units (4 x --dim) do not split into --tp {args.tp}")
    if BATCH % (args.dp * args.micro_batches):
        p.error(f"{BATCH} sequences a step do not split into --dp {args.dp} x "
                f"--micro-batches {args.micro_batches}")  # fmt: skip
    args.nproc, args.mesh = world, f"(pp {args.pp}, dp {args.dp}, tp {args.tp})"
    return args


# --8<-- [start:mesh]
def make_mesh(device_type: str, pp: int, dp: int, tp: int):
    """The ranks as a (pp, dp, tp) mesh, its axes named: mesh["tp"] is this rank's tensor-
    parallel group, mesh["dp"] its data-parallel one, mesh["pp"] its pipeline."""
    # TODO: make the 3-D device mesh, tp the last (fastest-varying) axis, pp the first.
    raise NotImplementedError("TODO at 14_composing/compose.py:75 is not done yet")


# --8<-- [end:mesh]
# --8<-- [start:stage]
def stage_of(model: models.StagedLM, stage: int, stages: int) -> models.StagedLM:
    """Cut `model` in place to pipeline stage `stage` of `stages`: the same number of
    blocks on every stage, the embedding on the first, the norm and head on the last."""
    # TODO: delete the blocks that are not this stage's, and set to None the embedding
    #   (except on the first stage) and the norm and head (except on the last).
    raise NotImplementedError("TODO at 14_composing/compose.py:85 is not done yet")
    return model


# --8<-- [end:stage]
# --8<-- [start:parallelize]
def parallelize(model: models.StagedLM, mesh) -> None:
    """Tensor parallelism inside each block (over mesh["tp"]), then FSDP2 over mesh["dp"]:
    each block one unit, then the root, which takes what is left."""
    # TODO: for each block, split its up layer column-wise and its down layer row-wise
    #   on the tp axis, then shard the block with fully_shard on the dp axis; last, shard
    #   the root the same way.
    raise NotImplementedError("TODO at 14_composing/compose.py:97 is not done yet")


# --8<-- [end:parallelize]
# --8<-- [start:pipeline]
def pipeline(model: models.StagedLM, mesh, micro_batches: int, device):
    """This rank's stage as a PipelineStage over mesh["pp"], and a 1F1B schedule of it."""

    def loss_fn(logits, targets):  # per micro-batch; the schedule averages the gradients
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    # TODO: wrap the model in a PipelineStage whose index and count are this rank's place
    #   on the pp axis, talking over that axis's group; return a Schedule1F1B of it.
    raise NotImplementedError("TODO at 14_composing/compose.py:110 is not done yet")


# --8<-- [end:pipeline]
# --8<-- [start:checkpoint]
def save(model, optimizer, step: int, folder: Path) -> Path:
    """Every rank writes its shards of its stage into folder/step-NNNNNN, keyed by the
    whole model's parameter names; rank 0 renames the folder once all have written."""
    final, temporary = folder / f"step-{step:06d}", folder / f".step-{step:06d}.tmp"
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state, "step": torch.tensor(step)},
             checkpoint_id=temporary)  # fmt: skip
    if dist.get_rank() == 0:
        os.replace(temporary, final)
    dist.barrier()
    return final


def load(model, optimizer, path: Path) -> int:
    """Fill this rank's stage and shards from `path`, whatever mesh saved it."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])  # fmt: skip
    return int(state["step"])


# --8<-- [end:checkpoint]


def train(rank: int, device, args) -> None:
    mesh = make_mesh(device.type, args.pp, args.dp, args.tp)
    stage, dp_rank = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    first, last = stage == 0, stage == args.pp - 1
    torch.manual_seed(args.seed)  # the whole model's weights, the same on every rank
    model = stage_of(models.StagedLM(VOCAB, args.dim, args.depth), stage, args.pp)
    parallelize(model.to(device), mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    schedule = pipeline(model, mesh, args.micro_batches, device) if args.pp > 1 else None
    summed = not ranks.reduce_scatter_averages()  # PyTorch 2.8 on gloo: see lesson 10
    start, found = 0, args.checkpoint and latest(args.checkpoint)
    if found and (start := load(model, optimizer, found)) and rank == 0:
        print(f"resumed from {found} (step {start}) on mesh {args.mesh}")
    for step in range(start + 1, args.steps + 1):
        tokens, targets = data.lookup_tokens(step, 0, BATCH, VOCAB)  # the global batch
        tokens, targets = (t.chunk(args.dp)[dp_rank].to(device) for t in (tokens, targets))
        if schedule is None:
            loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
            loss.backward()
        else:  # the first stage gives the inputs, the last the targets and the losses
            losses = []
            kwargs = dict(target=targets, losses=losses) if last else {}
            schedule.step(*([tokens] if first else []), **kwargs)
            loss = torch.stack(losses).mean() if last else None
        for p in model.parameters() if summed else ():  # FSDP asked for the mean, got the sum
            p.grad /= args.dp
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # The loss lives on the last stage, the same on its tp ranks: count each row once.
        mine = last and mesh["tp"].get_local_rank() == 0
        mean, _ = ranks.mean_over_ranks(loss.item() if mine else 0.0, len(tokens) * mine)
        if rank == 0 and (step % args.log_every == 0 or step in (start + 1, args.steps)):
            print(f"step {step}/{args.steps}: loss {mean:.4f}", flush=True)
    if args.checkpoint and start < args.steps:
        args.checkpoint.mkdir(parents=True, exist_ok=True)
        path = save(model, optimizer, args.steps, args.checkpoint)
        if rank == 0:
            print(f"saved {path} on mesh {args.mesh}")


def latest(folder: Path) -> Path | None:
    """The newest complete checkpoint in `folder`, or None."""
    done = sorted(folder.glob("step-*")) if folder.is_dir() else []
    return done[-1] if done else None


def worker(rank: int, world: int, backend: str, port: int, args) -> None:
    torch.set_num_threads(ranks.cpu_share(world))
    device = ranks.join_local(rank, world, backend, port)
    try:
        if rank == 0:
            print(f"{world} ranks as mesh {args.mesh}, {args.depth} blocks", flush=True)
        train(rank, device, args)
        dist.barrier()  # leave together
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    args = parse_args(argv)
    backend, world = ranks.backend_and_world_size(args.backend, args.nproc)
    if args.checkpoint and args.checkpoint.is_dir():  # a save that a crash cut short
        for partial in args.checkpoint.glob(".step-*.tmp"):
            shutil.rmtree(partial)
    mp.spawn(worker, args=(world, backend, ranks.free_port(), args), nprocs=world)


if __name__ == "__main__":
    sys.exit(exit_with_one_line(main))
