"""Lesson 11's watched pipeline stage: what the script measures about a schedule.

Watched wraps a stage's module. It counts the micro-batches whose activations are alive
on the stage (forward done, backward not yet begun), and, given a controlled cost, waits
that long in forward and twice as long in backward, noting when: on a shared CPU the
layers' own compute is too small and too noisy to show a pipeline's bubble, a controlled
cost is not. bubble() turns those notes into the stage's idle fraction of a step.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn


class Watched(nn.Module):
    """A stage that counts the micro-batches whose activations are alive (forward done,
    backward not yet begun) and, with --stage-ms, waits a controlled time in forward and
    twice as long in backward, noting when it is busy."""

    def __init__(self, stage: nn.Module, seconds: float):
        super().__init__()
        self.stage, self.seconds = stage, seconds
        self.alive = self.most_alive = 0
        self.busy: list[tuple[float, float]] = []

    def wait(self, seconds: float) -> None:
        if seconds:
            start = time.perf_counter()
            time.sleep(seconds)
            self.busy.append((start, time.perf_counter()))

    def forward(self, x):
        y = self.stage(x)
        if y.is_meta or not torch.is_grad_enabled():  # torch's shape inference: not a step
            return y
        self.wait(self.seconds)
        return _Alive.apply(y, self)


class _Alive(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, watched):
        ctx.watched = watched
        watched.alive += 1
        watched.most_alive = max(watched.most_alive, watched.alive)
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        ctx.watched.alive -= 1
        ctx.watched.wait(2 * ctx.watched.seconds)
        return grad, None


def bubble(watched: Watched, world: int) -> float:
    """The step's idle fraction on this rank: 1 - busy / (first start to last end, any rank)."""
    edges = torch.tensor([-watched.busy[0][0], watched.busy[-1][1]], dtype=torch.float64)
    dist.all_reduce(edges, op=dist.ReduceOp.MAX)  # the earliest start, the latest end
    busy = sum(end - start for start, end in watched.busy)
    return 1 - busy / (edges[1] + edges[0]).item()
