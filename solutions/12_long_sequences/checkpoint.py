"""Lesson 12 - long sequences, part 1: activation checkpointing, by hand and PyTorch's.

Run it:
    python lessons/12_long_sequences/checkpoint.py                          # by hand
    python lessons/12_long_sequences/checkpoint.py --checkpoint selective   # PyTorch's, selective
    python lessons/12_long_sequences/checkpoint.py --sweep 128 256 512      # bytes kept, each way
    python -m course grade 12                                               # grade your version
"""

import functools
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from course import data, memory, models, options, runtime
from course.runtime import exit_with_one_line

VOCAB = 64
MODES = ("none", "hand", "full", "selective")


def parse_args(argv=None):
    p = options.ArgumentParser(prog="checkpoint.py", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", choices=MODES, default="hand", help="what each block saves")
    p.add_argument("--seq", type=options.positive_int, default=128, help="sequence length")
    p.add_argument("--batch-size", type=options.positive_int, default=8)
    p.add_argument("--dim", type=options.positive_int, default=64, help="model width")
    p.add_argument("--heads", type=options.positive_int, default=4)
    p.add_argument("--depth", type=options.positive_int, default=4, help="blocks")
    p.add_argument("--steps", type=options.positive_int, default=40)
    p.add_argument("--seed", type=int, default=0, help="weights' and dropout's seed")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--sweep", type=options.positive_int, nargs="+", metavar="SEQ",
                   help="no training: each way's bytes and time at these lengths")  # fmt: skip
    args = p.parse_args(argv)
    if args.dim % args.heads:
        p.error(f"--dim {args.dim} does not split into {args.heads} heads")
    return args


# --8<-- [start:hand]
class Checkpoint(torch.autograd.Function):
    """A block that keeps only its input: forward runs it without a graph; backward runs it
    again, with a graph and the same random numbers, and backpropagates through that."""

    @staticmethod
    def forward(ctx, block, x):
        # TODO: keep the block, the random state and x (save_for_backward); run the block
        # without recording a graph, and return its output.
        # HINT 1: torch.no_grad() records nothing; torch.get_rng_state() (and
        #   torch.cuda.get_rng_state(x.device) when x.is_cuda) is what dropout draws from.
        # HINT 2: ctx.block, ctx.rng = block, torch.get_rng_state(); ctx.cuda_rng = ...;
        #   ctx.save_for_backward(x); with torch.no_grad(): return block(x)
        ### BEGIN SOLUTION
        ctx.block, ctx.rng = block, torch.get_rng_state()
        ctx.cuda_rng = torch.cuda.get_rng_state(x.device) if x.is_cuda else None
        ctx.save_for_backward(x)
        with torch.no_grad():
            return block(x)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        # TODO: run the block again on a detached copy of x that requires grad, with grad
        # enabled and forward's random state, leaving the random stream as it was; then
        # backpropagate `grad` through it (the block's parameters get their gradients
        # there) and return the gradients of (block, x).
        # HINT 1: torch.random.fork_rng(devices=...) puts the random state back when it
        #   ends; inside, torch.set_rng_state(ctx.rng) (and torch.cuda.set_rng_state).
        # HINT 2: with fork_rng(...), torch.enable_grad(): set the states; out = ctx.block(x)
        #   then torch.autograd.backward(out, grad); return None, x.grad
        ### BEGIN SOLUTION
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_()
        with torch.random.fork_rng(devices=[x.device] if x.is_cuda else []), torch.enable_grad():
            torch.set_rng_state(ctx.rng)
            if ctx.cuda_rng is not None:
                torch.cuda.set_rng_state(ctx.cuda_rng, x.device)
            out = ctx.block(x)
        torch.autograd.backward(out, grad)
        return None, x.grad
        ### END SOLUTION


# --8<-- [end:hand]


# --8<-- [start:torch]
MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default)


def policy(ctx, op, *args, **kwargs):
    """Selective checkpointing's choice for each operator of the block: save the costly
    matmuls' outputs, recompute the cheap rest (norms, softmax, gelu, dropout)."""
    # TODO: return CheckpointPolicy.MUST_SAVE for the matmuls, PREFER_RECOMPUTE otherwise.
    # HINT 1: `op` is an aten overload, such as torch.ops.aten.mm.default; MATMULS lists them.
    # HINT 2: return CheckpointPolicy.MUST_SAVE if op in MATMULS else
    #   CheckpointPolicy.PREFER_RECOMPUTE
    ### BEGIN SOLUTION
    return CheckpointPolicy.MUST_SAVE if op in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE
    ### END SOLUTION


