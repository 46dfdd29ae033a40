"""Lesson 12 - long sequences, part 2: context parallelism, one sequence split across ranks.

Run it:
    python lessons/12_long_sequences/ring.py --nproc 4 --backend gloo     # ring, zig-zag split
    python lessons/12_long_sequences/ring.py --split plain                # each rank one chunk
    python lessons/12_long_sequences/ring.py --attention gather           # all-gather K and V
    python -m course grade 12                                             # grade your version
"""

import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from course import memory, options, ranks
from course.attention import attend, attend_backward
from course.runtime import exit_with_one_line


def parse_args(argv=None):
    p = options.ArgumentParser(prog="ring.py", description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=options.positive_int, help="ranks (default: GPUs, or 2)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl if CUDA works")
    p.add_argument("--attention", choices=("ring", "gather"), default="ring")
    p.add_argument("--split", choices=("zigzag", "plain"), default="zigzag")
    p.add_argument("--seq", type=options.positive_int, default=1024, help="the whole sequence")
    p.add_argument("--batch-size", type=options.positive_int, default=2)
    p.add_argument("--heads", type=options.positive_int, default=4)
    p.add_argument("--head-dim", type=options.positive_int, default=32)
    return p.parse_args(argv)


# --8<-- [start:split]
def chunks_of(rank: int, world: int, split: str) -> list[int]:
    """Which chunks of the sequence `rank` holds: cut into `world` chunks (plain) or
    2 x world (zigzag), in order."""
    # TODO: plain: chunk `rank`; zigzag: chunk `rank` and its mirror from the end, so that
    # every rank holds one early chunk (little to attend to) and one late (a lot).
    # HINT 1: Of 2 x world chunks, numbered from 0, the mirror of chunk i is 2 x world - 1 - i.
    # HINT 2: return [rank] if split == "plain" else [rank, 2 * world - 1 - rank]
    ### BEGIN SOLUTION
    return [rank] if split == "plain" else [rank, 2 * world - 1 - rank]
    ### END SOLUTION


def shard(x, rank: int, world: int, split: str):
    """This rank's chunks of x's sequence (dimension -2), one after the other."""
    mine = chunks_of(rank, world, split)
    pieces = x.chunk(world * len(mine), dim=-2)
    return torch.cat([pieces[c] for c in mine], dim=-2)


# --8<-- [end:split]


# --8<-- [start:blocks]
def merge(out, lse, block_out, block_lse):
    """Two partial attentions of the same queries over different keys, as one: each
    weighted by its share of the softmax's normaliser (the online softmax)."""
    # TODO: return the merged output and log-sum-exp.
    # HINT 1: The whole normaliser is exp(lse) + exp(block_lse); its log, logaddexp(lse,
    #   block_lse). Each part was normalised by its own: re-weight it by exp(own - whole).
    # HINT 2: new = torch.logaddexp(lse, block_lse);
    #   return out * (lse - new).exp() + block_out * (block_lse - new).exp(), new
    ### BEGIN SOLUTION
    new = torch.logaddexp(lse, block_lse)
    return out * (lse - new).exp() + block_out * (block_lse - new).exp(), new
    ### END SOLUTION


def pairs(mine: list[int], theirs: list[int]):
    """The (query chunk, key chunk) pairs the causal mask leaves anything of: (i, j, causal)."""
    return [(i, j, a == b) for i, a in enumerate(mine) for j, b in enumerate(theirs) if a >= b]


def start(q, mine):
    """q's chunks, and for each an empty output and log-sum-exp (-inf: nothing seen yet)."""
    qs = q.chunk(len(mine), -2)
    return (
        qs,
        [torch.zeros_like(c) for c in qs],
        [torch.full_like(c[..., :1], -torch.inf) for c in qs],
    )


def accumulate(qs, out, lse, k, v, mine, theirs) -> None:
    """Attend this rank's query chunks `qs` to one rank's k and v (chunks `theirs`), merged
    into out and lse (lists, one per query chunk)."""
    ks, vs = k.chunk(len(theirs), -2), v.chunk(len(theirs), -2)
    for i, j, causal in pairs(mine, theirs):
        out[i], lse[i] = merge(out[i], lse[i], *attend(qs[i], ks[j], vs[j], causal))


