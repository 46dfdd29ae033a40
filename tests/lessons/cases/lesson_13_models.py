"""The grader's own mixture of experts for lesson 13, used by the case scripts (in the
child) and by tests/lessons/test_13_experts.py (in the grading process): never the
submission's. Written with loops where the lesson uses tensor tricks, so that the two
share no mistake: a token's k experts are its k largest probabilities, their gates
renormalised; an expert takes at most `capacity` choices, every token's first choice
before any second choice; the balancing loss is Switch Transformer's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

E, K = 8, 2
DIM, TOKENS = 16, 24  # part 1: one process's tokens
FACTOR = 1.0  # tight: skewed routing drops choices


def capacity(tokens: int, factor: float = FACTOR) -> int:
    return math.ceil(factor * tokens * K / E)


def skewed_logits(seed: int, tokens: int = TOKENS):
    """Router outputs that favour experts 0 and 1, so that capacity drops some choices."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, E, generator=gen)
    logits[:, :2] += 1.5
    return logits


def last_expert_unchosen(logits):
    """The same router outputs with the last expert's far below every other: no token
    chooses it, and its share of the choices is 0."""
    starved = logits.clone()
    starved[:, -1] = logits.min() - 30.0
    return starved


def route(logits):
    probs = logits.softmax(-1)
    top, experts = probs.topk(K, dim=-1)
    return probs, top / top.sum(-1, keepdim=True), experts


def kept(experts, cap: int):
    taken = [0] * E
    keep = torch.zeros(experts.shape, dtype=torch.bool)
    for slot in range(experts.shape[1]):
        for token in range(experts.shape[0]):
            e = int(experts[token, slot])
            if taken[e] < cap:
                taken[e] += 1
                keep[token, slot] = True
    return keep


def balance_loss(probs, experts):
    share = torch.zeros(E, dtype=probs.dtype)
    for e in experts.flatten().tolist():
        share[e] += 1 / experts.numel()
    return E * sum(share[e] * probs[:, e].mean() for e in range(E))


def experts_like(seed: int, dim: int = DIM):
    """The router and the experts, seeded: modules the submission runs."""
    torch.manual_seed(seed)
    router = nn.Linear(dim, E, bias=False)
    experts = [nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
               for _ in range(E)]  # fmt: skip
    return router, experts


def weights_of(router, experts) -> dict:
    found = {"router": router.weight.detach().clone()}
    for e, expert in enumerate(experts):
        for name, p in expert.named_parameters():
            found[f"{e}.{name}"] = p.detach().clone()
    return found


def layer(weights: dict, x, factor: float = FACTOR):
    """The whole layer in float64, one token at a time: output and balancing loss."""
    w = {k: v.double().requires_grad_() for k, v in weights.items()}
    x = x.double().requires_grad_()
    probs, gates, experts = route(x @ w["router"].T)
    keep = kept(experts, capacity(len(x), factor))
    rows = []
    for t in range(len(x)):
        row = torch.zeros_like(x[t])
        for s in range(K):
            if keep[t, s]:
                e = int(experts[t, s])
                h = F.gelu(x[t] @ w[f"{e}.0.weight"].T + w[f"{e}.0.bias"])
                row = row + gates[t, s] * (h @ w[f"{e}.2.weight"].T + w[f"{e}.2.bias"])
        rows.append(row)
    return torch.stack(rows), balance_loss(probs, experts), w, x, experts, keep


def ep_inputs(seed: int, rank: int, router):
    """Rank `rank`'s TOKENS tokens and output weights under expert parallelism; rank 0's
    drawn among those whose top K (by `router`, float32) leaves out the last expert, so
    that rank 0 sends that expert no row: its count is 0, and must still be exchanged."""
    if rank != 0:
        return inputs(seed * 100 + rank)
    x, w = inputs(seed * 100, tokens=4 * TOKENS)
    with torch.no_grad():
        _, _, experts = route(router(x))
    keep = (experts != E - 1).all(1)
    assert keep.sum() >= TOKENS, "too few tokens leave the last expert out"
    return x[keep][:TOKENS], w[keep][:TOKENS]


def inputs(seed: int, tokens: int = TOKENS, dim: int = DIM):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, dim, generator=gen), torch.randn(tokens, dim, generator=gen)
