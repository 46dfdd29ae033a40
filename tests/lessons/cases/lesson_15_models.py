"""The grader's own cost model for lesson 15, written apart from the reference solution.

Byte counts here are checked against the program itself (course/grader/scale.py counts one
rank of a fake world): tests/course/grader/test_scale.py. The step time and the three
questions follow the page's α-β model, term by term, and are the grader's answers for the
hidden configurations of tests/lessons/test_15_planning.py.

Shapes come from the model itself: StagedLM built on the meta device, cut and split as
lesson 14 does (up split by rows, down by columns over tp), never from a list of shapes.
"""

from __future__ import annotations

import math

import torch

from course import models
from course.grader.scale import Config, cuts

F32 = 4


def stage_tensors(c: Config, stage: int) -> dict[str, list[tuple[int, ...]]]:
    """{FSDP unit: tp-local shapes} of one stage ("root" for what is not in a block)."""
    with torch.device("meta"):
        whole = models.StagedLM(c.vocab, c.dim, c.depth, c.hidden)
    first = cuts(c.depth, c.pp)
    found: dict[str, list[tuple[int, ...]]] = {}
    for name, p in whole.named_parameters():
        parts = name.split(".")
        if parts[0] == "blocks":
            if not first[stage] <= int(parts[1]) < first[stage + 1]:
                continue
            unit = f"block {parts[1]}"
        elif parts[0] == "embed" and stage != 0:
            continue
        elif parts[0] in ("norm", "head") and stage != c.pp - 1:
            continue
        else:
            unit = "root"
        shape = list(p.shape)
        if parts[-2:-1] == ["up"]:
            shape[0] //= c.tp
        elif parts[-2:] == ["down", "weight"]:
            shape[1] //= c.tp
        found.setdefault(unit, []).append(tuple(shape))
    return found


def _local_rows(n: int, dp: int, rank: int) -> int:
    chunk = -(-n // dp)
    return min(chunk, max(n - chunk * rank, 0))


def held(c: Config, stage: int, dp_rank: int) -> dict[str, int]:
    size = 0
    for shapes in stage_tensors(c, stage).values():
        for shape in shapes:
            size += _local_rows(shape[0], c.dp, dp_rank) * math.prod(shape[1:]) * F32
    return {"params": size, "grads": size, "optimizer": 2 * size}


def width(c: Config) -> int:
    return c.hidden or 4 * c.dim


def activations(c: Config, stage: int) -> int:
    if c.schedule == "gpipe":
        waiting = c.micro_batches
    else:
        waiting = min(c.pp - stage, c.micro_batches)
    blocks = cuts(c.depth, c.pp)[stage + 1] - cuts(c.depth, c.pp)[stage]
    floats = c.dim + 2 + c.dim + 2 * width(c) // c.tp  # norm in, mean, rstd, up in, gelu, down
    return waiting * blocks * c.rows * c.seq * floats * F32


def traffic(c: Config, stage: int) -> dict[str, int]:
    out: dict[str, int] = {}
    blocks = cuts(c.depth, c.pp)[stage + 1] - cuts(c.depth, c.pp)[stage]
    message = c.rows * c.seq * c.dim * F32
    if c.dp > 1:
        shard = sum(
            -(-s[0] // c.dp) * math.prod(s[1:]) * F32
            for shapes in stage_tensors(c, stage).values()
            for s in shapes
        )
        out.update({"dp.all_gather": shard, "dp.reduce_scatter": c.dp * shard})
    if c.tp > 1 and blocks > 0:
        out["tp.all_reduce"] = blocks * c.micro_batches * 2 * message
    if c.pp > 1:
        both = 2 if 0 < stage < c.pp - 1 else 1
        out["pp.recv"] = out["pp.send"] = both * c.micro_batches * message
    return out


def _link(c: Config, hw: dict, ranks: int) -> float:
    return hw["intra"] if ranks <= hw["gpus_per_node"] else hw["inter"]


def step_time(c: Config, hw: dict) -> dict[str, float]:
    """The page's model: per stage, compute (6 x matmul weights x tokens at the stated
    efficiency), tp and pp on the critical path, dp behind compute; the busiest stage sets
    the step, plus its bubble and whatever dp traffic compute does not hide."""
    stages = []
    m, alpha = c.micro_batches, hw["latency"]
    for s in range(c.pp):
        blocks = cuts(c.depth, c.pp)[s + 1] - cuts(c.depth, c.pp)[s]
        sent = traffic(c, s)
        matmul = blocks * 2 * c.dim * width(c) // c.tp + (c.vocab * c.dim if s == c.pp - 1 else 0)
        compute = 6 * matmul * c.rows * c.micro_batches * c.seq / (hw["flops"] * hw["efficiency"])
        tp = 0.0
        if "tp.all_reduce" in sent:
            bus = sent["tp.all_reduce"] * 2 * (c.tp - 1) / c.tp
            tp = bus / _link(c, hw, c.tp) + alpha * 2 * blocks * m
        pp = 0.0
        if "pp.send" in sent:
            pp = sent["pp.send"] / _link(c, hw, c.world)
            pp += alpha * sent["pp.send"] // (c.rows * c.seq * c.dim * F32)
        dp = 0.0
        if "dp.all_gather" in sent:
            gathered = sent["dp.all_gather"] * (c.dp - 1)
            scattered = sent["dp.reduce_scatter"] * (c.dp - 1) / c.dp
            calls = 2 * len(stage_tensors(c, s))
            dp = (gathered + scattered) / _link(c, hw, c.dp * c.tp) + alpha * calls
        stages.append((compute + tp + pp, compute, tp, pp, dp))
    busy, compute, tp, pp, dp = max(stages, key=lambda t: t[0])
    bubble = busy * (c.pp - 1) / m
    exposed = dp - compute if dp > compute else 0.0
    return {"compute": compute, "tp": tp, "pp": pp, "dp": dp, "exposed": exposed,
            "bubble": bubble, "total": busy + bubble + exposed}  # fmt: skip


def micro_batches_for(pp: int, target: float) -> int:
    m = 1
    while (pp - 1) / (m + pp - 1) > target + 1e-12:
        m += 1
    return m


def communication_bound(c: Config, hw: dict, most: int = 1 << 16):
    share = c.rows * c.micro_batches
    for k in range(most.bit_length()):
        dp = 1 << k
        shape = Config(**{**c.__dict__, "dp": dp, "batch": share * dp})
        if step_time(shape, hw)["exposed"] > 0:
            return dp
    return None


def best_tp(c: Config, hw: dict) -> int:
    ranks, times = c.tp * c.dp, {}
    tp = 1
    while tp <= ranks and width(c) % tp == 0:
        dp = ranks // tp
        if c.batch % (dp * c.micro_batches) == 0:
            times[tp] = step_time(Config(**{**c.__dict__, "dp": dp, "tp": tp}), hw)["total"]
        tp *= 2
    return min(times, key=lambda t: (times[t], t))
