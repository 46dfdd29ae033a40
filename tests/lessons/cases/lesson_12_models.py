"""The grader's own pieces for lesson 12, used by the case scripts (in the child) and by
tests/lessons/test_12_long_sequences.py (in the grading process): never the submission's.

Part 1: a stack of the course's CausalBlock that counts its forward calls, the inputs of
each step, and the bytes each way of checkpointing keeps, by the page's formula (float32
on a CPU, where dropout keeps a float32 mask). Part 2: causal attention written out in
float64, the reference for the ring.
"""

from __future__ import annotations

import torch

from course.models import CausalBlock

# Part 1: B sequences of T tokens, width D, H heads, L blocks, dropout on.
B, T, D, H, L = 2, 32, 32, 4, 3
STEPS = 2  # the second step's dropout masks show whether the random stream was put back
# Part 2's ranks, drawn from the grading seed: never 2, where rank + 1 and rank - 1 are
# the same neighbour and a ring turned the wrong way passes.
RING_RANKS = (3, 4)


class Counted(CausalBlock):
    def __init__(self):
        super().__init__(D, H, dropout=0.1)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return super().forward(x)


def blocks(seed: int, device: str = "cpu") -> list[Counted]:
    torch.manual_seed(seed)
    return [Counted().train().to(device) for _ in range(L)]


def inputs(seed: int, step: int, device: str = "cpu"):
    gen = torch.Generator().manual_seed(1000 * seed + step)
    x, w = torch.randn(B, T, D, generator=gen), torch.randn(B, T, D, generator=gen)
    return x.to(device), w.to(device)


def step(stack, run, x, w, frozen: bool = False):
    """One forward and backward through the stack, each block run by run(block, x); with
    `frozen`, the stack's input needs no gradient (data straight from a loader)."""
    x = x.clone().requires_grad_(not frozen)
    out = x
    for block in stack:
        out = run(block, out)
    (out * w).sum().backward()
    return x


def gradients(seed: int, run=None, device: str = "cpu", frozen: bool = False) -> dict:
    """Every parameter's and the input's gradient (none where `frozen`), each of STEPS
    steps, the random stream (the CPU's and every GPU's) seeded once before the first:
    {f"{step}/{name}": tensor}, on the CPU; a parameter without a gradient maps to None."""
    run = run or (lambda block, x: block(x))
    stack = blocks(seed, device)
    torch.manual_seed(seed + 1)
    found = {}
    for s in range(1, STEPS + 1):
        x = step(stack, run, *inputs(seed, s, device), frozen=frozen)
        if not frozen:
            found[f"{s}/input"] = x.grad.cpu()
        for i, block in enumerate(stack):
            for name, p in block.named_parameters():
                found[f"{s}/{i}.{name}"] = None if p.grad is None else p.grad.cpu().clone()
                p.grad = None
    return found


def block_bytes(mode: str) -> int:
    """The page's formula, in the grader's own words: what one block keeps for backward."""
    btd, bht2 = B * T * D, B * H * T * T
    if mode in ("none",):  # 18 float32 (B, T, D) incl. 2 dropout masks; 4 norm statistics
        # per token; attention weights before and after dropout and dropout's mask; the mask
        return 4 * (18 * btd + 4 * B * T + 3 * bht2) + T * T
    if mode == "selective":  # the input, and the outputs of the matmuls: 10 x (B, T, D), scores
        return 4 * (11 * btd + bht2)
    return 4 * btd  # full or by hand: the input only


def matmul_flops() -> int:
    """The stack's forward matmul FLOPs (2 per multiply-add)."""
    per_block = 2 * B * T * D * (3 * D + D + 8 * D) + 2 * 2 * B * T * T * D
    return L * per_block


# Part 2: the ring. A sequence of 2 x world chunks of CHUNK tokens (zig-zag), heads x dim.
CHUNK, RB, RH, RD = 8, 1, 2, 8


RING_PIECES_SEED = 3


def merge_inputs(gen):
    """Two partial attentions of the same queries: outputs and log-sum-exps."""
    shape = (2, 3, 5)
    a, b = torch.randn(*shape, 4, generator=gen), torch.randn(*shape, 4, generator=gen)
    return a, b, torch.randn(*shape, 1, generator=gen), torch.randn(*shape, 1, generator=gen)


def qkv(world: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    shape = (RB, RH, 2 * world * CHUNK, RD)
    return [torch.randn(shape, generator=gen) for _ in range(4)]  # q, k, v, dout


def full_attention(q, k, v, dout):
    """Output and q, k, v gradients of causal attention over the whole sequence, float64."""
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    t = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    future = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
    out = torch.softmax(scores.masked_fill(future, float("-inf")), -1) @ v
    out.backward(dout.double())
    return out.detach(), q.grad, k.grad, v.grad


def pieces(x, chunks: list[int], parts: int):
    """The chunks `chunks` of x's sequence (cut in `parts`), one after the other."""
    cut = x.chunk(parts, dim=-2)
    return torch.cat([cut[c] for c in chunks], dim=-2)