def run_block(block, x, mode: str):
    """One block, checkpointed as `mode` says."""
    if mode == "hand":
        return Checkpoint.apply(block, x)
    # TODO: "full": torch.utils.checkpoint's non-reentrant checkpoint of block(x);
    # "selective": the same with a context_fn that applies `policy`.
    # HINT 1: checkpoint(block, x, use_reentrant=False); context_fn takes no arguments and
    #   returns create_selective_checkpoint_contexts(policy).
    # HINT 2: context_fn=functools.partial(create_selective_checkpoint_contexts, policy)
    ### BEGIN SOLUTION
    if mode == "full":
        return checkpoint(block, x, use_reentrant=False)
    if mode == "selective":
        contexts = functools.partial(create_selective_checkpoint_contexts, policy)
        return checkpoint(block, x, use_reentrant=False, context_fn=contexts)
    ### END SOLUTION
    return block(x)


# --8<-- [end:torch]


# --8<-- [start:bytes]
def block_bytes(mode: str, b: int, t: int, d: int, heads: int, mask: int = 4) -> int:
    """What one CausalBlock keeps for backward, float32, for a batch of b sequences of t
    tokens: dropout keeps a mask of `mask` bytes an element (4 on a CPU, 1 on CUDA)."""
    if mode in ("full", "hand"):  # its input
        return 4 * b * t * d
    if mode == "selective":  # its input, and every matmul's output: 10 x (b, t, d) + scores
        return 4 * (11 * b * t * d + b * heads * t * t)
    # 16 x (b, t, d), 2 dropout masks; each norm's mean and 1/std; the attention's weights
    # before and after dropout, its mask; the causal mask (bool).
    return (
        4 * (16 * b * t * d + 4 * b * t + 2 * b * heads * t * t)
        + t * t
        + mask * (2 * b * t * d + b * heads * t * t)
    )


# --8<-- [end:bytes]


class Model(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, args.dim)
        self.blocks = nn.ModuleList(
            models.CausalBlock(args.dim, args.heads) for _ in range(args.depth)
        )
        self.head = nn.Sequential(nn.LayerNorm(args.dim), nn.Linear(args.dim, VOCAB))
        self.mode = args.checkpoint

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = run_block(block, x, self.mode)
        return self.head(x)


def step(model, step_number, args, device):
    tokens, targets = data.lookup_tokens(step_number, 0, args.batch_size, VOCAB, args.seq)
    logits = model(tokens.to(device))
    return F.cross_entropy(logits.flatten(0, 1), targets.to(device).flatten())


def sweep(args, device) -> None:
    """Each mode at each length: bytes still held after forward (what backward will use),
    the blocks' share of it by the formula (the rest is the embedding's and the head's),
    the most held during the step, and the step's time (median of 5)."""
    print(f"{'seq':>6} {'mode':>9} {'kept MiB':>9} {'formula':>8} {'peak MiB':>9} {'step ms':>8}")
    mask = 4 if device.type == "cpu" else 1
    for seq in args.sweep:
        for mode in ("none", "full", "selective", "hand"):
            args.seq, args.checkpoint = seq, mode
            runtime.seed_everything(args.seed)
            model = Model(args).to(device)
            step(model, 0, args, device).backward()  # warm up, off the record
            model.zero_grad(set_to_none=True)
            with memory.Allocated(device) as forward:
                loss = step(model, 1, args, device)
            with memory.Allocated(device) as backward:
                loss.backward()
            del loss
            model.zero_grad(set_to_none=True)
            times = []
            for i in range(5):
                start = time.perf_counter()
                step(model, 2 + i, args, device).backward()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - start)
                model.zero_grad(set_to_none=True)
            kept, peak = forward.net, max(forward.peak, forward.net + backward.peak)
            ms = 1000 * sorted(times)[2]
            blocks = args.depth * block_bytes(
                mode, args.batch_size, seq, args.dim, args.heads, mask
            )
            print(f"{seq:>6} {mode:>9} {kept / 2**20:>9.2f} {blocks / 2**20:>8.2f} "
                  f"{peak / 2**20:>9.2f} {ms:>8.1f}")  # fmt: skip


def main(argv=None) -> None:
    args = parse_args(argv)
    device = runtime.pick_device(args.device)
    if args.sweep:
        return sweep(args, device)
    runtime.seed_everything(args.seed)
    model = Model(args).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    print(f"{args.depth} blocks, --checkpoint {args.checkpoint}, sequences of {args.seq}")
    for i in range(1, args.steps + 1):
        loss = step(model, i, args, device)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i % 10 == 0 or i in (1, args.steps):
            print(f"step {i}/{args.steps}: loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    sys.exit(exit_with_one_line(main))
