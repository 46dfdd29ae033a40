"""Lesson 15 - plan a run at scale: memory, communication and step time, predicted.

Run it:
    python -m course plan --predict       # this file's step times for this machine's shapes
    python -m course plan --measure       # ... and each shape run here, with the ratio
    python -m course plan --model llama-8b --gpus 256 --gpu h100-80gb --impl lessons
    python -m course grade 15             # your byte counts against the program at 1024 ranks

The cost model of lesson 14's composition (course.models.StagedLM: pp stages, each block's
MLP split over tp, FSDP2 over dp, each unit gathered once a step and reduced once, float32
and AdamW) for one rank of any mesh. Ranks are numbered tp fastest, then dp, then pp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FLOAT = 4  # bytes: float32 weights, gradients, AdamW moments and activations


@dataclass(frozen=True)
class Model:
    vocab: int
    dim: int
    depth: int
    seq: int
    hidden: int = 0  # each block's MLP width (0: 4 x dim)

    @property
    def width(self) -> int:
        return self.hidden or 4 * self.dim


@dataclass(frozen=True)
class Parallel:
    pp: int
    dp: int
    tp: int
    batch: int  # sequences a step, every data-parallel rank together
    micro_batches: int = 1
    schedule: str = "1f1b"  # or "gpipe"

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.tp


@dataclass(frozen=True)
class Hardware:
    memory: float  # bytes a rank may hold
    flops: float  # peak float32 (or the precision trained in) FLOP/s of one rank
    efficiency: float  # the share of that peak a training step reaches
    gpus_per_node: int
    intra: float  # bus bandwidth in a node, bytes/s
    inter: float  # bus bandwidth between nodes, bytes/s
    latency: float  # seconds a collective costs however small


def check(model: Model, par: Parallel, world: int | None = None) -> None:
    """Raise ValueError, one line, for a configuration no program could run."""
    if world is not None and par.world != world:
        raise ValueError(f"pp x dp x tp = {par.pp} x {par.dp} x {par.tp} = {par.world}, "
                         f"not the world size {world}")  # fmt: skip
    for what, n, by in [("blocks", model.depth, par.pp), ("MLP width", model.width, par.tp),
                        ("batch", par.batch, par.dp * par.micro_batches)]:  # fmt: skip
        if by > n or (what != "blocks" and n % by):
            raise ValueError(f"{what} {n} does not split over {by}")


def stage_blocks(depth: int, pp: int, stage: int) -> range:
    """Stage s runs blocks depth*s//pp to depth*(s+1)//pp - 1: unequal when pp does not
    divide depth."""
    return range(depth * stage // pp, depth * (stage + 1) // pp)


def units(model: Model, par: Parallel, stage: int) -> list[list[tuple[int, ...]]]:
    """The stage's FSDP units (each block, then the root), each a list of the tp-local
    shapes of its tensors."""
    d, h = model.dim, model.width // par.tp
    block = [(d,), (d,), (h, d), (h,), (d, h), (d,)]  # norm w, b; up w, b; down w, b
    root = [(model.vocab, d)] if stage == 0 else []
    root += [(d,), (d,), (model.vocab, d)] if stage == par.pp - 1 else []
    found = [block for _ in stage_blocks(model.depth, par.pp, stage)]
    return found + ([root] if root else [])


def rows(model: Model, par: Parallel) -> int:
    """Sequences in one micro-batch on one data-parallel rank."""
    return par.batch // par.dp // par.micro_batches


# --8<-- [start:held]
def held(model: Model, par: Parallel, stage: int, dp_rank: int) -> dict[str, int]:
    """Bytes the rank keeps between steps: its shards of the stage's parameters, their
    gradients, and AdamW's two moments."""
    # TODO: FSDP2 splits each tensor's first dimension into ceil(n / dp) rows a rank; the
    # last ranks get fewer, or none. Sum this rank's shard of every tensor in units().
    raise NotImplementedError("TODO at 15_planning/plan.py:99 is not done yet")


