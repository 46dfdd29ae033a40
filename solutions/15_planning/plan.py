"""Lesson 15 - plan a run at scale: memory, communication and step time, predicted (WIP).

The cost model of lesson 14's composition (course.models.StagedLM; pp stages, the blocks'
MLPs split over tp, FSDP2 over dp, each unit gathered once a step and reduced once),
for one rank of any mesh, in bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FLOAT = 4  # bytes: float32 weights, gradients and AdamW moments


@dataclass(frozen=True)
class Model:
    vocab: int
    dim: int
    depth: int
    seq: int


@dataclass(frozen=True)
class Parallel:
    pp: int
    dp: int
    tp: int
    batch: int  # sequences a step, every data-parallel rank together
    micro_batches: int = 1

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.tp


def stage_blocks(depth: int, pp: int, stage: int) -> range:
    return range(depth * stage // pp, depth * (stage + 1) // pp)


def units(model: Model, par: Parallel, stage: int) -> list[list[tuple[int, ...]]]:
    """The stage's FSDP units (each block, then the root), each a list of the tp-local
    shapes of its tensors."""
    d, h = model.dim, 4 * model.dim // par.tp
    block = [(d,), (d,), (h, d), (h,), (d, h), (d,)]  # norm w, b; up w, b; down w, b
    root = [(model.vocab, d)] if stage == 0 else []
    root += [(d,), (d,), (model.vocab, d)] if stage == par.pp - 1 else []
    found = [block for _ in stage_blocks(model.depth, par.pp, stage)]
    return found + ([root] if root else [])


def _rows(rows: int, dp: int, rank: int) -> int:
    """Rows of a tensor with `rows` rows that FSDP gives data-parallel rank `rank`: each gets
    ceil(rows / dp), the last ones fewer or none."""
    per = math.ceil(rows / dp)
    return max(0, min(per, rows - rank * per))


def held(model: Model, par: Parallel, stage: int, dp_rank: int) -> dict[str, int]:
    shards = sum(
        _rows(s[0], par.dp, dp_rank) * math.prod(s[1:]) * FLOAT
        for unit in units(model, par, stage)
        for s in unit
    )
    return {"params": shards, "grads": shards, "optimizer": 2 * shards}


def traffic(model: Model, par: Parallel, stage: int) -> dict[str, int]:
    """Bytes this rank sends in one step, by axis and kind (a receive: what it receives)."""
    padded = [
        math.ceil(s[0] / par.dp) * math.prod(s[1:]) * FLOAT
        for unit in units(model, par, stage)
        for s in unit
    ]
    rows = par.batch // par.dp // par.micro_batches
    activation = rows * model.seq * model.dim * FLOAT
    blocks = len(stage_blocks(model.depth, par.pp, stage))
    out = {}
    if par.dp > 1:
        out["dp.all_gather"] = sum(padded)
        out["dp.reduce_scatter"] = sum(padded) * par.dp
    if par.tp > 1 and blocks:
        out["tp.all_reduce"] = 2 * blocks * par.micro_batches * activation
    if par.pp > 1:
        if stage < par.pp - 1:
            out["pp.send"] = out["pp.recv"] = par.micro_batches * activation
        if 0 < stage < par.pp - 1:
            out["pp.send"] = out["pp.recv"] = 2 * par.micro_batches * activation
        if stage == par.pp - 1:
            out["pp.send"] = out["pp.recv"] = par.micro_batches * activation
    return out
