"""Lesson 13 - mixture of experts, part 2: expert parallelism, tokens sent to their experts'
ranks and back by all-to-all.

Run it:
    python lessons/13_experts/experts.py --nproc 2 --backend gloo        # 8 experts, 4 a rank
    python lessons/13_experts/experts.py --nproc 4 --data-parallel 2     # experts x data, 2 x 2
    python -m course grade 13                                            # grade your version
"""

import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from moe import VOCAB, Expert, balance_loss, capacity, kept, route  # your part 1
from torch import nn

from course import data, options, ranks
from course.runtime import exit_with_one_line


def parse_args(argv=None):
    p = options.ArgumentParser(prog="experts.py", description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=options.positive_int, help="ranks (default: GPUs, or 2)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl if CUDA works")
    p.add_argument("--experts", type=options.positive_int, default=8)
    p.add_argument("--data-parallel", type=options.positive_int, default=1,
                   help="groups of ranks that each hold every expert, split")  # fmt: skip
    p.add_argument("--dim", type=options.positive_int, default=32, help="model width")
    p.add_argument("--batch-size", type=options.positive_int, default=8, help="a rank's")
    p.add_argument("--steps", type=options.positive_int, default=100)
    p.add_argument("--seed", type=int, default=0, help="the initial weights' seed")
    return p.parse_args(argv)


# --8<-- [start:alltoall]
class AllToAll(torch.autograd.Function):
    """Rows of x to the ranks of `group`, `send[i]` of them to rank i, in order; returns the
    rows received, `receive[i]` from rank i. Backward sends the gradients back the other way."""

    @staticmethod
    def forward(ctx, x, send: list[int], receive: list[int], group):
        # TODO: one all_to_all_single with these uneven splits; keep what backward needs.
        raise NotImplementedError("TODO at 13_experts/experts.py:45 is not done yet")

    @staticmethod
    def backward(ctx, grad):
        # TODO: the rows' gradients go back where the rows came from: the same call with
        # the splits swapped. Return x's gradient and None for the rest.
        raise NotImplementedError("TODO at 13_experts/experts.py:51 is not done yet")


# --8<-- [end:alltoall]


# --8<-- [start:layer]
class ExpertParallel(nn.Module):
    """The MoE layer with its experts split over the ranks of `group` (rank i of n holds
    experts i x E/n to (i + 1) x E/n - 1); the router whole on every rank."""

    def __init__(self, router, experts, k, factor, group):
        super().__init__()
        self.group, self.k, self.factor, self.n = group, k, factor, len(experts)
        size, me = dist.get_world_size(group), dist.get_rank(group)
        self.per = self.n // size  # experts a rank holds
        self.router, self.local = (
            router,
            nn.ModuleList(experts[me * self.per : (me + 1) * self.per]),
        )

    def forward(self, x):
        probs, gates, experts = route(self.router(x), self.k)
        keep = kept(experts, self.n, capacity(len(x), self.n, self.k, self.factor))
        tokens, slots = keep.nonzero(as_tuple=True)
        # TODO: dispatch: the kept (token, slot) pairs in order of their expert; each expert's
        # count, exchanged by an all-to-all of counts (each owner learns how many rows of
        # each of its experts every rank sends); the rows themselves by AllToAll.
        raise NotImplementedError("TODO at 13_experts/experts.py:79 is not done yet")
        # Rows arrive by source rank, and within each by expert: each piece to its expert.
        pieces = inbox.split(arrived.tolist())
        done = torch.cat([self.local[i % self.per](p) for i, p in enumerate(pieces)])
        back = AllToAll.apply(done, receive, send, self.group)  # to the sources, in order
        out = torch.zeros_like(x).index_add(0, tokens, back * gates[tokens, slots, None])
        return out, balance_loss(probs, experts, self.n), {"sent": sum(send)}


# --8<-- [end:layer]


def groups(world: int, dp: int):
    """Every rank's two groups: the ranks that split the experts (a row of dp x ep) and the
    ranks that hold the same experts (a column). Every rank creates every group, in order."""
    ep = world // dp
    rows = [dist.new_group(list(range(r * ep, (r + 1) * ep))) for r in range(dp)]
    cols = [dist.new_group(list(range(c, world, ep))) for c in range(ep)]
    rank = dist.get_rank()
    return rows[rank // ep], cols[rank % ep]


# --8<-- [start:grads]
def average_gradients(model, experts_of_mine, same_experts, world: int) -> None:
    """After backward: the mean gradient of the whole batch over every rank."""
    # TODO: the dense parameters (everything but this rank's experts) were used by every
    # rank: sum over every rank. This rank's experts' gradients already hold the share of
    # every rank of its expert group (backward's all-to-all brought them): sum over the
    # ranks holding the same experts only. Each rank's loss is its own tokens' mean, so
    # divide both by the world size.
    raise NotImplementedError("TODO at 13_experts/experts.py:109 is not done yet")


# --8<-- [end:grads]


class Model(nn.Module):
    def __init__(self, args, group):
        super().__init__()
        torch.manual_seed(args.seed)  # every rank the same weights, every expert's too
        self.embed, self.norm = nn.Embedding(VOCAB, args.dim), nn.LayerNorm(args.dim)
        router = nn.Linear(args.dim, args.experts, bias=False)
        experts = [Expert(args.dim) for _ in range(args.experts)]
        self.moe = ExpertParallel(router, experts, 2, 1.25, group)
        self.head = nn.Linear(args.dim, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens).flatten(0, 1)
        y, aux, stats = self.moe(self.norm(x))
        return self.head(x + y), aux, stats


def worker(rank: int, world: int, backend: str, port: int, args) -> None:
    torch.set_num_threads(ranks.cpu_share(world))
    device = ranks.join_local(rank, world, backend, port)
    try:
        experts_group, same_experts = groups(world, args.data_parallel)
        model = Model(args, experts_group).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for step in range(1, args.steps + 1):
            tokens, targets = (
                t.to(device) for t in data.lookup_tokens(step, rank, args.batch_size, VOCAB)
            )
            logits, aux, stats = model(tokens)
            loss = F.cross_entropy(logits, targets.flatten())
            (loss + 0.01 * aux).backward()
            average_gradients(model, model.moe.local, same_experts, world)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            mean, _ = ranks.mean_over_ranks(loss.item(), tokens.numel())
            if step % 25 == 0 or step == 1:
                sent = [None] * world
                dist.all_gather_object(sent, stats["sent"])
                if rank == 0:
                    ranks.say(
                        f"step {step}/{args.steps}: loss {mean:.4f}, rows sent by rank {sent}"
                    )
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    args = parse_args(argv)
    backend, world = ranks.backend_and_world_size(args.backend, args.nproc)
    ep = world // args.data_parallel
    if world % args.data_parallel or args.experts % ep:
        raise SystemExit(f"experts.py: error: {world} ranks in groups of --data-parallel "
                         f"{args.data_parallel} leave {world / args.data_parallel:g} to split "
                         f"{args.experts} experts: it must divide both")  # fmt: skip
    mp.spawn(worker, args=(world, backend, ranks.free_port(), args), nprocs=world)


if __name__ == "__main__":
    sys.exit(exit_with_one_line(main))
