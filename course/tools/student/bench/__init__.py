"""python -m course bench: the lessons' own training code, timed side by side.

    python -m course bench                                  # every lesson, fp32, all GPUs
    python -m course bench --amp bf16 --channels-last       # Tensor Core speed
    python -m course bench --lessons 01 03 --gpus 2 --impl lessons   # your version
    python -m course bench --lessons 02 --skip 02-tuned     # leave a slow row out
    python -m course bench --lessons 01 08 --only 01 08 08-compile   # some rows only
    python -m course bench --plot runs/bench/*.json         # redraw the plot from records

One row per way of training, each a launch of a lesson script exactly as its
page shows it (same model, same per-GPU batch, synthetic data made on the
GPU, so the model is measured and not the input pipeline):

    01  one device            python 01_single_device/train.py --device cuda
    02  DataParallel          python 02_data_parallel/train_dp.py --gpus N
    02  DataParallel, tuned   the same with --cudnn-benchmark (cuDNN's autotuner)
    03  DDP, mp.spawn         python 03_ddp_spawn/train.py --nproc N --backend nccl
    04  DDP, torchrun         torchrun --standalone --nproc_per_node=N 04_torchrun/train.py
    06  torch DDP / MiniDDP   python 06_ddp_from_scratch/mini_ddp.py --nproc N --wrapper torch
                              (and --wrapper mini, with 25 MB buckets and with one per tensor);
                              "step / DDP's" is MiniDDP's step time over DDP's in that loop
    08  one option at a time  python 08_performance/train.py --nproc N, then the same with
                              one change each: no bucket view, bucket sizes, static graph,
                              no_sync accumulation, fewer NCCL channels, fp32, images
                              decoded from files (0 workers, unpinned, pinned),
                              torch.compile; "x 08" is each row's throughput over the
                              unchanged run's
    09  starved input         python 09_debugging/starved.py --device cuda, as handed out
                              (lessons/) and fixed (--workers 4): its own SmallCNN on the
                              digits, batch 32; "x 09-starved" is the fix's throughput over
                              the starter's. Only when asked: --lessons 09
    11  model parallel        python 11_model_parallel/pipeline.py --nproc 1 (the whole model
                              on one device), then --nproc N --schedule 1f1b with 1, 2, 4, 8
                              micro-batches and torch-1f1b with 8, one batch for the job:
                              "bubble" is 1 - efficiency, beside (p-1)/(m+p-1); then
                              tensor.py --nproc 1 --split none, and --nproc N with --split
                              hand and dtensor, each profiled over its last warm-up window:
                              "in collectives" is the share of that window's steps during
                              which NCCL's kernels (gloo's operations) ran. Wider models
                              on GPUs. Only when asked: --lessons 11

The processes run with the caller's environment, not the grader's one-thread
settings, so a lesson that oversubscribes the CPU shows it. Their optimizer
steps are timed from the outside (course/probes/step_clock.py): every window of K
steps ends with a wait for the GPU; the first windows are warm-up (cuDNN
plans, the allocator, NCCL's connections) and are dropped; the row reports
the *median* window. Efficiency is throughput(N) / (N x one device's).

On a machine without GPUs it runs a tiny version (a small CNN, 32x32 images,
2 gloo processes on the CPU): it exercises every code path, and its numbers
say nothing about GPUs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from course import atomic, registry
from course.tools.student.bench import catalogue, launch, provenance, render


def parser(prog: str = "python -m course bench") -> argparse.ArgumentParser:
    from course.options import ArgumentParser, positive_int

    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument(
        "--impl",
        default="solutions",
        type=registry.impl_argument,
        help="solutions (default), lessons or a folder",
    )
    p.add_argument(
        "--lessons",
        nargs="+",
        default=["01", "02", "03", "04", "06", "08"],
        help="which rows (default: all but 09 and 11, whose scripts train models of their own)",
    )
    p.add_argument("--skip", nargs="+", default=[], metavar="KEY", help="rows to leave out")
    p.add_argument("--only", nargs="+", default=[], metavar="KEY", help="only these rows")
    p.add_argument("--model", help="default resnet50 on GPUs, cnn on the CPU")
    p.add_argument("--image-size", type=positive_int, help="default 224 for resnet50, else 32")
    p.add_argument(
        "--batch-size", type=positive_int, help="per GPU (default 128 on GPUs, 32 on the CPU)"
    )
    p.add_argument("--amp", choices=("off", "bf16"), default="off", help="bf16 autocast")
    p.add_argument("--channels-last", action="store_true", help="NHWC memory layout")
    p.add_argument(
        "--gpus", type=positive_int, help="GPUs for the parallel rows (default: all visible)"
    )
    p.add_argument("--window", type=positive_int, help="steps per timed window (default 10, CPU 5)")
    p.add_argument(
        "--warmup", type=positive_int, default=2, help="windows dropped first (default 2)"
    )
    p.add_argument("--windows", type=positive_int, help="windows timed (default 5, CPU 3)")
    p.add_argument(
        "--out", help="the JSON record (default runs/bench/<date>-<device>-<precision>.json)"
    )
    p.add_argument(
        "--plot", nargs="+", metavar="JSON", help="only redraw the plot from these records"
    )
    p.add_argument("--plot-out", help="where the plot goes (default: next to the JSON, .png)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if args.plot:
        docs = [render.load(p) for p in args.plot]
        out = Path(args.plot_out or Path(args.plot[0]).with_suffix(".png"))
        render.plot(docs, out)
        print(f"wrote {out}")
        return 0
    from course.runtime import visible_gpus  # here: --plot needs no torch

    visible = visible_gpus()
    for number in args.lessons:
        registry.get(number)  # an unknown lesson: one-line error
    if args.gpus and args.gpus > visible and visible:
        raise ValueError(f"--gpus {args.gpus}: only {visible} GPU(s) visible")
    device = "cuda" if visible else "cpu"
    if device == "cpu":
        print(
            "no GPU visible: the tiny CPU version (small models, 2 gloo ranks); "
            "it checks the code path, not GPU speed"
        )
    model = args.model or ("resnet50" if device == "cuda" else "cnn")
    settings = catalogue.Settings(
        device=device,
        gpus=args.gpus or (visible if device == "cuda" else 2),
        model=model,
        image_size=args.image_size or (224 if model == "resnet50" else 32),
        batch_size=args.batch_size or (128 if device == "cuda" else 32),
        amp=args.amp,
        channels_last=args.channels_last,
    )
    impl = args.impl
    window = args.window or (10 if device == "cuda" else 5)
    rows = catalogue.plan(
        settings,
        [registry.get(n).number for n in args.lessons],
        window,
        args.warmup,
        args.windows or (5 if device == "cuda" else 3),
    )
    for flag, keys in (("--skip", args.skip), ("--only", args.only)):
        unknown = sorted(set(keys) - {row.key for row in rows})
        if unknown:
            known = " ".join(row.key for row in rows)
            raise ValueError(f"{flag} {' '.join(unknown)}: no such row; the rows are {known}")
    rows = [r for r in rows if r.key not in args.skip and (not args.only or r.key in args.only)]
    doc = {
        "kind": render.KIND,
        "settings": settings.__dict__,
        "provenance": provenance.provenance(argv, settings),
        "rows": [],
    }
    planned = [
        {"model": r.model or None, "world_size": r.world,
         "global_batch": r.global_batch(settings)}
        for r in rows
    ]  # fmt: skip
    print(render.title({**doc, "rows": planned}))
    precision = args.amp + ("-cl" if args.channels_last else "")
    default = (
        f"runs/bench/{time.strftime('%Y%m%d-%H%M%S')}-{device}{settings.gpus}-{precision}.json"
    )
    out = Path(args.out or default)
    out.parent.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="course-bench-files-") as scratch:
        folder = launch.image_files(rows, settings, Path(scratch))
        for row in rows:
            print(f"  {row.lesson} {row.label}: {row.steps} steps ...", end="", flush=True)
            tic = time.monotonic()
            limit = 600 if device == "cuda" else 180
            record = launch.measure(row, impl, settings, timeout=limit, files=folder)
            doc["rows"].append(record)
            rate = f"{record['samples_per_s']:,.0f} {row.unit}/s" if record["ok"] else ""
            status = rate or "FAILED"
            print(f" {status} ({time.monotonic() - tic:.0f} s)", flush=True)
            launch.add_ratios(doc["rows"])
            atomic.write_json(doc, out)  # after every row: a cut-short run keeps its rows
    print()
    print(render.table(doc))
    print(render.provenance_line(doc))
    print(f"wrote {out}")
    try:
        image = Path(args.plot_out or out.with_suffix(".png"))
        render.plot([doc], image)
        print(f"wrote {image}")
    except ImportError:
        print(
            "matplotlib is not installed: no plot (pip install matplotlib, then --plot FILE.json)"
        )
    failed = [r for r in doc["rows"] if not r["ok"]]
    for r in failed:
        print(f"\n{r['lesson']} {r['mode']} failed:\n{r['error']}", file=sys.stderr)
    return 1 if failed else 0
