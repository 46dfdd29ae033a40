"""Are the ranks' replicas identical? A fingerprint of the weights after every step.

DDP's promise is that every rank holds the same weights after every
optimizer step: the gradients are averaged, and the same step is applied to
the same weights. A rank that trains on its own (no DDP, or a wrapper that
does not synchronise) breaks it at the first step, whatever the final files
say. With `COURSE_REPLICA_LOG=DIR` in the environment, every process
(course/probes/__init__.py) appends "<step> <fingerprint>" to DIR/rank<R>.<pid>.txt
after each `optimizer.step()`; the grader compares the ranks' lines.

The fingerprint is the float64 sum of every parameter and the sum of their
squares: replicas with the same bits give the same numbers.
"""

from __future__ import annotations

import os
from pathlib import Path

LOG_ENV = "COURSE_REPLICA_LOG"


def install() -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from course.probes.lines import append_line
    from course.probes.write_log import current_rank

    folder = Path(os.environ[LOG_ENV])
    steps = 0

    @torch.no_grad()
    def after_step(optimizer, _args, _kwargs) -> None:
        nonlocal steps
        steps += 1
        total = squares = 0.0
        for group in optimizer.param_groups:
            for p in group["params"]:
                x = p.detach().double()
                total += x.sum().item()
                squares += (x * x).sum().item()
        name = f"rank{max(current_rank(), 0)}.{os.getpid()}.txt"
        append_line(folder / name, f"{steps} {total!r} {squares!r}\n")

    register_optimizer_step_post_hook(after_step)


def read(folder: str | Path, rank: int) -> list[tuple[int, float, float]]:
    """(step, sum, sum of squares) that `rank` recorded, over all its processes, in order."""
    rows = []
    for path in sorted(Path(folder).glob(f"rank{rank}.*.txt"), key=lambda p: p.stat().st_mtime):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                rows.append((int(parts[0]), float(parts[1]), float(parts[2])))
    return rows


def first_difference(folder: str | Path, ranks: int = 2) -> str | None:
    """None if every rank recorded the same fingerprints, step by step; else what differs."""
    logs = [read(folder, r) for r in range(ranks)]
    if not logs[0]:
        return "rank 0 recorded no optimizer step"
    for r in range(1, ranks):
        if len(logs[r]) != len(logs[0]):
            return f"rank 0 took {len(logs[0])} optimizer steps, rank {r} took {len(logs[r])}"
        for (step, *a), (_, *b) in zip(logs[0], logs[r], strict=True):
            if a != b:
                return f"after optimizer step {step} rank {r}'s weights differ from rank 0's"
    return None
