"""`python -m course plan --model M --gpus N --gpu G`: the meshes that fit, fastest first.

Every number comes from a plan.py (lesson 15's cost model; the reference by default). A
preset is a published model written as the course's block (an MLP block, course.models.
StagedLM): its width is chosen so that a block holds the published block's weights, and
so does its matmul FLOPs per token; attention's own activations and its seq² FLOPs are
not modeled. Training is float32 with AdamW, as everywhere in the course.

--check steps the chosen mesh once, as one rank of a fake world of that size
(course/measure/scale.py), at a shorter sequence (--check-seq: the weights are full size;
bytes that scale with tokens are predicted again for that sequence), and prints what was
counted next to what plan.py predicts.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Preset:
    vocab: int
    dim: int
    depth: int
    seq: int
    hidden: int  # the course block's width: the published block's weights / (2 dim)
    batch: int  # sequences a step
    source: str


def _width(dim: int, kv_dim: int, ffn: int, gated: bool) -> int:
    """Attention (q, o: dim x dim; k, v: dim x kv_dim) plus the MLP (3 or 2 matrices of
    dim x ffn), as the width of a 2-matrix block of the same weights."""
    weights = 2 * dim * dim + 2 * dim * kv_dim + (3 if gated else 2) * dim * ffn
    return weights // (2 * dim)


MODELS = {
    "llama-8b": Preset(128256, 4096, 32, 8192, _width(4096, 1024, 14336, True), 512,
                       "Llama 3.1 8B: Meta's config.json (meta-llama/Llama-3.1-8B) and the "
                       "Llama 3 paper, arXiv:2407.21783, Table 3: 32 layers, dim 4096, FFN "
                       "14336, 8 KV heads of 128, vocabulary 128256; 4M-token batches of 8192"),
    "llama-70b": Preset(128256, 8192, 80, 8192, _width(8192, 1024, 28672, True), 512,
                        "Llama 3.1 70B: arXiv:2407.21783, Table 3: 80 layers, dim 8192, FFN "
                        "28672, 8 KV heads of 128, vocabulary 128256"),
    "gpt3-175b": Preset(50257, 12288, 96, 2048, _width(12288, 12288, 4 * 12288, False), 1536,
                        "GPT-3 175B: arXiv:2005.14165, Table 2.1: 96 layers, dim 12288, "
                        "FFN 4 x dim, context 2048, batch 3.2M tokens"),
    "course-14": Preset(64, 64, 4, 16, 256, 32, "lesson 14's StagedLM (course/models.py)"),
}  # fmt: skip

# Rated numbers, not measured here: NVIDIA's datasheets. flops: FP32, the precision the
# course's program runs (it never enables TF32, and PyTorch's float32 matmuls default to
# strict FP32): 67 TFLOP/s for the H100 and H200 SXM, 19.5 for the A100. The course's own
# H100 record measured 51 TFLOP/s on a float32 GEMM (docs/results/15_planning/1xh100.json).
# intra: NVLink 4, 900 GB/s both ways = 450 one way (NVLink 3: 600 = 300); inter: one
# 400 Gb/s NIC a GPU = 50 GB/s (200 Gb/s = 25); latency: a stated 10 us a collective.
GPUS = {
    "h100-80gb": dict(memory=80 * GB, flops=67e12, gpus_per_node=8, intra=450 * GB,
                      inter=50 * GB, latency=10e-6),
    "h200-141gb": dict(memory=141 * GB, flops=67e12, gpus_per_node=8, intra=450 * GB,
                       inter=50 * GB, latency=10e-6),
    "a100-80gb": dict(memory=80 * GB, flops=19.5e12, gpus_per_node=8, intra=300 * GB,
                      inter=25 * GB, latency=10e-6),
}  # fmt: skip
RATE = "rated FP32 peak (NVIDIA's datasheet), times --efficiency (stated, not measured)"

# peak() / the peak torch's MemTracker tracked in the program (course/measure/scale.py,
# tracked_peak), at most and at least, over every stage of six meshes of 64 to 1024 ranks
# (both schedules, tp 1 to 4; measured 2026-12-07; tests/course/measure/test_scale.py
# checks three of them). It misses most in middle stages, whose sends keep each
# micro-batch's output and input gradient alive until the step ends.
TRACKED = (0.70, 1.18)
# What a GPU holds beyond that, stated, not measured here: the CUDA context and NCCL's
# buffers (HEADROOM_GB), and the caching allocator's fragmentation and what peak()
# misses (HEADROOM_SHARE of its figure: the tracked peak was up to 1 / 0.70 = 1.43 times
# it). A mesh fits when memory + headroom <= the GPU's memory.
HEADROOM_GB = 2
HEADROOM_SHARE = round(1 / TRACKED[0] - 1, 2)


FLOAT = 4  # bytes: the program trains in float32


def peak(plan, model, par, stage: int) -> int:
    """The bytes a rank of `stage` (dp rank 0: the largest shards) holds at its step's peak in
    the program (course/measure/scale.py), from plan.py's own terms, as torch's MemTracker
    sees it. Beyond what plan.held() and plan.activations() count: AdamW's step counts (4
    bytes a tensor); every unit's whole (tp-local) weights, which FSDP2 keeps gathered from
    the first forward to the last backward (reshard_after_forward=False); the whole
    gradients it accumulates until the last micro-batch (torch's set_requires_gradient_sync
    "accumulates gradients in unsharded form"); each micro-batch in flight's stage input,
    and at the last stage the norm's, the head's and the loss's; and the gradients one
    block's backward (or the head's) makes at once. Sharded gradients exist only after
    the step's last backward, below the peak."""
    import math

    found = plan.units(model, par, stage)
    sizes = [sum(math.prod(s) for s in unit) * FLOAT for unit in found]
    blocks = len(plan.stage_blocks(model.depth, par.pp, stage))
    shards = plan.held(model, par, stage, 0)
    base = shards["params"] + shards["optimizer"] + sum(sizes) + 4 * sum(map(len, found))
    tokens, m, last = plan.rows(model, par) * model.seq, par.micro_batches, stage == par.pp - 1
    k = m if par.schedule == "gpipe" else min(m, par.pp - stage)  # micro-batches in flight
    saved = plan.activations(model, par, stage) + k * tokens * model.dim * FLOAT
    logits = tokens * model.vocab * FLOAT * last  # and the loss's log-softmax, as big
    head = tokens * (2 * model.dim + 2) * FLOAT * last + 2 * logits
    block = tokens * (2 * (model.width // par.tp) + 2 * model.dim) * FLOAT
    if par.schedule != "gpipe" and m > par.pp - stage:  # a forward after a backward: all
        return base + sum(sizes) + saved + head + block + 2 * logits
    # Otherwise the forwards end before any gradient exists, or the first backward runs
    # with one block's gradients and the root's (reduced last) beside the saved tensors.
    during = base + max(sizes[:blocks] or [0]) + sum(sizes[blocks:]) + saved + (k - 1) * head
    return max(base + saved + k * head + 2 * logits, during + block)


def memory(plan, model, par) -> int:
    """The fullest rank's peak: the largest of its stages'."""
    return max(peak(plan, model, par, s) for s in range(par.pp))


def fits(memory: float, hw) -> bool:
    """Whether a rank whose peak() is `memory` bytes fits `hw`, headroom included."""
    return memory + HEADROOM_GB * GB + HEADROOM_SHARE * memory <= hw.memory


def fit_rule(hw) -> str:
    return (
        f"GB: the fullest rank's peak; a mesh fits when GB + {HEADROOM_SHARE:.0%} + "
        f"{HEADROOM_GB} GB of headroom <= {hw.memory / GB:.0f}"
    )


def powers(most: int) -> list[int]:
    return [1 << k for k in range(most.bit_length()) if 1 << k <= most]


def meshes(plan, model, gpus: int, batch: int, hw) -> list:
    """Every (pp, dp, tp, micro-batches) with pp x dp x tp = gpus that plan.check accepts:
    pp up to the depth, tp up to two nodes, micro-batches from pp (at least one in flight
    per stage) to 8 pp."""
    found = []
    for tp in powers(min(gpus, 2 * hw.gpus_per_node)):
        for pp in powers(min(gpus // tp, model.depth)):
            dp = gpus // (tp * pp)
            if dp * tp * pp != gpus:
                continue
            for m in sorted({1} | {pp * k for k in (1, 2, 4, 8)}) if pp > 1 else [1]:
                if m < pp and pp > 1:
                    continue
                par = plan.Parallel(pp, dp, tp, batch, m, "1f1b")
                try:
                    plan.check(model, par, gpus)
                except ValueError:
                    continue
                found.append(par)
    return found


def rank(plan, model, gpus: int, batch: int, hw) -> list[dict]:
    """The meshes that fit, fastest first, each with its predicted terms and memory."""
    rows = []
    for par in meshes(plan, model, gpus, batch, hw):
        held = memory(plan, model, par)
        if not fits(held, hw):
            continue
        rows.append({"par": par, "memory": held, **plan.step_time(model, par, hw)})
    return sorted(rows, key=lambda r: (r["total"], r["par"].tp, r["par"].pp))


def table(rows: list[dict], top: int) -> str:
    terms = ("total", "compute", "tp", "pp", "dp", "hidden", "bubble")
    names = ("step s", "compute", "tp", "pp", "dp", "hidden", "bubble")
    lines = [f"{'#':>2} {'pp':>3} {'dp':>5} {'tp':>3} {'m':>3} {'GB':>6}"
             + "".join(f" {n:>8}" for n in names)]  # fmt: skip
    for i, r in enumerate(rows[:top], 1):
        p, r = r["par"], {**r, "hidden": r["dp"] - r["exposed"]}
        lines.append(
            f"{i:>2} {p.pp:>3} {p.dp:>5} {p.tp:>3} {p.micro_batches:>3} {r['memory'] / GB:>6.1f}"
            + "".join(f" {r[t]:>8.3g}" for t in terms)
        )
    return "\n".join(lines)


def check(plan, model, par, seq: int, rank_: int) -> str:
    """Step `par` once as rank `rank_` of a fake world at sequence `seq`; predicted next to
    counted, bytes, for that rank."""
    import warnings

    from course.measure.scale import Config, count, fake_world

    warnings.filterwarnings("ignore")
    short = plan.Model(model.vocab, model.dim, model.depth, seq, model.hidden)
    config = Config(pp=par.pp, dp=par.dp, tp=par.tp, depth=model.depth, dim=model.dim,
                    vocab=model.vocab, seq=seq, batch=par.batch,
                    micro_batches=par.micro_batches, schedule=par.schedule,
                    hidden=model.hidden)  # fmt: skip
    with fake_world(par.world, rank_):
        found = count(config)
    stage, dp_rank = rank_ // (par.dp * par.tp), rank_ // par.tp % par.dp
    said = plan.held(short, par, stage, dp_rank)
    said["activations"] = plan.activations(short, par, stage)
    said.update(plan.traffic(short, par, stage))
    counted = {**found["held"], **found["traffic"]}
    mesh = f"(pp {par.pp}, dp {par.dp}, tp {par.tp}), {par.micro_batches} micro-batches"
    lines = [f"rank {rank_} of {par.world}: {mesh}; its stage {stage}, dp rank {dp_rank}",
             f"one step at sequence {seq}, bytes:",
             f"  {'':<20} {'predicted':>16} {'counted':>16}"]  # fmt: skip
    for key in sorted(set(said) | set(counted), key=lambda k: ("." in k, k)):
        a, b = said.get(key, 0), counted.get(key, 0)
        mark = "" if a == b else "   <- differs"
        lines.append(f"  {key:<20} {a:>16,} {b:>16,}{mark}")
    return "\n".join(lines)
