"""The grader's models and data for lesson 06 (MiniDDP), shared by the case script and the test.

The case script (a child process, with the submission loaded) trains them with the
submission's MiniDDP; the test (the grading process, no submission) trains them on one
process as the reference. Nothing here imports a lesson.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course.grader.tolerances import seed

STEPS = 5  # optimizer steps per scenario
BATCH = 24  # the full batch; each of `world` ranks trains on BATCH // world of it
LR, MOMENTUM = 0.1, 0.9
# rank r builds its model after torch.manual_seed(FIRST_SEED + r); a measurement of the
# bound (`python -m course tolerances 06`) runs other first seeds
FIRST_SEED = seed(100)
# Bucket caps: None (one all-reduce per parameter), several buckets, one bucket.
MID_CAP_MB = 0.012  # 12.6 kB: the plain model's 8 tensors (0.25-16 kB) make 3 to 5 buckets
LARGE_CAP_MB = 25.0


class Plain(nn.Module):
    """Four linear layers and a buffer: 8 parameters, 35 kB of gradients."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
            nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10),
        )  # fmt: skip
        self.register_buffer("shift", torch.randn(32))

    def forward(self, x):
        return self.layers(x + self.shift)


class Tied(nn.Module):
    """A language-model shape: the decoder shares the embedding's weight (tied), a frozen
    scale, a buffer. Trainable tensors: embed.weight (once), mix.weight, mix.bias."""

    def __init__(self, vocab: int = 50, dim: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.scale = nn.Parameter(torch.rand(dim) + 0.5, requires_grad=False)
        self.decode = nn.Linear(dim, vocab, bias=False)
        self.decode.weight = self.embed.weight
        self.register_buffer("offset", torch.randn(dim))

    def forward(self, tokens):
        return self.decode(torch.tanh(self.mix(self.embed(tokens) * self.scale + self.offset)))


MODELS = {"plain": Plain, "tied": Tied}


def build(name: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS[name]()


def batch(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The full batch (the same on every rank and in the reference)."""
    gen = torch.Generator().manual_seed(7)
    if name == "plain":
        return torch.randn(BATCH, 32, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen)
    tokens = torch.randint(0, 50, (BATCH, 6), generator=gen)
    return tokens, tokens.roll(-1, dims=1)


def loss_of(name: str, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def trainable_count(name: str) -> int:
    return sum(p.requires_grad for p in MODELS[name]().parameters())


def reference(name: str, steps: int = STEPS) -> dict[str, torch.Tensor]:
    """One process, the full batch, rank 0's initial weights: the state MiniDDP must reach."""
    model = build(name, FIRST_SEED)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = batch(name)
    for _ in range(steps):
        loss = loss_of(name, model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