# --8<-- [end:blocks]


# --8<-- [start:ring]
class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's queries to the whole sequence, whose keys and values
    travel the ring: one hop a step, never more than two ranks' at once on any rank."""

    @staticmethod
    def forward(ctx, q, k, v, split):
        rank, world = dist.get_rank(), dist.get_world_size()
        mine = chunks_of(rank, world, split)
        qs, out, lse = start(q, mine)
        # TODO: world steps: at step s this rank holds the keys and values of rank
        # (rank - s) % world. Start passing them on to the next rank and receiving the
        # previous rank's, attend to the ones held (accumulate), then wait for the message.
        # HINT 1: dist.isend(tensor, dst) and dist.irecv(buffer, src) return requests to
        #   .wait() for; one message of torch.stack([k, v]) a hop; no hop after the last step.
        # HINT 2: for s in range(world): if s < world - 1: start isend(kv, (rank + 1) %
        #   world) and irecv(incoming, (rank - 1) % world); accumulate(qs, out, lse, kv[0],
        #   kv[1], mine, chunks_of((rank - s) % world, world, split)); wait; kv = incoming
        ### BEGIN SOLUTION
        kv, after, before = torch.stack([k, v]), (rank + 1) % world, (rank - 1) % world
        for step in range(world):
            if step < world - 1:
                incoming = torch.empty_like(kv)
                hop = [dist.isend(kv, after), dist.irecv(incoming, before)]
            theirs = chunks_of((rank - step) % world, world, split)
            accumulate(qs, out, lse, kv[0], kv[1], mine, theirs)
            if step < world - 1:
                for request in hop:
                    request.wait()
                kv = incoming
        ### END SOLUTION
        out, lse = torch.cat(out, -2), torch.cat(lse, -2)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.split = split
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        rank, world = dist.get_rank(), dist.get_world_size()
        mine = chunks_of(rank, world, ctx.split)
        delta = (dout * out).sum(-1, keepdim=True)
        qs, dos, lses, deltas = (t.chunk(len(mine), -2) for t in (q, dout, lse, delta))
        dq = [torch.zeros_like(c) for c in qs]
        # TODO: the second ring: k and v travel again, now with their gradients (zeros at
        # first), to which each rank adds its share (attend_backward, for every pair); after
        # the last step one more hop brings the gradients home. Return (dq, dk, dv, None).
        # HINT 1: Travel as one tensor torch.stack([k, v, dk, dv]); its chunks along -2 are
        #   views, so adding to them adds to it. After world - 1 hops it holds rank
        #   (rank + 1)'s: send its dk and dv on once more, receive your own.
        # HINT 2: for each pair (i, j, causal): a, b, c = attend_backward(qs[i], ks[j],
        #   vs[j], causal, dos[i], lses[i], deltas[i]); dq[i] += a; dks[j].add_(b); dvs[j].add_(c)
        ### BEGIN SOLUTION
        travel = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])
        after, before = (rank + 1) % world, (rank - 1) % world
        for step in range(world):
            theirs = chunks_of((rank - step) % world, world, ctx.split)
            ks, vs, dks, dvs = (t.chunk(len(theirs), -2) for t in travel)
            for i, j, causal in pairs(mine, theirs):
                a, b, c = attend_backward(qs[i], ks[j], vs[j], causal, dos[i], lses[i], deltas[i])
                dq[i] += a
                dks[j].add_(b)  # a view of `travel`: it travels on with the sum
                dvs[j].add_(c)
            outgoing = travel if step < world - 1 else travel[2:].contiguous()
            incoming = torch.empty_like(outgoing)
            hop = [dist.isend(outgoing, after), dist.irecv(incoming, before)]
            for request in hop:
                request.wait()
            travel = incoming
        dk, dv = travel[-2], travel[-1]  # home, with every rank's share
        ### END SOLUTION
        return torch.cat(dq, -2), dk, dv, None


# --8<-- [end:ring]


