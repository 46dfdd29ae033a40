"""The grader's own cost model for lesson 15, written apart from the reference solution.

Byte counts here are checked against the program itself (course/measure/scale.py counts one
rank of a fake world): tests/course/measure/test_scale.py. The step time and the three
questions follow the page's α-β model, term by term, and are the grader's answers for the
hidden configurations of tests/lessons/test_15_planning.py.

Shapes come from the model itself: StagedLM built on the meta device, cut and split as
lesson 14 does (up split by rows, down by columns over tp), never from a list of shapes.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch

from course import models
from course.measure import draws
from course.measure.scale import Config, cuts

F32 = 4


@functools.lru_cache(maxsize=256)
def _named_shapes(vocab: int, dim: int, depth: int, hidden: int) -> tuple:
    """(name, shape) of every parameter of the whole StagedLM, built on the meta device
    (once per model: the draws below try many meshes of few models)."""
    with torch.device("meta"):
        whole = models.StagedLM(vocab, dim, depth, hidden)
    return tuple((name, tuple(p.shape)) for name, p in whole.named_parameters())


def stage_tensors(c: Config, stage: int) -> dict[str, list[tuple[int, ...]]]:
    """{FSDP unit: tp-local shapes} of one stage ("root" for what is not in a block)."""
    first = cuts(c.depth, c.pp)
    found: dict[str, list[tuple[int, ...]]] = {}
    for name, shape in _named_shapes(c.vocab, c.dim, c.depth, c.hidden):
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
        shape = list(shape)
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


def stage_times(c: Config, hw: dict) -> list[tuple[float, float, float, float, float]]:
    """The page's model, per stage: (busy, compute, tp, pp, dp) in seconds; compute is
    6 x matmul weights x tokens at the stated efficiency, tp and pp on the critical path,
    dp behind compute."""
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
            pp += alpha * (sent["pp.send"] // (c.rows * c.seq * c.dim * F32))  # messages
        dp = 0.0
        if "dp.all_gather" in sent:
            gathered = sent["dp.all_gather"] * (c.dp - 1)
            scattered = sent["dp.reduce_scatter"] * (c.dp - 1) / c.dp
            calls = 2 * len(stage_tensors(c, s))
            dp = (gathered + scattered) / _link(c, hw, c.dp * c.tp) + alpha * calls
        stages.append((compute + tp + pp, compute, tp, pp, dp))
    return stages


def step_time(c: Config, hw: dict) -> dict[str, float]:
    """The busiest stage sets the step, plus its bubble and whatever dp traffic compute
    does not hide."""
    busy, compute, tp, pp, dp = max(stage_times(c, hw), key=lambda t: t[0])
    bubble = busy * (c.pp - 1) / c.micro_batches
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


# --- the hidden configurations, drawn from the grading seed ------------------------------


# Seeds vary values, never coverage (tests/lessons/test_15_planning.py's draw test checks
# every family below at many seeds, without grading): every draw counts both schedules, a
# middle stage, tp = 1 and a tp other than 2; times dp = 1, tp = 1 and tp inside and across
# nodes; and asks the questions of a pipeline and of a batch that does not split.
def counted_configs() -> list[tuple[Config, int]]:
    """Four meshes of 64 to 1024 ranks, each with the rank counted: stages of unequal
    depth, vocabularies and widths that do not split evenly over dp (padding, ranks with
    fewer rows or none), both schedules, more micro-batches than stages and fewer, a middle
    stage, tp = 1."""
    r = draws.generator("15.counted")
    found = []
    dp = r.choice([32, 64])
    m = r.choice([2, 4, 8])
    first, other = r.sample(["gpipe", "1f1b"], 2)  # both schedules, in a drawn order
    found.append(
        (
            Config(
                pp=4,
                dp=dp,
                tp=1024 // (4 * dp),
                depth=r.choice([5, 6, 7, 9]),
                dim=r.choice([32, 48, 64]),
                vocab=r.randrange(200, 600),
                seq=r.choice([8, 16]),
                micro_batches=m,
                batch=dp * m,
                schedule=first,
            ),
            r.randrange(1024),
        )
    )
    dp, tp = 128, 1  # tp = 1: no tensor-parallel traffic, whole blocks on each rank
    config = Config(
        pp=2,
        dp=dp,
        tp=tp,
        depth=r.choice([3, 5]),
        dim=r.choice([24, 40]),
        vocab=r.randrange(101, 400, 2),
        seq=8,
        micro_batches=2,
        batch=2 * dp,
        schedule=other,
    )
    last = (dp - 1) * tp + r.randrange(tp) + r.randrange(2) * dp * tp  # the last dp rank
    found.append((config, last))
    dp = r.choice([16, 32, 64])
    tp = 64 // dp
    found.append(
        (
            Config(
                pp=1,
                dp=dp,
                tp=tp,
                depth=r.choice([2, 3]),
                dim=r.choice([32, 48]),
                vocab=r.randrange(60, 200),
                seq=r.choice([4, 8]),
                batch=dp * r.choice([1, 2]),
                hidden=r.choice([0, 40 * tp]),
            ),
            r.randrange(64),
        )
    )
    dp = r.choice([16, 32, 64])
    m = r.choice([2, 3, 6])
    found.append(
        (
            Config(
                pp=3,
                dp=dp,
                tp=2,
                depth=r.choice([7, 8, 10]),
                dim=32,
                vocab=r.randrange(100, 1000),
                seq=8,
                micro_batches=m,
                batch=dp * m,
                schedule=r.choice(["gpipe", "1f1b"]),
            ),
            r.randrange(2 * dp, 4 * dp),  # stage 1 of 3: a middle stage, sends both ways
        )
    )
    return found  # fmt: skip


def hardware(r) -> dict:
    return {"memory": 80e9, "flops": r.uniform(100e12, 1000e12),
            "efficiency": r.uniform(0.3, 0.6), "gpus_per_node": r.choice([4, 8]),
            "intra": r.uniform(100e9, 400e9), "inter": r.uniform(10e9, 50e9),
            "latency": r.uniform(5e-6, 50e-6)}  # fmt: skip


def until(r, make, wanted, what: str, tries: int = 2000):
    """The first of make(r)'s draws for which wanted(draw) holds: a case family that every
    seed covers, its values drawn from the seed."""
    for _ in range(tries):
        found = make(r)
        if wanted(found):
            return found
    raise RuntimeError(f"no draw of {what} in {tries} tries")


def busiest(c: Config, hw: dict) -> int:
    """The stage that sets the step's pace."""
    times = [t[0] for t in stage_times(c, hw)]
    return times.index(max(times))


