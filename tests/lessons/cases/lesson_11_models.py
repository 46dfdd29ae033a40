"""The grader's model, data and timing for lesson 11's pipeline, shared by the case script
and the test.

The case script (a child process, with the submission loaded) runs the model cut into
STAGES stages, one per gloo rank, through the submission's schedules; the test (the
grading process, which never imports a submission) runs it whole, in one process, on the
whole batch: the reference. Nothing here imports a lesson.

Each stage's cost is controlled: a `Costly` stage waits FORWARD_S in forward and twice as
long in backward, and notes when (time.perf_counter, the same clock in every process of
the machine), so that the bubble measured on two loaded CPU cores is the schedule's, not
the machine's. It also counts the micro-batches whose activations are alive (forward
done, backward not begun), and the forwards and backwards it ran.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from course.grader.tolerances import seed

VOCAB, DIM, SEQ = 16, 16, 8
STAGES, MICRO, ROWS = 3, 4, 2  # 3 stages, 4 micro-batches of 2 sequences
STEPS = 3  # per schedule by hand: the first one's gradients are graded, every one's timing
FORWARD_S = 0.02  # a stage's controlled forward; backward waits twice as long
SEED = seed(5)  # `python -m course tolerances 11` measures the bounds at other seeds


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up, self.down = nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def layers() -> list[nn.Module]:
    """The whole model, in order: an embedding, one block per stage, a norm and a head."""
    torch.manual_seed(SEED)
    return [nn.Embedding(VOCAB, DIM), *(Block() for _ in range(STAGES)), nn.LayerNorm(DIM),
            nn.Linear(DIM, VOCAB)]  # fmt: skip


def stage_layers(rank: int) -> list[tuple[int, nn.Module]]:
    """(index in layers(), layer) of stage `rank`: its block, with the embedding on the first
    stage and the norm and head on the last."""
    every = list(enumerate(layers()))
    if rank == 0:
        return every[:2]
    if rank == STAGES - 1:
        return every[rank + 1 :]
    return every[rank + 1 : rank + 2]


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch of `step`: MICRO * ROWS sequences of SEQ tokens, and their targets."""
    gen = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, VOCAB, (MICRO * ROWS, SEQ), generator=gen)
    return tokens, (tokens * 3 + 1) % VOCAB


def reference() -> tuple[float, torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, logits, {"<layer index>.<name>": gradient}) of the whole model, one process,
    on step 1's whole batch."""
    model = nn.Sequential(*layers())
    tokens, targets = batch(1)
    logits = model(tokens)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss.backward()
    return loss.item(), logits.detach(), {k: p.grad for k, p in model.named_parameters()}


class Costly(nn.Module):
    """A stage with a controlled cost, which notes what it runs: ("F" or "B", start, end)
    for each forward and backward, and the most micro-batches alive at once."""

    def __init__(self, rank: int, seconds: float = FORWARD_S):
        super().__init__()
        self.names, self.seconds = {}, seconds
        parts = stage_layers(rank)
        self.body = nn.Sequential(*(layer for _, layer in parts))
        for position, (index, _) in enumerate(parts):
            self.names[str(position)] = str(index)
        self.events: list[tuple[str, float, float]] = []
        self.alive = self.most_alive = 0
        self.outputs: list[torch.Tensor] = []

    def wait(self, kind: str, seconds: float) -> None:
        start = time.perf_counter()
        time.sleep(seconds)
        self.events.append((kind, start, time.perf_counter()))

    def forward(self, x):
        y = self.body(x)
        if y.is_meta or not torch.is_grad_enabled():  # a schedule learning shapes
            return y
        self.wait("F", self.seconds)
        self.outputs.append(y.detach().clone())
        return _Alive.apply(y, self)

    def gradients(self) -> dict[str, torch.Tensor]:
        return {f"{self.names[k.split('.', 1)[0]]}.{k.split('.', 1)[1]}": p.grad
                for k, p in self.body.named_parameters() if p.grad is not None}  # fmt: skip

    def reset(self) -> None:
        self.events, self.outputs, self.alive, self.most_alive = [], [], 0, 0
        self.body.zero_grad(set_to_none=True)


class _Alive(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, stage):
        ctx.stage = stage
        stage.alive += 1
        stage.most_alive = max(stage.most_alive, stage.alive)
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        ctx.stage.alive -= 1
        ctx.stage.wait("B", 2 * ctx.stage.seconds)
        return grad, None


def bubbles(events: dict[int, list]) -> list[float]:
    """Each rank's idle fraction of one step: 1 - (its busy time) / (the step, from the first
    start on any rank to the last end on any rank)."""
    start = min(e[1] for rank in events.values() for e in rank)
    end = max(e[2] for rank in events.values() for e in rank)
    return [1 - sum(e[2] - e[1] for e in events[r]) / (end - start) for r in sorted(events)]


def theory(stages: int = STAGES, micro: int = MICRO) -> float:
    return (stages - 1) / (micro + stages - 1)


# --- part 2: tensor parallelism (tensor.py) ------------------------------------------
#
# The grader's block is the course's own Block (course.models.Block: norm, up, down), the
# layer the submission's ParallelMLP splits. Every rank gets the same input; the loss is
# a fixed random weighting of the output, so that every output element has its own
# gradient. After backward, one SGD step (TP_LR) on every parameter a rank holds, then a
# second input: the block's output then depends on every gradient, however the
# submission cut the weights.
TP_WORLD, TP_DIM, TP_ROWS = 2, 16, 3
TP_LR = 0.1
TP_SEED = seed(11)


def tp_block():
    from course import models

    torch.manual_seed(TP_SEED)
    return models.Block(TP_DIM)


def tp_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input, the loss's weights, the input after the step)."""
    gen = torch.Generator().manual_seed(TP_SEED + 1)
    return tuple(torch.randn(TP_ROWS, SEQ, TP_DIM, generator=gen) for _ in range(3))


def tp_step(block, x, weights, after):
    """(output, input gradient, output on `after` after one SGD step) of `block`."""
    x = x.clone().requires_grad_()
    out = block(x)
    (out * weights).sum().backward()
    with torch.no_grad():
        for p in block.parameters():
            p -= TP_LR * p.grad
        again = block(after)
    return out.detach(), x.grad, again


def tp_reference() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tp_step(tp_block(), *tp_inputs())


def script_losses(depth: int, steps: int, seed: int = 0, dim: int = 64,
                  vocab: int = 64) -> dict[int, float]:  # fmt: skip
    """The lesson scripts' training, whole, in one process: the course's blocks built in
    pipeline.py's order from `seed` (an embedding, `depth` Blocks, a norm, a head), AdamW
    3e-3, each step's 32 sequences of course.data.lookup_tokens. The loss of every step."""
    from course import data, models

    torch.manual_seed(seed)
    layers = [nn.Embedding(vocab, dim), *(models.Block(dim) for _ in range(depth))]
    model = nn.Sequential(*layers, nn.LayerNorm(dim), nn.Linear(dim, vocab))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = {}
    for step in range(1, steps + 1):
        tokens, targets = data.lookup_tokens(step, 0, 32, vocab)
        loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses[step] = loss.item()
    return losses