# --8<-- [start:gather]
class AllGather(torch.autograd.Function):
    """Every rank's x, stacked: the all-gather baseline's one collective, with its backward."""

    @staticmethod
    def forward(ctx, x):
        # TODO: return every rank's x, stacked in rank order (a new first dimension).
        # HINT 1: dist.all_gather fills a list of world buffers shaped like x.
        # HINT 2: parts = [torch.empty_like(x) for _ in range(world)];
        #   dist.all_gather(parts, x.contiguous()); return torch.stack(parts)
        ### BEGIN SOLUTION
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.stack(parts)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        # TODO: x's gradient: every rank used it, so it is the sum of every rank's
        # gradient for this rank's slot, and this rank needs no other slot's sum.
        # HINT 1: The all-gather's adjoint is a reduce-scatter: rank r receives the sum of
        #   slot r only (an all-reduce would bring every slot's sum, twice the bytes).
        # HINT 2: mine = torch.empty_like(grad[0]).view(-1); dist.reduce_scatter_tensor(
        #   mine, grad.contiguous().view(-1)) (gloo wants them flat); return mine.view_as(grad[0])
        ### BEGIN SOLUTION
        mine = torch.empty_like(grad[0]).view(-1)
        dist.reduce_scatter_tensor(mine, grad.contiguous().view(-1))
        return mine.view_as(grad[0])
        ### END SOLUTION


def gathered_attention(q, k, v, split):
    """The same attention, every rank holding every key and value: world times the memory."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = chunks_of(rank, world, split)
    qs, out, lse = start(q, mine)
    kv = AllGather.apply(torch.stack([k, v]))
    for source, (k_s, v_s) in enumerate(kv):
        accumulate(qs, out, lse, k_s, v_s, mine, chunks_of(source, world, split))
    return torch.cat(out, -2)


# --8<-- [end:gather]


def worker(rank: int, world: int, backend: str, port: int, args) -> None:
    torch.set_num_threads(ranks.cpu_share(world))
    device = ranks.join_local(rank, world, backend, port)
    try:
        torch.manual_seed(0)  # every rank the same whole sequence, and the same reference
        shape = (args.batch_size, args.heads, args.seq, args.head_dim)
        whole = [torch.randn(shape, device=device).requires_grad_() for _ in range(4)]
        local = [shard(t.detach(), rank, world, args.split).requires_grad_() for t in whole]
        attention = RingAttention.apply if args.attention == "ring" else gathered_attention
        with memory.Allocated(device) as held:  # one step, its memory measured
            attention(*local[:3], args.split).backward(local[3])
        for t in local:
            t.grad = None
        start, out = time.perf_counter(), attention(*local[:3], args.split)  # one more, timed
        out.backward(local[3])
        seconds = time.perf_counter() - start
        reference = attend(*whole[:3], causal=True)[0]  # the whole sequence, in one piece
        reference.backward(whole[3])
        found, want = [out, *(t.grad for t in local[:3])], [reference, *(t.grad for t in whole[:3])]
        pieces = zip(found, want, strict=True)
        gap = max((a - shard(b, rank, world, args.split)).abs().max().item() for a, b in pieces)
        mine = chunks_of(rank, world, args.split)
        size = args.seq // (world * len(mine))  # one chunk's tokens
        work = sum(len(pairs(mine, chunks_of(r, world, args.split))) for r in range(world))
        lines = [None] * world
        dist.all_gather_object(lines, f"rank {rank}: chunks {mine}, {work} blocks of "
            f"{size}x{size}: {work * size * size:>7,} scores, peak {held.peak / 2**20:.1f} MiB, "
            f"step {1000 * seconds:.0f} ms, largest difference from one process "
            f"{gap:.1e}")  # fmt: skip
        if rank == 0:
            ranks.say(f"{world} ranks, --attention {args.attention}, --split {args.split}, "
                      f"{args.seq} tokens", *lines)  # fmt: skip
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    args = parse_args(argv)
    backend, world = ranks.backend_and_world_size(args.backend, args.nproc)
    parts = world * (1 if args.split == "plain" else 2)
    if args.seq % parts:
        raise SystemExit(f"ring.py: error: --seq {args.seq} does not cut into {parts} chunks")
    mp.spawn(worker, args=(world, backend, ranks.free_port(), args), nprocs=world)


if __name__ == "__main__":
    sys.exit(exit_with_one_line(main))