def _pipeline(r, pp: int) -> tuple[Config, dict]:
    """A pipeline of `pp` stages on a hidden machine, every value drawn."""
    dp, tp, m = r.choice([2, 4, 8]), r.choice([1, 2, 4]), r.choice([2, 4, 8])
    config = Config(pp=pp, dp=dp, tp=tp, depth=pp * r.choice([4, 6, 8]),
                    dim=r.choice([1024, 2048]), vocab=r.choice([1000, 8000, 32000]),
                    seq=r.choice([256, 1024]), micro_batches=m, batch=dp * m,
                    schedule=r.choice(["gpipe", "1f1b"]))  # fmt: skip
    return config, hardware(r)


def _middle_sets_the_pace(found) -> bool:
    c, hw = found
    return 0 < busiest(c, hw) < c.pp - 1


def _ends_nearly_tie(found) -> bool:
    """The last stage (the head's extra compute) ahead of the first by less than one
    message's latency a micro-batch: a first stage's messages miscounted decide the pace."""
    c, hw = found
    times = [t[0] for t in stage_times(c, hw)]
    return 0 <= times[-1] - times[0] < c.micro_batches * hw["latency"]


def timed_configs() -> list[tuple[Config, dict]]:
    """Large models on hidden machines, for the step time: every term above zero
    somewhere, tp inside a node and across nodes."""
    r = draws.generator("15.timed")
    found = []
    schedules = r.sample(["gpipe", "1f1b"], 2)  # the first two pipelines: one of each
    shapes = [(4, 16, 4), (2, 8, 16), (1, 64, 2), (8, 4, 8), (2, 1, 8), (4, 8, 1)]
    for i, (pp, dp, tp) in enumerate(shapes):
        m = r.choice([1, 4, 8, 16])
        dim = r.choice([1024, 2048, 4096])
        found.append(
            (
                Config(
                    pp=pp,
                    dp=dp,
                    tp=tp,
                    depth=r.choice([24, 30, 32, 40]),
                    dim=dim,
                    vocab=r.choice([32000, 50257, 128256]),
                    seq=r.choice([1024, 4096]),
                    micro_batches=m,
                    batch=dp * m * r.choice([1, 2]),
                    schedule=schedules[i] if i < 2 else r.choice(["gpipe", "1f1b"]),
                ),
                hardware(r),
            )
        )
    # Which stage sets the pace: a middle one (it sends both ways), and the two ends
    # within a latency term of each other.
    # (Three stages: the middle one is also the last but one, which sends to the last.)
    found.append(until(r, lambda r: _pipeline(r, 3), _middle_sets_the_pace, "a middle stage"))
    found.append(until(r, lambda r: _pipeline(r, 2), _ends_nearly_tie, "ends that nearly tie"))
    return found  # fmt: skip


def _tp_question(r, micro_batches: int = 1) -> tuple[Config, dict]:
    dp = r.choice([4, 8, 16])
    config = Config(pp=1, dp=dp, tp=1, depth=16, dim=r.choice([2048, 8192]), vocab=50257,
                    seq=2048, batch=64, micro_batches=micro_batches)  # fmt: skip
    return config, hardware(r)


