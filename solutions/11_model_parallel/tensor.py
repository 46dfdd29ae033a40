"""Lesson 11 - model parallelism, part 2: tensor parallelism, every MLP split across ranks.

Run it:
    python lessons/11_model_parallel/tensor.py --nproc 2 --backend gloo     # by hand
    python lessons/11_model_parallel/tensor.py --split dtensor              # PyTorch's DTensor
    python lessons/11_model_parallel/tensor.py --split none                 # every rank whole
    python lessons/11_model_parallel/tensor.py --nproc 4 --split dtensor --data-parallel 2
    python -m course grade 11                                               # grade your version
"""

import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from course import data, models, options, ranks
from course.runtime import exit_with_one_line

VOCAB = 64


def parse_args(argv=None):
    p = options.ArgumentParser(prog="tensor.py", description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=options.positive_int, help="ranks (default: GPUs, or 2)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl if CUDA works")
    p.add_argument("--split", choices=("hand", "dtensor", "none"), default="hand")
    p.add_argument("--data-parallel", type=options.positive_int, default=1,
                   help="a 2-D mesh's rows (--split dtensor), each a replica")  # fmt: skip
    p.add_argument("--dim", type=options.positive_int, default=64, help="model width")
    p.add_argument("--depth", type=options.positive_int, default=2, help="blocks")
    p.add_argument("--steps", type=options.positive_int, default=60)
    p.add_argument("--seed", type=int, default=0, help="the initial weights' seed")
    return p.parse_args(argv)


# --8<-- [start:hand]
class CopyToRanks(torch.autograd.Function):
    """Megatron's f: the same input on every rank in forward; in backward, each rank has
    the gradient of its own slice of the layer only, and the input's gradient is their sum."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        # TODO: the input's gradient is the sum of every rank's: return it.
        # HINT 1: One collective sums a tensor over the ranks, in place, on every rank.
        # HINT 2: grad = grad.clone(); dist.all_reduce(grad); return grad
        ### BEGIN SOLUTION
        grad = grad.clone()  # autograd may hand the same tensor to others: do not change it
        dist.all_reduce(grad)
        return grad
        ### END SOLUTION


class SumOverRanks(torch.autograd.Function):
    """Megatron's g: each rank's partial output summed over the ranks in forward; in
    backward every rank already has the whole gradient of the sum."""

    @staticmethod
    def forward(ctx, partial):
        # TODO: return the sum of `partial` over the ranks.
        # HINT 1: The same collective as f's backward; forward only.
        # HINT 2: total = partial.clone(); dist.all_reduce(total); return total
        ### BEGIN SOLUTION
        total = partial.clone()
        dist.all_reduce(total)
        return total
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        return grad


class ParallelMLP(nn.Module):
    """The MLP of a course Block, split Megatron-style: `up` by its output features (each
    rank a slice of the hidden units), `down` by its input features (the same slice).
    Each rank holds 1/world of both weights; one all-reduce in forward, one in backward."""

    def __init__(self, block: models.Block, rank: int, world: int):
        super().__init__()
        # TODO: keep this rank's slice of up's weight and bias, and of down's weight (as
        # nn.Parameters, copies); down's bias whole.
        # HINT 1: nn.Linear keeps weight as (out_features, in_features): up's output
        #   features are its weight's rows, down's input features its weight's columns.
        # HINT 2: up.weight.detach().chunk(world, 0)[rank].clone(), the same for up.bias;
        #   down.weight.detach().chunk(world, 1)[rank].clone(); down.bias.detach().clone().
        ### BEGIN SOLUTION
        up, down = block.up, block.down
        self.up_weight = nn.Parameter(up.weight.detach().chunk(world, 0)[rank].clone())
        self.up_bias = nn.Parameter(up.bias.detach().chunk(world, 0)[rank].clone())
        self.down_weight = nn.Parameter(down.weight.detach().chunk(world, 1)[rank].clone())
        self.down_bias = nn.Parameter(down.bias.detach().clone())
        ### END SOLUTION

    def forward(self, x):
        # TODO: x (the same on every rank) -> f -> up's slice -> gelu -> down's slice ->
        # g -> plus down's bias.
        # HINT 1: down's bias belongs to the sum: added on each rank before g, it would be
        #   counted world times.
        # HINT 2: h = F.gelu(F.linear(CopyToRanks.apply(x), self.up_weight, self.up_bias));
        #   return SumOverRanks.apply(F.linear(h, self.down_weight)) + self.down_bias
        ### BEGIN SOLUTION
        h = F.gelu(F.linear(CopyToRanks.apply(x), self.up_weight, self.up_bias))
        return SumOverRanks.apply(F.linear(h, self.down_weight)) + self.down_bias
        ### END SOLUTION


class ParallelBlock(nn.Module):
    """A course Block whose MLP is split; its norm stays whole on every rank."""

    def __init__(self, block: models.Block, rank: int, world: int):
        super().__init__()
        self.norm, self.mlp = block.norm, ParallelMLP(block, rank, world)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


# --8<-- [end:hand]


# --8<-- [start:dtensor]
def parallelize(block: models.Block, mesh) -> models.Block:
    """The same split with PyTorch's DTensor: up column-wise, down row-wise, on `mesh`."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    # TODO: parallelize the block's up and down layers on the mesh, and return the block.
    # HINT 1: Column-wise: the output features split (the output stays sharded); row-wise:
    #   the input features split, the partial outputs summed (an all-reduce).
    # HINT 2: parallelize_module(block, mesh, {"up": ColwiseParallel(),
    #   "down": RowwiseParallel()})
    ### BEGIN SOLUTION
    return parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    ### END SOLUTION


