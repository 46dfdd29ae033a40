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
    # HINT 1: rank r's rows: max(0, min(per, n - r * per)) with per = ceil(n / dp);
    #   the rest of the shape stays whole (math.prod(shape[1:])).
    # HINT 2: shards = sum(rows * math.prod(s[1:]) * FLOAT for unit in units(...) for s in
    #   unit); return {"params": shards, "grads": shards, "optimizer": 2 * shards}.
    ### BEGIN SOLUTION
    per = [math.ceil(s[0] / par.dp) for unit in units(model, par, stage) for s in unit]
    shapes = [s for unit in units(model, par, stage) for s in unit]
    shards = sum(
        max(0, min(p, s[0] - dp_rank * p)) * math.prod(s[1:]) * FLOAT
        for p, s in zip(per, shapes, strict=True)
    )
    return {"params": shards, "grads": shards, "optimizer": 2 * shards}
    ### END SOLUTION


# --8<-- [end:held]
# --8<-- [start:activations]
def activations(model: Model, par: Parallel, stage: int) -> int:
    """The stage's blocks' activations at the step's high-water mark, in bytes. One block
    keeps, for each token of a micro-batch: the norm's input (dim) and its mean and inverse
    deviation (2), up's input (dim), gelu's input and down's input (width / tp each)."""
    # TODO: how many micro-batches' activations does the stage hold at once? GPipe runs
    # every forward before any backward; 1F1B starts a backward as soon as it can.
    # HINT 1: 1F1B: stage s runs pp - s - 1 forwards ahead, then one more before its first
    #   backward; never more than there are micro-batches.
    # HINT 2: in_flight = m (gpipe) or min(m, pp - stage) (1f1b); times blocks, times
    #   rows(...) * seq tokens, times (2 * dim + 2 + 2 * width // tp) * FLOAT.
    ### BEGIN SOLUTION
    m = par.micro_batches
    in_flight = m if par.schedule == "gpipe" else min(m, par.pp - stage)
    per_token = (2 * model.dim + 2 + 2 * (model.width // par.tp)) * FLOAT
    blocks = len(stage_blocks(model.depth, par.pp, stage))
    return in_flight * blocks * rows(model, par) * model.seq * per_token
    ### END SOLUTION


# --8<-- [end:activations]
# --8<-- [start:traffic]
def traffic(model: Model, par: Parallel, stage: int) -> dict[str, int]:
    """Bytes this rank moves in one step, by "axis.kind": what it sends, for a receive what
    it receives, for a reduce-scatter its whole input. Axes of size 1 move nothing."""
    # TODO: dp: each unit gathered once (this rank sends its padded shard) and reduced once
    # (the whole padded unit goes in). tp: two all-reduces a block a micro-batch, of one
    # micro-batch's activation. pp: one activation a micro-batch to each neighbour stage.
    # HINT 1: a padded shard has ceil(n / dp) rows, the same on every rank; an activation is
    #   rows(...) * seq * dim floats. Middle stages send and receive both ways.
    # HINT 2: out["dp.all_gather"] = S; out["dp.reduce_scatter"] = S * dp; out["tp.all_reduce"]
    #   = 2 * blocks * m * act; out["pp.send"] = out["pp.recv"] = (1 or 2) * m * act.
    ### BEGIN SOLUTION
    padded = sum(
        math.ceil(s[0] / par.dp) * math.prod(s[1:]) * FLOAT
        for unit in units(model, par, stage)
        for s in unit
    )
    act = rows(model, par) * model.seq * model.dim * FLOAT
    blocks, m = len(stage_blocks(model.depth, par.pp, stage)), par.micro_batches
    out = {}
    if par.dp > 1:
        out["dp.all_gather"], out["dp.reduce_scatter"] = padded, padded * par.dp
    if par.tp > 1 and blocks:
        out["tp.all_reduce"] = 2 * blocks * m * act
    if par.pp > 1:
        neighbours = (stage > 0) + (stage < par.pp - 1)
        out["pp.send"] = out["pp.recv"] = neighbours * m * act
    return out
    ### END SOLUTION


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
    # HINT 1: a collective costs latency + bus bytes / bandwidth(par, hw, axis): all-reduce
    #   2 (n-1)/n of its bytes, all-gather (n-1) x what it sends, reduce-scatter (n-1)/n of
    #   its input, a send its bytes. Calls: 2 x units (dp), 2 x blocks x m (tp), per message.
    # HINT 2: busy = compute + tp + pp; bubble = busy x (pp - 1) / m; exposed = max(0, dp -
    #   compute); total = busy + bubble + exposed, for the stage with the largest busy.
    ### BEGIN SOLUTION
    m, found, lat = par.micro_batches, [], hw.latency
    tokens = par.batch // par.dp * model.seq
    for stage in range(par.pp):
        sent, blocks = traffic(model, par, stage), len(stage_blocks(model.depth, par.pp, stage))
        weights = blocks * 2 * model.dim * (model.width // par.tp)
        weights += model.vocab * model.dim if stage == par.pp - 1 else 0
        compute = 6 * weights * tokens / (hw.flops * hw.efficiency)
        n = par.tp
        tp = sent.get("tp.all_reduce", 0) * 2 * (n - 1) / n / bandwidth(par, hw, "tp")
        tp += 2 * blocks * m * lat if "tp.all_reduce" in sent else 0
        messages = ((stage > 0) + (stage < par.pp - 1)) * m if par.pp > 1 else 0
        pp = sent.get("pp.send", 0) / bandwidth(par, hw, "pp") + messages * lat
        n, dp = par.dp, 0.0
        if n > 1:
            moved = (n - 1) * (sent["dp.all_gather"] + sent["dp.reduce_scatter"] / n)
            dp = moved / bandwidth(par, hw, "dp") + 2 * len(units(model, par, stage)) * lat
        busy = compute + tp + pp
        found.append({"compute": compute, "tp": tp, "pp": pp, "dp": dp,
                      "exposed": max(0.0, dp - compute), "bubble": busy * (par.pp - 1) / m,
                      "busy": busy})  # fmt: skip
    worst = max(found, key=lambda t: t["busy"])
    worst["total"] = worst["busy"] + worst["bubble"] + worst["exposed"]
    return worst
    ### END SOLUTION


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
    # HINT 1: the bubble's share of a step is (pp - 1) / (m + pp - 1). communication_bound
    #   and best_tp try each candidate in turn and call step_time.
    # HINT 2: math.ceil((pp - 1) * (1 - target) / target - 1e-9), at least 1; see the page
    #   for the other two.
    ### BEGIN SOLUTION
    return max(1, math.ceil((pp - 1) * (1 - target) / target - 1e-9))
    ### END SOLUTION


def communication_bound(model: Model, par: Parallel, hw: Hardware, most: int = 1 << 16):
    """The smallest data-parallel degree, a power of two, at which the data-parallel
    traffic no longer hides behind compute (exposed > 0), each dp rank keeping its share
    of par's batch; None up to `most`."""
    # TODO: try dp = 1, 2, 4, ... with the batch grown to keep each rank's share.
    # HINT 1: share = par.batch // par.dp sequences a rank; the shape of degree dp is
    #   Parallel(par.pp, dp, par.tp, share * dp, par.micro_batches, par.schedule).
    # HINT 2: return the first dp whose step_time(model, shape, hw)["exposed"] > 0; None
    #   after `most`.
    ### BEGIN SOLUTION
    per_rank, dp = par.batch // par.dp, 1
    while dp <= most:
        shape = Parallel(par.pp, dp, par.tp, per_rank * dp, par.micro_batches, par.schedule)
        if step_time(model, shape, hw)["exposed"] > 0:
            return dp
        dp *= 2
    return None
    ### END SOLUTION


def best_tp(model: Model, par: Parallel, hw: Hardware) -> int:
    """The tp (a power of two dividing the MLP width, the world kept: dp shrinks as tp
    grows) with the shortest step; the smaller on a tie."""
    # TODO: try tp = 1, 2, 4, ... while it divides the width and the ranks, skipping
    # shapes whose batch does not split.
    # HINT 1: the ranks stay par.tp * par.dp: dp = par.tp * par.dp // tp; skip a tp when
    #   par.batch % (dp * par.micro_batches) is not 0.
    # HINT 2: keep the (total, tp) with the smallest step_time(...)["total"], replacing it
    #   only when strictly smaller, so that the smaller tp wins a tie.
    ### BEGIN SOLUTION
    best, tp = None, 1
    while tp <= par.tp * par.dp and model.width % tp == 0:
        dp = par.tp * par.dp // tp
        if par.batch % (dp * par.micro_batches) == 0:
            shape = Parallel(par.pp, dp, tp, par.batch, par.micro_batches, par.schedule)
            total = step_time(model, shape, hw)["total"]
            if best is None or total < best[0]:
                best = (total, tp)
        tp *= 2
    return best[1]
    ### END SOLUTION


# --8<-- [end:questions]
