"""The grader's model, data and training recipe for lesson 10's ShardedOptimizer, shared by
the case script and the test.

The case script (a child process, with the submission loaded) trains the model on two
ranks with the submission's ShardedOptimizer; the test (the grading process, which never
imports a submission) trains it in one process with torch's own AdamW, as the reference.
Nothing here imports a lesson.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course.grader.tolerances import seed

VOCAB, DIM, SEQ, BATCH = 16, 32, 8, 16  # each of 2 ranks trains on BATCH // 2 sequences
STEPS = 5  # optimizer steps; one more after the reload (see the case)
SEED = seed(7)  # `python -m course tolerances 10` measures the bounds at other seeds
LR, NORM_LR, DECAY = 3e-3, 1e-2, 0.1
HALVE_LR_AT = 3  # before this step the first group's lr is halved, as a scheduler would


class TinyLM(nn.Module):
    """A language-model shape: an embedding whose weight the output head shares (tied),
    a LayerNorm and three linear layers. 9 parameter tensors of 32 to 1,024 values, in
    the order model.parameters() gives them: each big weight followed by a small bias."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, DIM)
        self.down = nn.Linear(DIM, DIM)
        self.mix = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied: one tensor, two uses

    def forward(self, tokens):
        x = self.norm(self.embed(tokens))
        x = x + self.down(F.gelu(self.up(x)))
        return self.head(torch.tanh(self.mix(x)))


def build() -> TinyLM:
    torch.manual_seed(SEED)
    return TinyLM()


def groups(model: nn.Module) -> list[dict]:
    """Two parameter groups, as language models are often trained: everything with weight
    decay, except the norm's parameters, which have none and their own learning rate."""
    norm = set(model.norm.parameters())
    params = list(model.parameters())  # the tied weight once
    return [
        {"params": [p for p in params if p not in norm], "weight_decay": DECAY},
        {"params": [p for p in params if p in norm], "weight_decay": 0.0, "lr": NORM_LR},
    ]


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The full batch of `step`: tokens and next tokens; rank r trains on half r of it."""
    gen = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def loss(model: nn.Module, inputs, targets) -> torch.Tensor:
    return F.cross_entropy(model(inputs).reshape(-1, VOCAB), targets.reshape(-1))


def set_lr(optimizer: torch.optim.Optimizer, step: int) -> None:
    """The schedule: the first group's lr halved before step HALVE_LR_AT (1-based)."""
    if step == HALVE_LR_AT:
        optimizer.param_groups[0]["lr"] = LR / 2


def reference(steps: int) -> tuple[dict, dict]:
    """(parameters by name, AdamW's state_dict) after `steps` steps in one process on the
    full batch: what the two ranks' averaged gradients add up to."""
    model = build()
    optimizer = torch.optim.AdamW(groups(model), lr=LR)
    for step in range(1, steps + 1):
        inputs, targets = batch(step)
        optimizer.zero_grad()
        loss(model, inputs, targets).backward()
        set_lr(optimizer, step)
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.named_parameters()}, optimizer.state_dict()


# --- part 2, MiniFSDP: the same TinyLM, trained with SGD (a wrong gradient scale shows in
# the weights; Adam would divide it away) ---
FSDP_STEPS = 4
FSDP_LR, MOMENTUM = 0.1, 0.9
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def sgd(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=FSDP_LR, momentum=MOMENTUM)


def sharded_sizes(model: nn.Module, world: int) -> tuple[int, int, int]:
    """(values of the 2-D weights, each once; their share on one rank, padded; values of
    the other, replicated parameters)."""
    params = list(model.parameters())  # a tied weight once
    big = [p.numel() for p in params if p.ndim == 2]
    return sum(big), sum(-(-n // world) for n in big), sum(p.numel() for p in params if p.ndim != 2)


def linear_uses(model: nn.Module) -> int:
    """Layers whose backward needs their 2-D weight (Linear; an Embedding's does not)."""
    return sum(isinstance(mod, nn.Linear) for mod in model.modules())


def weight_uses(model: nn.Module) -> int:
    """Layers that hold a 2-D weight: the all-gathers of one forward."""
    return sum(
        getattr(mod, "weight", None) is not None and mod.weight.ndim == 2 for mod in model.modules()
    )


def fsdp_reference(steps: int = FSDP_STEPS) -> dict:
    """Parameters by name after `steps` SGD steps in one process on the full batch, fp32."""
    model = build()
    optimizer = sgd(model.parameters())
    for step in range(1, steps + 1):
        inputs, targets = batch(step)
        optimizer.zero_grad()
        loss(model, inputs, targets).backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.named_parameters()}


# --- part 3: FSDP2 and distributed checkpoints (tests/lessons/cases/lesson_10_fsdp2.py) ---------
# The course's own TinyLM and lookup language (course/models.py, course/data.py), small;
# BATCH2 sequences a step in all, split over 1, 2 or 3 ranks.
VOCAB2, DIM2, DEPTH2, SEQ2, BATCH2 = 16, 32, 2, 8, 12
SEED2, LR2, STEPS2, SAVE_AT2 = seed(3), 3e-3, 5, 3
# The checkpoint case lowers the learning rate just before it saves (as a scheduler would):
# a load that skips set_state_dict resumes at the optimizer's initial one.
LR2_SAVED = LR2 / 3


def fsdp2_model(seed: int | None = None) -> nn.Module:
    from course import models

    torch.manual_seed(SEED2 if seed is None else seed)
    return models.TinyLM(VOCAB2, DIM2, DEPTH2)


def fsdp2_batch(step: int, rank: int = 0, world: int = 1):
    """Rank `rank`'s part of step `step`'s global batch."""
    from course import data

    tokens, targets = data.lookup_tokens(step, 0, BATCH2, VOCAB2, SEQ2)
    return tokens.chunk(world)[rank], targets.chunk(world)[rank]


def fsdp2_step(model, optimizer, step: int, rank: int = 0, world: int = 1, summed=False):
    """One AdamW step on this rank's part of the batch. summed: the group's reduce-scatter
    returned sums where FSDP2 asked for means (PyTorch 2.8's gloo): divide, as the lesson
    script does, so that the submission is graded, not that bug."""
    tokens, targets = fsdp2_batch(step, rank, world)
    out = model(tokens)
    F.cross_entropy(out.flatten(0, 1).float(), targets.flatten()).backward()
    for p in model.parameters() if summed else ():
        p.grad /= world
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def fsdp2_reference(steps: int = STEPS2, seed: int | None = None, lower_at: int = 0) -> dict:
    """Parameters by name after `steps` AdamW steps in one process on the whole batch; the
    learning rate LR2_SAVED after step `lower_at` (if not 0), as the checkpoint case."""
    model = fsdp2_model(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR2)
    for step in range(1, steps + 1):
        fsdp2_step(model, optimizer, step)
        if step == lower_at:
            optimizer.param_groups[0]["lr"] = LR2_SAVED
    return {k: v.detach().clone() for k, v in model.named_parameters()}
