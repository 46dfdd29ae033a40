"""The grader's side of lesson 14: the run's sizes, the global batch, the mesh's groups as
the page draws them, and one process training the whole model on the whole batch, the
reference every composed run is held to."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from course import data, models

VOCAB, DIM, DEPTH, BATCH, LR = 64, 32, 4, 32, 3e-3
COMPOSED = (2, 2, 2)  # (pp, dp, tp)
SHAPES = ((1, 8, 1), (1, 2, 4), (1, 4, 2), (2, 2, 2))  # the control first
RESUMED = (1, 4, 2)  # where the checkpoint that (2, 2, 2) saves is loaded
STEPS, SAVED_AT = 4, 2


def batch(step: int):
    """The global batch of `step`: (tokens, targets), BATCH sequences of 16."""
    return data.lookup_tokens(step, 0, BATCH, VOCAB)


def whole(seed: int) -> models.StagedLM:
    torch.manual_seed(seed)
    return models.StagedLM(VOCAB, DIM, DEPTH)


def groups(shape: tuple[int, int, int], rank: int) -> dict[str, list[int]]:
    """Rank `rank`'s group on each axis of a (pp, dp, tp) mesh laid out as the page draws
    it: ranks numbered along tp fastest, then dp, then pp."""
    grid = torch.arange(shape[0] * shape[1] * shape[2]).view(shape)
    p, d, t = (int(i) for i in (grid == rank).nonzero()[0])
    return {"pp": grid[:, d, t].tolist(), "dp": grid[p, :, t].tolist(), "tp": grid[p, d].tolist()}


def blocks_of(stage: int, stages: int) -> list[int]:
    per = DEPTH // stages
    return list(range(stage * per, (stage + 1) * per))


def one_process(seed: int, steps: int, model=None, optimizer=None, start: int = 0):
    """Train the whole model on the whole batch from step start + 1 to `steps`: the losses,
    the step-1 gradients (when start is 0), the model and the optimizer."""
    model = model or whole(seed)
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=LR)
    losses, grads = [], {}
    for step in range(start + 1, steps + 1):
        tokens, targets = batch(step)
        loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
        loss.backward()
        if step == 1:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, grads, model, optimizer