# --8<-- [end:dtensor]


def build(rank: int, world: int, device, args, split: str):
    """The model, the same weights on every rank (one seed), its blocks split by `split`;
    and, with --split dtensor, the group of this rank's data-parallel replicas."""
    torch.manual_seed(args.seed)  # built in pipeline.py's order: the same weights as there
    embed, blocks = (
        nn.Embedding(VOCAB, args.dim),
        [models.Block(args.dim) for _ in range(args.depth)],
    )
    group = None
    if split == "hand":
        blocks = [ParallelBlock(b, rank, world) for b in blocks]
    elif split == "dtensor":
        from torch.distributed.device_mesh import init_device_mesh

        # Rows replicate the model (data parallel); a row's ranks split each MLP (tensor
        # parallel): the all-reduces of every layer stay inside a row, NVLink's on GPUs.
        shape, names = (args.data_parallel, world // args.data_parallel), ("dp", "tp")
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
        blocks = [parallelize(b.to(device), mesh["tp"]) for b in blocks]
        group = mesh["dp"].get_group()
    head = [nn.LayerNorm(args.dim), nn.Linear(args.dim, VOCAB)]
    return nn.Sequential(embed, *blocks, *head).to(device), group


def local_bytes(model: nn.Module) -> int:
    """Bytes of the parameters this rank holds (a DTensor's local shard only)."""
    return sum(getattr(p, "_local_tensor", p).nbytes for p in model.parameters())


def worker(rank: int, world: int, backend: str, port: int, args) -> None:
    torch.set_num_threads(ranks.cpu_share(world))
    device = ranks.join_local(rank, world, backend, port)
    try:
        model, replicas = build(rank, world, device, args, args.split)
        whole = local_bytes(build(0, 1, torch.device("cpu"), args, "none")[0])
        rows, row = args.data_parallel, rank // (world // args.data_parallel)
        if rank == 0:
            mine = local_bytes(model)
            print(f"{world} ranks, --split {args.split}: rank 0 holds {mine:,} parameter "
                  f"bytes of {whole:,} ({mine / whole:.0%})", flush=True)  # fmt: skip
        # DTensors and plain tensors in groups of their own: on CUDA, AdamW updates a group
        # in one foreach call, which cannot mix the two.
        kinds: dict[bool, list] = {}
        for p in model.parameters():
            kinds.setdefault(hasattr(p, "_local_tensor"), []).append(p)
        optimizer = torch.optim.AdamW([{"params": ps} for ps in kinds.values()], lr=3e-3)
        for step in range(1, args.steps + 1):
            # A row's ranks the same batch (they split the layers, not the data); each row
            # its share of it.
            tokens, targets = (t.to(device) for t in data.lookup_tokens(step, 0, 32, VOCAB))
            tokens, targets = tokens.chunk(rows)[row], targets.chunk(rows)[row]
            loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
            loss.backward()
            for p in model.parameters() if rows > 1 else ():  # the rows' average, as DDP
                grad = getattr(p.grad, "_local_tensor", p.grad)  # a DTensor's own shard
                dist.all_reduce(grad, group=replicas)
                grad /= rows
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            mean, _ = ranks.mean_over_ranks(loss.item(), len(tokens))  # the whole batch's
            if rank == 0 and (step % 20 == 0 or step in (1, args.steps)):
                print(f"step {step}/{args.steps}: loss {mean:.4f}", flush=True)
        dist.barrier()  # leave together
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    args = parse_args(argv)
    backend, world = ranks.backend_and_world_size(args.backend, args.nproc)
    if world % args.data_parallel or (args.data_parallel > 1 and args.split != "dtensor"):
        raise SystemExit(f"tensor.py: error: --data-parallel {args.data_parallel} needs "
                         f"--split dtensor and divides the {world} ranks")  # fmt: skip
    if 4 * args.dim % (world // args.data_parallel):
        raise SystemExit(f"tensor.py: error: {4 * args.dim} hidden units do not split in {world}")
    mp.spawn(worker, args=(world, backend, ranks.free_port(), args), nprocs=world)


if __name__ == "__main__":
    sys.exit(exit_with_one_line(main))
