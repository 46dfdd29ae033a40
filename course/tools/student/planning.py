"""python -m course plan: lesson 15's cost model, against this machine or at scale.

    python -m course plan --predict            # your plan.py's step times for 4 shapes here
    python -m course plan --measure            # ... and each shape run here, with the ratio
    python -m course plan --model llama-8b --gpus 256 --gpu h100-80gb     # meshes that fit
    python -m course plan --model llama-8b --gpus 256 --gpu h100-80gb --check 1

--predict and --measure use your file (lessons/15_planning/plan.py; --impl another
folder) and this machine: its matmul rate, measured now with the ranks' share of its
cores, and its `course bandwidth` record (--bandwidth FILE; measured now on 2 ranks when
absent). The shapes are the composition lesson 14 builds: on one rank (as lesson 01
trains), and laid out as lessons 03 (2
data-parallel ranks), 10 (4 sharded ranks), 11 (2 pipeline stages by 2-way tensor
parallel) and 14 (pp 2 x dp 2 x tp 2) lay theirs out. --measure runs each on gloo ranks
(nccl, one rank a GPU, where GPUs are: a shape needing more is skipped, saying so) and
prints the median step next to the prediction. --model plans with the reference
(solutions/; --impl another folder) and the presets in course/tools/student/planner.py.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

from course import REPO_ROOT
from course.tools.student.plan_here import BATCH, _bandwidth, machine, measure

KIND = "course-plan"
SHAPES = {
    "01": (1, 1, 1, 1),
    "03": (1, 2, 1, 1),
    "10": (1, 4, 1, 1),
    "11": (2, 1, 2, 4),
    "14": (2, 2, 2, 4),
}  # (pp, dp, tp, micro-batches) by the lesson whose layout it is
MODEL = dict(vocab=512, dim=192, depth=4, seq=64)  # every shape's model (--dim, --seq)
ON_GPU = dict(dim=2048, seq=512)  # on GPUs, by default: big enough to be compute-bound


def load(impl: Path):
    path = Path(impl) / "15_planning" / "plan.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (--impl names the lessons' folder)")
    spec = importlib.util.spec_from_file_location("student_plan", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _unwritten(path: Path, err: NotImplementedError) -> ValueError:
    return ValueError(f"{path}: a TODO is not written yet ({err or 'NotImplementedError'}); "
                      "finish it, or pass --impl solutions")  # fmt: skip


def parser():
    from course import registry
    from course.options import ArgumentParser, positive_int

    p = ArgumentParser(prog="python -m course plan", description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--predict", action="store_true", help="predicted step times here")
    what.add_argument("--measure", action="store_true", help="... and measured, with ratios")
    what.add_argument("--model", help="plan a preset: " + ", ".join(_presets()))
    p.add_argument(
        "--impl",
        type=registry.impl_argument,
        help="the folder of plan.py (default: lessons; solutions with --model)",
    )
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl if CUDA works")
    p.add_argument("--bandwidth", help="a `course bandwidth` record (default: measure now)")
    p.add_argument("--steps", type=positive_int, default=5, help="timed steps a shape")
    p.add_argument(
        "--dim", type=positive_int, help="the shapes' model width (default 192; 2048 on GPUs)"
    )
    p.add_argument("--seq", type=positive_int, help="its sequence (default 64; 512 on GPUs)")
    p.add_argument("--gpus", type=positive_int, default=256)
    p.add_argument("--gpu", default="h100-80gb", help="one of: " + ", ".join(_gpus()))
    p.add_argument("--efficiency", type=float, default=0.4, help="of peak FLOP/s (--model)")
    p.add_argument("--batch", type=positive_int, help="sequences a step (default: preset's)")
    p.add_argument("--top", type=positive_int, default=10)
    p.add_argument(
        "--mesh",
        type=positive_int,
        nargs="+",
        metavar="N",
        help="plan this mesh only: PP DP TP [MICRO_BATCHES]",
    )
    p.add_argument(
        "--check",
        type=positive_int,
        metavar="N",
        help="step row N once as one rank of a fake world, predicted vs counted",
    )
    p.add_argument("--check-seq", type=positive_int, default=16)
    p.add_argument("--rank", type=int, default=0, help="the rank --check counts")
    p.add_argument("--out", help="write the JSON record here (--predict, --measure)")
    return p


def score(rows: list[dict]) -> dict | None:
    """A planner scored as a planner, over the shapes it measured: its error, the largest
    |predicted / measured - 1|, and its ranking, Kendall's tau between the predicted and
    the measured step times (1: every pair of shapes in the right order; pairs tied in
    either count as agreeing by half). None with fewer than two measured shapes."""
    ran = [r for r in rows if "measured" in r]
    if len(ran) < 2:
        return None
    error = max(abs(r["predicted"]["total"] / r["measured"] - 1) for r in ran)
    pairs = [(a, b) for i, a in enumerate(ran) for b in ran[i + 1 :]]
    agree = 0.0
    for a, b in pairs:
        said = a["predicted"]["total"] - b["predicted"]["total"]
        seen = a["measured"] - b["measured"]
        agree += 0.5 if said == 0 or seen == 0 else float((said > 0) == (seen > 0))
    tau = 2 * agree / len(pairs) - 1  # (concordant - discordant) / pairs
    return {"error": error, "tau": tau, "shapes": len(ran)}


def _english_score(scored: dict) -> str:
    return (
        f"Over the {scored['shapes']} shapes measured: the largest error |predicted / "
        f"measured − 1| is {scored['error']:.0%}, and Kendall's τ between the predicted "
        f"and the measured order is {scored['tau']:.2f} (1: every pair in the right order)."
    )


# The table's words; a page in another language passes its own (docs/hooks: Chinese).
ENGLISH = {"heading": "| lesson | mesh (pp, dp, tp) × m | predicted | compute / tp+pp / dp / "
                      "bubble | measured (min-max) | ratio |",
           "skipped": "skipped: {}".format, "score": _english_score}  # fmt: skip


def render_markdown(doc: dict, words: dict = ENGLISH) -> str:
    """The record as the page's table, in milliseconds: each shape's prediction and its
    terms (compute / tp + pp / dp not hidden / bubble), the measured step and the ratio."""
    lines = [words["heading"], "|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        mesh = "({}, {}, {}) × {}".format(*r["shape"])
        if "skipped" in r:
            lines.append(f"| {r['lesson']} | {mesh} | {words['skipped'](r['skipped'])} | | | |")
            continue
        p = {k: v * 1e3 for k, v in r["predicted"].items()}
        terms = (
            f"{p['compute']:.1f} / {p['tp'] + p['pp']:.1f} / {p['exposed']:.1f} / {p['bubble']:.1f}"
        )
        measured = (f"{r['measured'] * 1e3:.1f} ({r['fastest'] * 1e3:.1f}-"
                    f"{r['slowest'] * 1e3:.1f})" if "measured" in r else "")  # fmt: skip
        ratio = f"{r['ratio']:.2f}×" if "ratio" in r else ""
        lines.append(f"| {r['lesson']} | {mesh} | {p['total']:.1f} | {terms} | {measured} | "
                     f"{ratio} |")  # fmt: skip
    if scored := score(doc["rows"]):
        lines += ["", words["score"](scored)]
    return "\n".join(lines)


def _presets() -> list[str]:
    from course.tools.student.planner import MODELS

    return list(MODELS)


def _gpus() -> list[str]:
    from course.tools.student.planner import GPUS

    return list(GPUS)


def provenance(argv: list[str], backend: str, bandwidth_from: str) -> dict:
    from course.tools.student.bandwidth import provenance as bandwidth_provenance

    info = bandwidth_provenance([], backend, 1)
    info["command"] = "python -m course plan " + " ".join(argv)
    info["bandwidth"] = bandwidth_from
    del info["ranks"]
    return info


def predict_here(plan, args, argv) -> dict:
    """Each shape's prediction on this machine (and its measurement, with --measure)."""
    from course import ranks

    backend, gpus = ranks.backend_and_world_size(args.backend, None)
    gpus = gpus if backend == "nccl" else 0
    record, source = _bandwidth(args.bandwidth, backend, gpus)
    sizes = MODEL | (ON_GPU if backend == "nccl" else {})
    sizes |= {k: getattr(args, k) for k in ("dim", "seq") if getattr(args, k)}
    rows = []
    for lesson, shape in SHAPES.items():
        pp, dp, tp, m = shape
        model = plan.Model(sizes["vocab"], sizes["dim"], sizes["depth"], sizes["seq"])
        par = plan.Parallel(pp, dp, tp, BATCH, m, "1f1b")
        row = {"lesson": lesson, "shape": list(shape), "world": par.world}
        if backend == "nccl" and par.world > gpus:
            row["skipped"] = f"needs {par.world} GPUs; this machine has {gpus}"
            rows.append(row)
            print(_line(row), flush=True)
            continue
        hw = machine(plan, backend, record, par.world, sizes)
        row["flops"] = hw.flops
        row["predicted"] = {k: float(v) for k, v in plan.step_time(model, par, hw).items()}
        if args.measure:
            timed = measure(backend, shape, args.steps, sizes)
            row["measured"], row["fastest"], row["slowest"] = timed
            row["ratio"] = row["measured"] / row["predicted"]["total"]
        rows.append(row)
        print(_line(row), flush=True)
    return {"kind": KIND, "model": sizes, "batch": BATCH, "rows": rows,
            "provenance": provenance(argv, backend, source)}  # fmt: skip


