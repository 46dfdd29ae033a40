"""Lesson 11's watched pipeline stage: what the script measures about a schedule.

Watched wraps a stage's module. It counts the micro-batches whose activations are alive
on the stage (forward done, backward not yet begun), and, given a controlled cost, waits
that long in forward and twice as long in backward, noting when: on a shared CPU the
layers' own compute is too small and too noisy to show a pipeline's bubble, a controlled
cost is not. bubble() turns those notes into the stage's idle fraction of a step; with
COURSE_STAGE_TIMELINE set to a folder, it also writes the step's notes there, one file a
stage (`python -m course schedules` draws them).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

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
        self.busy: list[tuple[float, float, str]] = []  # (start, end, "F" or "B")

    def wait(self, seconds: float, kind: str = "F") -> None:
        if seconds:
            start = time.perf_counter()
            time.sleep(seconds)
            self.busy.append((start, time.perf_counter(), kind))

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
        ctx.watched.wait(2 * ctx.watched.seconds, "B")
        return grad, None


def bubble(watched: Watched, world: int) -> float:
    """The step's idle fraction on this rank: 1 - busy / (first start to last end, any rank)."""
    edges = torch.tensor([-watched.busy[0][0], watched.busy[-1][1]], dtype=torch.float64)
    dist.all_reduce(edges, op=dist.ReduceOp.MAX)  # the earliest start, the latest end
    busy = sum(end - start for start, end, _ in watched.busy)
    folder = os.environ.get("COURSE_STAGE_TIMELINE")
    if folder:  # this step's notes, from the earliest start on any rank, in ms
        first = -edges[0].item()
        notes = [[(a - first) * 1e3, (b - first) * 1e3, kind] for a, b, kind in watched.busy]
        Path(folder, f"stage{dist.get_rank()}.json").write_text(json.dumps(notes))
    return 1 - busy / (edges[1] + edges[0]).item()