def tp_times(c: Config, hw: dict) -> dict[int, float]:
    """Every tp best_tp may try, splitting batch or not: {tp: step total}."""
    ranks, times, tp = c.tp * c.dp, {}, 1
    while tp <= ranks and width(c) % tp == 0:
        times[tp] = step_time(Config(**{**c.__dict__, "dp": ranks // tp, "tp": tp}), hw)["total"]
        tp *= 2
    return times


def _small_batch_question(r) -> tuple[Config, dict]:
    """Wide blocks, few short sequences, a node's ranks: data parallelism's traffic is not
    hidden by so little compute, and tensor parallelism's is small."""
    dp = r.choice([2, 4])
    config = Config(pp=1, dp=dp, tp=1, depth=16, dim=r.choice([4096, 8192]),
                    vocab=r.choice([1000, 8000]), seq=r.choice([64, 128]),
                    batch=dp * r.choice([1, 2]))  # fmt: skip
    return config, hardware(r)


def _all_ranks_win(found) -> bool:
    c, hw = found
    return best_tp(c, hw) == c.tp * c.dp


def _unsplit_would_win(found) -> bool:
    """The shape that would be fastest does not split the batch, so it is not a choice."""
    c, hw = found
    times = tp_times(c, hw)
    fastest = min(times, key=lambda t: (times[t], t))
    return c.batch % (c.tp * c.dp // fastest * c.micro_batches) != 0


def _unsplit_batch(r) -> tuple[Config, dict]:
    c, hw = _tp_question(r, micro_batches=r.choice([2, 4]))
    return Config(**{**c.__dict__, "batch": c.dp * c.micro_batches // 2}), hw


def _tie_question(r) -> tuple[Config, dict]:
    """Free communication (infinite bandwidth, no latency) and no vocabulary: every tp's
    step is the same compute, to the bit (powers of two throughout), so best_tp must fall
    back on its tie rule, the smaller tp."""
    config = Config(pp=1, dp=r.choice([4, 8, 16]), tp=1, depth=16, dim=r.choice([1024, 2048]),
                    vocab=0, seq=2048, batch=64)  # fmt: skip
    free = {"intra": float("inf"), "inter": float("inf"), "latency": 0.0}
    return config, {**hardware(r), "flops": 2.0**50, "efficiency": 0.5, **free}


def _bound_question(r) -> tuple[Config, dict]:
    config = Config(pp=1, dp=8, tp=r.choice([1, 2, 4]), depth=r.choice([8, 16, 32]),
                    dim=r.choice([1024, 2048, 4096]), vocab=32000,
                    seq=r.choice([512, 2048, 4096]), batch=8 * r.choice([2, 4, 8, 16]))  # fmt: skip
    return config, hardware(r)


def questions() -> dict:
    """The three questions' hidden numbers."""
    r = draws.generator("15.questions")
    pipelines = [(r.randrange(2, 17), r.choice([0.05, 0.1, 0.2, 0.25])) for _ in range(4)]
    bound = [_bound_question(r) for _ in range(3)]
    bound[0] = (Config(**{**bound[0][0].__dict__, "seq": 4096, "batch": 8 * 16}), bound[0][1])
    # a pipeline: two stages of four micro-batches, each rank's share kept as dp grows
    piped = {"pp": 2, "micro_batches": 4, "batch": 8 * 4 * r.choice([1, 2, 4])}
    bound[1] = (Config(**{**bound[1][0].__dict__, **piped}), bound[1][1])
    tp = [
        (
            Config(
                pp=1,
                dp=r.choice([4, 8, 16]),
                tp=1,
                depth=16,
                dim=r.choice([2048, 8192]),
                vocab=50257,
                seq=2048,
                batch=64,
            ),
            hardware(r),
        )
        for _ in range(3)
    ]
    # a batch that does not split over every dp: at tp = 1 (dp = all the ranks) it does not
    tp[1] = (Config(**{**tp[1][0].__dict__, "batch": 3 * tp[1][0].dp // 2}), tp[1][1])
    # every seed: the answer all the ranks (dp 1); the fastest shape one whose batch, in
    # several micro-batches, does not split; one stage, and a target one micro-batch meets
    tp.append(until(r, _small_batch_question, _all_ranks_win, "tp = all the ranks"))
    tp.append(until(r, _unsplit_batch, _unsplit_would_win, "an unsplit batch that would win"))
    with warnings.catch_warnings():  # no vocabulary: torch notes its empty embedding
        warnings.simplefilter("ignore", UserWarning)
        tp.append(until(r, _tie_question, lambda q: len(set(tp_times(*q).values())) == 1,
                        "a tie"))  # fmt: skip
    pipelines += [(1, r.choice([0.05, 0.1, 0.2])), (2, r.choice([0.5, 0.6, 0.75]))]
    # the page's example, a 10 % bubble: (pp - 1) * 0.9 / 0.1 is a whole number only to
    # within rounding (floor division of the floats gives one less)
    pipelines.append((r.choice([2, 3]), 0.1))
    # the largest dp the search may reach is the answer itself
    c, hw = until(r, _bound_question, lambda q: communication_bound(*q) is not None,
                  "a bound within reach")  # fmt: skip
    return {"pipelines": pipelines, "bound": bound, "tp": tp,
            "bound_most": (c, hw, communication_bound(c, hw))}  # fmt: skip


def placed(c: Config, rank: int) -> tuple[int, int]:
    """(stage, data-parallel rank) of a global rank: tp fastest, then dp, then pp."""
    return rank // (c.dp * c.tp), rank // c.tp % c.dp