# --8<-- [end:held]
# --8<-- [start:activations]
def activations(model: Model, par: Parallel, stage: int) -> int:
    """The stage's blocks' activations at the step's high-water mark, in bytes. One block
    keeps, for each token of a micro-batch: the norm's input (dim) and its mean and inverse
    deviation (2), up's input (dim), gelu's input and down's input (width / tp each)."""
    # TODO: how many micro-batches' activations does the stage hold at once? GPipe runs
    # every forward before any backward; 1F1B starts a backward as soon as it can.
    raise NotImplementedError("TODO at 15_planning/plan.py:110 is not done yet")


# --8<-- [end:activations]
# --8<-- [start:traffic]
def traffic(model: Model, par: Parallel, stage: int) -> dict[str, int]:
    """Bytes this rank moves in one step, by "axis.kind": what it sends, for a receive what
    it receives, for a reduce-scatter its whole input. Axes of size 1 move nothing."""
    # TODO: dp: each unit gathered once (this rank sends its padded shard) and reduced once
    # (the whole padded unit goes in). tp: two all-reduces a block a micro-batch, of one
    # micro-batch's activation. pp: one activation a micro-batch to each neighbour stage.
    raise NotImplementedError("TODO at 15_planning/plan.py:121 is not done yet")


# --8<-- [end:traffic]
# --8<-- [start:time]
def bandwidth(par: Parallel, hw: Hardware, axis: str) -> float:
    """An axis's groups stay in a node while the ranks they span fit in one: tp spans tp
    ranks, dp spans dp x tp, pp the whole world."""
    span = {"tp": par.tp, "dp": par.dp * par.tp, "pp": par.world}[axis]
    return hw.intra if span <= hw.gpus_per_node else hw.inter


def step_time(model: Model, par: Parallel, hw: Hardware) -> dict[str, float]:
    """Seconds of one step, by term, for the slowest stage (the page's α-β model)."""
    # TODO: for each stage: compute = 6 x matmul weights x tokens / (flops x efficiency);
    # tp and pp on the critical path; dp overlapped with compute. The slowest stage sets
    # the pace, and a pipeline idles (pp - 1) of its micro-batches' slots.
    raise NotImplementedError("TODO at 15_planning/plan.py:138 is not done yet")


# --8<-- [end:time]
def memory(model: Model, par: Parallel) -> int:
    """The most bytes any rank holds at its high-water mark (dp rank 0 has the largest
    shards)."""
    return max(sum(held(model, par, s, 0).values()) + activations(model, par, s)
               for s in range(par.pp))  # fmt: skip


def fits(model: Model, par: Parallel, hw: Hardware) -> bool:
    return memory(model, par) <= hw.memory


# --8<-- [start:questions]
def micro_batches_for(pp: int, target: float) -> int:
    """The fewest micro-batches that bring a pp-stage pipeline's bubble, as a share of its
    step, to `target` or under."""
    # TODO: answer the three questions with this file's own model.
    raise NotImplementedError("TODO at 15_planning/plan.py:158 is not done yet")


def communication_bound(model: Model, par: Parallel, hw: Hardware, most: int = 1 << 16):
    """The smallest data-parallel degree, a power of two, at which the data-parallel
    traffic no longer hides behind compute (exposed > 0), each dp rank keeping its share
    of par's batch; None up to `most`."""
    # TODO: try dp = 1, 2, 4, ... with the batch grown to keep each rank's share.
    raise NotImplementedError("TODO at 15_planning/plan.py:166 is not done yet")


def best_tp(model: Model, par: Parallel, hw: Hardware) -> int:
    """The tp (a power of two dividing the MLP width, the world kept: dp shrinks as tp
    grows) with the shortest step; the smaller on a tie."""
    # TODO: try tp = 1, 2, 4, ... while it divides the width and the ranks, skipping
    # shapes whose batch does not split.
    raise NotImplementedError("TODO at 15_planning/plan.py:174 is not done yet")


# --8<-- [end:questions]