def _line(row: dict) -> str:
    shape = "pp {}, dp {}, tp {}, m {}".format(*row["shape"])
    head = f"lesson {row['lesson']}  ({shape}, {row['world']} ranks)"
    if "skipped" in row:
        return f"{head:<44} skipped: {row['skipped']}"
    p = row["predicted"]
    ms = {k: v * 1e3 for k, v in p.items()}
    text = (f"{head:<44} predicted {ms['total']:8.1f} ms (compute {ms['compute']:.1f}, "
            f"tp {ms['tp']:.1f}, pp {ms['pp']:.1f}, dp {ms['dp']:.1f} of which hidden "
            f"{ms['dp'] - ms['exposed']:.1f}, bubble {ms['bubble']:.1f})")  # fmt: skip
    if "measured" in row:
        low, high = row["fastest"] * 1e3, row["slowest"] * 1e3
        text += (f"\n{'':<44} measured  {row['measured'] * 1e3:8.1f} ms (median; "
                 f"{low:.1f}-{high:.1f}): {row['ratio']:.2f}x")  # fmt: skip
    return text


def plan_at_scale(plan, args) -> None:
    from course.tools.student import planner

    if args.model not in planner.MODELS:
        raise ValueError(
            f"--model {args.model}: not a preset (one of: " + ", ".join(planner.MODELS) + ")"
        )
    if args.gpu not in planner.GPUS:
        raise ValueError(f"--gpu {args.gpu}: not a preset (one of: {', '.join(planner.GPUS)})")
    preset = planner.MODELS[args.model]
    model = plan.Model(preset.vocab, preset.dim, preset.depth, preset.seq, preset.hidden)
    hw = plan.Hardware(efficiency=args.efficiency, **planner.GPUS[args.gpu])
    batch = args.batch or preset.batch
    if args.mesh:
        pp, dp, tp, m = (args.mesh + [1])[:4]
        par = plan.Parallel(pp, dp, tp, batch, m, "1f1b")
        plan.check(model, par, args.gpus)  # ValueError: the product, or what does not split
        rows = [{"par": par, "memory": planner.memory(plan, model, par),
                 **plan.step_time(model, par, hw)}]  # fmt: skip
    else:
        rows = planner.rank(plan, model, args.gpus, batch, hw)
    print(textwrap.fill(f"{args.model}: {preset.source}", 88, subsequent_indent="  "))
    # Lines of at most 100 characters: a page's output block shows 100 at 1280 px.
    print(f"on {args.gpus} x {args.gpu}, {batch} sequences of {preset.seq} a step, float32 + "
          "AdamW")  # fmt: skip
    print(f"compute at {hw.flops * args.efficiency / 1e12:g} TFLOP/s: {args.efficiency:.0%} of "
          f"the {planner.RATE.split(', ')[0]}")  # fmt: skip
    if not rows:
        raise ValueError(f"no mesh of {args.gpus} GPUs fits {args.model} in "
                         f"{hw.memory / planner.GB:.0f} GB a GPU")  # fmt: skip
    if args.mesh:
        fits = "fits" if planner.fits(rows[0]["memory"], hw) else "does not fit"
        print(f"the mesh asked for {fits}, in seconds a step;")
    else:
        print(f"{len(rows)} meshes fit; the {min(args.top, len(rows))} fastest, in seconds a "
              "step;")  # fmt: skip
    print(f"{planner.fit_rule(hw)}:")
    print(planner.table(rows, args.top))
    if args.check:
        if args.check > len(rows):
            raise ValueError(f"--check {args.check}: only {len(rows)} meshes fit")
        par = rows[args.check - 1]["par"]
        if not 0 <= args.rank < par.world:
            raise ValueError(f"--rank {args.rank}: not a rank of {par.world}")
        print(planner.check(plan, model, par, args.check_seq, args.rank))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    impl = args.impl or REPO_ROOT / ("solutions" if args.model else "lessons")
    plan = load(impl)
    try:
        if args.model:
            plan_at_scale(plan, args)
            return 0
        doc = predict_here(plan, args, argv)
    except NotImplementedError as err:
        raise _unwritten(Path(impl) / "15_planning" / "plan.py", err) from None
    if scored := score(doc["rows"]):
        print(f"over {scored['shapes']} shapes: largest |predicted/measured - 1| "
              f"{scored['error']:.0%}, Kendall's tau {scored['tau']:.2f}")  # fmt: skip
    if args.out:
        from course import atomic

        atomic.write_json(doc, args.out, indent=1)
        print(f"wrote {args.out}")
    return 0
