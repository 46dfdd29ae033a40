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

The processes run with the caller's environment, not the grader's one-thread
settings, so a lesson that oversubscribes the CPU shows it. Their optimizer
steps are timed from the outside (course/step_clock.py): every window of K
steps ends with a wait for the GPU; the first windows are warm-up (cuDNN
plans, the allocator, NCCL's connections) and are dropped; the row reports
the *median* window. Efficiency is throughput(N) / (N x one device's).

On a machine without GPUs it runs a tiny version (a small CNN, 32x32 images,
2 gloo processes on the CPU): it exercises every code path, and its numbers
say nothing about GPUs.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from course import REPO_ROOT, lessons, procs, step_clock

KIND = "course-bench"


@dataclass
class Row:
    """One way of training, and how long to time it."""

    key: str
    lesson: str
    label: str
    world: int  # GPUs (or CPU ranks) that share the work
    extra: list[str] = field(default_factory=list)
    window: int = 10  # steps per timed window
    warmup: int = 2  # windows dropped at the start
    windows: int = 5  # windows timed
    accumulate: int = 1  # micro-batches per optimizer step (lesson 08's --accumulate)
    speed: tuple[str, bool] | None = None  # (amp, channels_last) instead of the run's
    files: bool = False  # images decoded from files instead of tensors on the GPU
    env: dict[str, str] = field(default_factory=dict)  # extra environment variables
    single: str = "01"  # the one-device row its efficiency divides by
    versus: str | None = None  # the row its "x" ratio divides by

    @property
    def steps(self) -> int:
        return (self.warmup + self.windows) * self.window


@dataclass
class Settings:
    device: str  # "cuda" or "cpu"
    gpus: int  # world size of the parallel rows
    model: str
    image_size: int
    batch_size: int  # per GPU (per rank)
    amp: str
    channels_last: bool

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"


def plan(
    settings: Settings, chosen: list[str], window: int, warmup: int, windows: int
) -> list[Row]:
    """The rows to measure, in table order."""
    n, rows = settings.gpus, []
    timing = dict(window=window, warmup=warmup, windows=windows)
    if "01" in chosen:
        rows.append(Row("01", "01", "one device", 1, ["--device", settings.device], **timing))
    if "02" in chosen and settings.device == "cuda" and n >= 2:
        dp = ["--device", "cuda", "--gpus", str(n)]
        rows.append(Row("02", "02", "DataParallel", n, dp, **timing))
        # With the autotuner, DataParallel re-tunes at every step (lesson 02): a
        # step takes seconds, so a few short windows say all there is to say.
        slow = dict(window=2, warmup=1, windows=3)
        rows.append(
            Row(
                "02-tuned",
                "02",
                "DataParallel, cuDNN autotuner on",
                n,
                [*dp, "--cudnn-benchmark"],
                **slow,
            )
        )
    if "03" in chosen:
        spawn = ["--nproc", str(n), "--backend", settings.backend]
        rows.append(Row("03", "03", "DDP, mp.spawn", n, spawn, **timing))
    if "04" in chosen:
        rows.append(Row("04", "04", "DDP, torchrun", n, ["--backend", settings.backend], **timing))
    if "06" in chosen:  # one training loop, three wrappers: only the gradient sync differs
        spawn = ["--nproc", str(n), "--backend", settings.backend]
        for key, label, extra in (
            ("06-torch", "torch DDP, 06's loop", ["--wrapper", "torch"]),
            ("06-mini", "MiniDDP, 25 MB buckets", ["--wrapper", "mini"]),
            (
                "06-mini-each",
                "MiniDDP, one per tensor",
                ["--wrapper", "mini", "--bucket-cap-mb", "0"],
            ),
        ):
            rows.append(Row(key, "06", label, n, [*spawn, *extra], **timing))
    if "08" in chosen:
        rows += lesson_08_rows(settings, timing)
    return rows


def lesson_08_rows(settings: Settings, timing: dict) -> list[Row]:
    """Lesson 08's script as it stands, then one change at a time against it."""
    n, spawn = settings.gpus, ["--nproc", str(settings.gpus), "--backend", settings.backend]
    fp32 = ("off", False)
    # Decoding is slow: shorter windows; two dropped, for the workers' start (seconds each).
    files = dict(window=5, warmup=2, windows=4)
    variants = [  # key, label, extra flags, Row options
        ("08", "DDP as lesson 03 builds it", [], {}),
        ("08-copy", "gradients copied to buckets", ["--no-bucket-view"], {}),
        ("08-b5", "5 MB buckets", ["--bucket-cap-mb", "5"], {}),
        ("08-b100", "100 MB buckets", ["--bucket-cap-mb", "100"], {}),
        ("08-static", "static_graph", ["--static-graph"], {}),
        ("08-acc2", "no_sync, 2 micro-batches a step", ["--accumulate", "2"], {"accumulate": 2}),
    ]
    rows = []
    if (settings.amp, settings.channels_last) != fp32:  # precision: against fp32 on one device
        one = ["--device", settings.device]
        rows.append(Row("01-fp32", "01", "one device, fp32", 1, one, speed=fp32, **timing))
        variants.append(("08-fp32", "fp32, NCHW", [], {"speed": fp32, "single": "01-fp32"}))
    if settings.device == "cuda":  # the CPU version checks code paths, and has no spare cores
        nccl = {"env": {"NCCL_MAX_NCHANNELS": "4"}}  # fewer SMs busy with communication
        variants.append(("08-ch4", "NCCL_MAX_NCHANNELS=4", [], nccl))
        workers = str(max(1, min(6, (os.cpu_count() or 2) // (2 * n))))
        for key, label, extra in (
            ("08-files0", "image files, 0 workers", ["--num-workers", "0"]),
            ("08-files-pageable", f"image files, {workers} workers, not pinned",
             ["--num-workers", workers, "--no-pin-memory"]),
            ("08-files", f"image files, {workers} workers, pinned", ["--num-workers", workers]),
        ):  # fmt: skip
            variants.append((key, label, extra, {"files": True, **files}))
        variants.append(("08-compile", "torch.compile", ["--compile"], {}))
    for key, label, extra, options in variants:
        row_timing = {**timing, **{k: v for k, v in options.items() if k in timing}}
        other = {k: v for k, v in options.items() if k not in timing}
        rows.append(Row(key, "08", label, n, [*spawn, *extra], **row_timing, **other))
        rows[-1].versus = None if key == "08" else "08"
    return rows


def images_needed(row: Row, settings: Settings) -> int:
    """Training images for one epoch that holds every timed step."""
    return row.steps * settings.batch_size * row.world * row.accumulate


def command(row: Row, impl: Path, settings: Settings, files: str | Path | None = None) -> list[str]:
    """The lesson's own command line for `row`, as its page documents it.

    files: the image folder (course.data.make_image_folder) of a row with files=True."""
    lesson = lessons.get(row.lesson)
    script = lesson.path(impl)
    if not script.is_file():
        raise FileNotFoundError(f"{script}: not found (--impl {impl})")
    # One epoch holds every timed step: no evaluation or epoch boundary inside a window.
    data = str(files) if row.files else f"synthetic:{images_needed(row, settings)}"
    args = ["--data", data, "--image-size", str(settings.image_size)]
    args += ["--model", settings.model, "--batch-size", str(settings.batch_size)]
    args += ["--epochs", "1", "--max-steps", str(row.steps), "--quiet"]
    amp, channels_last = row.speed or (settings.amp, settings.channels_last)
    if amp != "off":  # only when asked: an older lesson without the flags still runs
        args += ["--amp", amp]
    if channels_last:
        args.append("--channels-last")
    if lesson.launcher == "torchrun":
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        return [*launcher, f"--nproc_per_node={row.world}", str(script), *row.extra, *args]
    return [sys.executable, str(script), *row.extra, *args]


def image_files(rows: list[Row], settings: Settings, scratch: Path) -> Path | None:
    """The image folder the rows with files=True read (PNG files, decoded and resized to
    --image-size by DataLoader workers, as a real data set is), or None if none does."""
    needed = max((images_needed(r, settings) for r in rows if r.files), default=0)
    if not needed:
        return None
    from course.data import make_image_folder

    classes = 10
    print(f"  writing {needed:,} PNG images for the image-file rows ...", flush=True)
    size = min(settings.image_size, 112)  # stored smaller, resized up: decoding stays real
    return make_image_folder(
        scratch / "images", classes, -(-needed // classes), size, val_per_class=1
    )


def windows_of(points: list[tuple[int, float]], row: Row, global_batch: int) -> list[float]:
    """Images per second of each timed window, from the step clock's (step, time) points."""
    rates = []
    for (s0, t0), (s1, t1) in zip(points, points[1:], strict=False):
        if s0 >= row.warmup * row.window and t1 > t0:
            rates.append((s1 - s0) * global_batch / (t1 - t0))
    return rates


def measure(
    row: Row,
    impl: Path,
    settings: Settings,
    timeout: float = 300,
    fresh_threads: bool = False,
    files: str | Path | None = None,
) -> dict:
    """Launch `row`'s lesson, time its steps, and return the row's record.

    fresh_threads: drop OMP_NUM_THREADS / MKL_NUM_THREADS from the environment,
    as in a new shell, even when the caller (the grader, say) has set them.
    """
    args = command(row, impl, settings, files)
    global_batch = settings.batch_size * row.world * row.accumulate
    record = {"key": row.key, "lesson": row.lesson, "mode": row.label, "world_size": row.world}
    record.update(global_batch=global_batch, window_steps=row.window, warmup_windows=row.warmup)
    if row.single != "01":
        record["single"] = row.single
    if row.versus:
        record["versus"] = row.versus
    record["command"] = " ".join(
        [*(f"{k}={v}" for k, v in row.env.items()), *(shlex.quote(_short(a)) for a in args)]
    )
    with tempfile.TemporaryDirectory(prefix="course-bench-") as folder:
        env = {
            **row.env,
            step_clock.LOG_ENV: folder,
            step_clock.EVERY_ENV: str(row.window),
        }
        if fresh_threads:
            env.update(OMP_NUM_THREADS=None, MKL_NUM_THREADS=None)
        result = procs.run(args, timeout=timeout, env=env, cwd=folder, one_thread=False)
        points = step_clock.read(folder, rank=0)
    rates = windows_of(points, row, global_batch)
    record["seconds"] = round(result.seconds, 1)
    if not result.ok or len(rates) < row.windows:
        why = (
            result.describe(lines=6)
            if not result.ok
            else f"{len(rates)} of {row.windows} windows timed"
        )
        record.update(ok=False, error=why)
        return record
    median = statistics.median(rates)
    record.update(
        ok=True,
        samples_per_s=round(median, 1),
        step_ms=round(1000 * global_batch / median, 2),
        window_samples_per_s=[round(r, 1) for r in rates],
    )
    return record


def _short(arg: str) -> str:
    """Paths relative to the repository, the interpreter as `python`: a readable command."""
    if arg == sys.executable:
        return "python"
    try:
        return str(Path(arg).resolve().relative_to(REPO_ROOT))
    except (ValueError, OSError):
        return arg


def _run(args: list[str]) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def interconnect(topo: str) -> str:
    """How GPU0 reaches GPU1 in `nvidia-smi topo -m` output (NV18, PIX, SYS...), or ''."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", topo)  # nvidia-smi underlines the header
    rows = [line.split() for line in plain.splitlines() if line.strip()]
    header = next((r for r in rows if r and r[0] == "GPU0" and "GPU1" in r[1:]), None)
    gpu0 = next((r for r in rows if r and r[0] == "GPU0" and r is not header), None)
    if header is None or gpu0 is None:
        return ""
    column = header.index("GPU1")  # the header has no row label: its tokens start at column 1
    return gpu0[column + 1] if column + 1 < len(gpu0) else ""


def provenance(argv: list[str], settings: Settings) -> dict:
    """Where and how the figures were measured: enough to reproduce them."""
    import torch

    info = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m course bench " + shlex.join(argv),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "device": "CPU" if settings.device == "cpu" else "",
        "gpu_count": 0,
        "interconnect": "",
        "cuda": torch.version.cuda or "",
        "nccl": "",
    }
    if settings.device == "cuda":
        names = [
            n.strip()
            for n in _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]).splitlines()
            if n.strip()
        ]
        info["gpu_count"] = len(names) or torch.cuda.device_count()
        info["device"] = names[0] if names else "GPU"
        if settings.gpus >= 2:
            info["interconnect"] = interconnect(_run(["nvidia-smi", "topo", "-m"])) or "unknown"
        if hasattr(torch.cuda, "nccl"):
            version = torch.cuda.nccl.version()
            info["nccl"] = (
                ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
            )
    return info


def add_ratios(rows: list[dict]) -> None:
    """Speed-up and efficiency of every row against one device (lesson 01 at the row's
    precision: its "single" key), in place; lesson 06's rows also get their step time over
    torch DDP's in the same loop, and rows with a "versus" key their throughput over it."""
    rate = {r["key"]: r["samples_per_s"] for r in rows if r["ok"]}
    ddp = next((r["step_ms"] for r in rows if r["key"] == "06-torch" and r["ok"]), None)
    for r in rows:
        base = rate.get(r.get("single", "01"))
        if base and r["ok"]:
            r["speedup"] = round(r["samples_per_s"] / base, 3)
            r["efficiency"] = round(r["samples_per_s"] / (r["world_size"] * base), 3)
        if ddp and r["ok"] and r["lesson"] == "06":
            r["step_vs_ddp"] = round(r["step_ms"] / ddp, 3)
        if r["ok"] and rate.get(r.get("versus")):
            r["vs_base"] = round(r["samples_per_s"] / rate[r["versus"]], 3)


def title(doc: dict) -> str:
    s, p = doc["settings"], doc["provenance"]
    precision = "bf16 autocast" if s["amp"] == "bf16" else "fp32"
    layout = ", channels-last" if s["channels_last"] else ""
    where = (
        f"{s['gpus']}x {p['device']}" if s["device"] == "cuda" else f"CPU, {s['gpus']} gloo ranks"
    )
    size = f"{s['image_size']}x{s['image_size']}"
    return f"{s['model']} {size}, {precision}{layout}, batch {s['batch_size']} per GPU, {where}"


def table(doc: dict, markdown: bool = False) -> str:
    """The rows as a text table (for the terminal) or a Markdown table (for the site)."""
    ranks = "GPUs" if doc["settings"]["device"] == "cuda" else "ranks"
    head = ["lesson", "mode", ranks, "global batch", "img/s", "speed-up", "efficiency", "step ms"]
    versus = any("step_vs_ddp" in r for r in doc["rows"])  # lesson 06: MiniDDP against DDP
    bases = [r["versus"] for r in doc["rows"] if "vs_base" in r]  # lesson 08: against row 08
    lines = []
    for r in doc["rows"]:
        cells = [r["lesson"], r["mode"], str(r["world_size"]), str(r["global_batch"])]
        if not r["ok"]:
            lines.append([*cells, "failed", "", "", ""])
        else:
            ratio = ["", ""]
            if "speedup" in r:
                ratio = [f"{r['speedup']:.2f}", f"{r['efficiency']:.2f}"]
            lines.append([*cells, f"{r['samples_per_s']:,.0f}", *ratio, f"{r['step_ms']:.1f}"])
        if versus:  # right after the mode: the column lesson 06's table is about
            lines[-1].insert(2, f"{r['step_vs_ddp']:.3f}" if "step_vs_ddp" in r else "")
        if bases:
            lines[-1].insert(2, f"{r['vs_base']:.3f}" if "vs_base" in r else "")
    if versus:
        head.insert(2, "step / DDP's")
    if bases:
        head.insert(2, f"x {bases[0]}")
    if markdown:
        rule = "|---|---|" + "--:|" * (len(head) - 2)
        rows = ["| " + " | ".join(cells) + " |" for cells in [head, *lines]]
        return "\n".join([rows[0], rule, *rows[1:]])
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head))]

    def fmt(cells):
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in pairs)

    return "\n".join([fmt(head), *(fmt(cells) for cells in lines)])


def provenance_line(doc: dict) -> str:
    p = doc["provenance"]
    parts = [p["device"]]
    if p.get("gpu_count"):
        parts.append(f"{p['gpu_count']} visible")
    if p.get("interconnect"):
        parts.append(f"GPU0-GPU1 link {p['interconnect']} (nvidia-smi topo -m)")
    parts.append(f"torch {p['torch']}")
    if p.get("cuda"):
        parts.append(f"CUDA {p['cuda']}")
    if p.get("nccl"):
        parts.append(f"NCCL {p['nccl']}")
    parts += [f"{p['cpus']} CPUs", p["date"]]
    return ", ".join(parts)


def plot(docs: list[dict], path: str | Path | None = None, fmt: str = "png") -> bytes:
    """Throughput and scaling efficiency of every row, one colour per record; returns the image.

    matplotlib: the de-facto plotting library, and the one a student already has.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys(r["key"] for doc in docs for r in doc["rows"] if r["ok"]))
    labels = {
        r["key"]: f"{r['lesson']} {r['mode']}".replace(", ", ",\n") for d in docs for r in d["rows"]
    }
    pkeys = [key for key in keys if not key.startswith("01")]  # efficiency: parallel rows
    many = len(keys) > 8  # lesson 08's variants: slanted labels, a wider figure
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(12, 0.8 * len(keys)), 4.6 + many))
    width = 0.8 / max(len(docs), 1)
    offset = (len(docs) - 1) * width / 2  # from a group's first bar to its centre
    for i, doc in enumerate(docs):
        rows = {r["key"]: r for r in doc["rows"] if r["ok"]}
        name = title(doc).split(" per GPU")[0]
        shown = [key for key in keys if key in rows]
        bars = left.bar(
            [keys.index(k) + i * width for k in shown],
            [rows[k]["samples_per_s"] for k in shown],
            width,
            label=name,
        )
        left.bar_label(bars, fmt="{:,.0f}", fontsize=7, padding=2)
        shown = [key for key in pkeys if key in rows and "efficiency" in rows[key]]
        bars = right.bar(
            [pkeys.index(k) + i * width for k in shown],
            [rows[k]["efficiency"] for k in shown],
            width,
        )
        right.bar_label(bars, fmt="{:.2f}", fontsize=7, padding=2)
    slant = dict(rotation=35, ha="right") if many else {}
    left.set_xticks(
        [k + offset for k in range(len(keys))], [labels[k] for k in keys], fontsize=7, **slant
    )
    left.set_ylabel("images / s (median window)")
    left.set_title("Throughput")
    left.margins(y=0.12)
    right.set_xticks(
        [k + offset for k in range(len(pkeys))], [labels[k] for k in pkeys], fontsize=7, **slant
    )
    right.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    right.set_ylim(0, 1.15)
    right.set_ylabel("throughput / (GPUs x one device)")
    right.set_title("Scaling efficiency")
    fig.legend(loc="lower center", ncol=max(len(docs), 1), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=110)
    plt.close(fig)
    image = buffer.getvalue()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(image)
    return image


def plot_html(docs: list[dict]) -> str:
    """The plot as an <img> with the PNG inline, for the course site."""
    data = base64.b64encode(plot(docs)).decode()
    alt = "Throughput and scaling efficiency"
    return f'<img class="course-plot" alt="{alt}" src="data:image/png;base64,{data}">'


def load(path: str | Path) -> dict:
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ValueError(f'{path}: not a `course bench` record (no "kind": "{KIND}")')
    return doc


def parser(prog: str = "python -m course bench") -> argparse.ArgumentParser:
    from course.options import ArgumentParser, positive_int

    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--impl", default="solutions", help="solutions (default), lessons or a folder")
    p.add_argument(
        "--lessons",
        nargs="+",
        default=["01", "02", "03", "04", "06", "08"],
        help="which rows (default: all)",
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
        docs = [load(p) for p in args.plot]
        out = Path(args.plot_out or Path(args.plot[0]).with_suffix(".png"))
        plot(docs, out)
        print(f"wrote {out}")
        return 0
    import torch  # here: --plot needs no torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for number in args.lessons:
        lessons.get(number)  # an unknown lesson: one-line error
    if args.gpus and args.gpus > visible and visible:
        raise ValueError(f"--gpus {args.gpus}: only {visible} GPU(s) visible")
    device = "cuda" if visible else "cpu"
    if device == "cpu":
        print(
            "no GPU visible: the tiny CPU version (small CNN, 2 gloo ranks); "
            "it checks the code path, not GPU speed"
        )
    model = args.model or ("resnet50" if device == "cuda" else "cnn")
    settings = Settings(
        device=device,
        gpus=args.gpus or (visible if device == "cuda" else 2),
        model=model,
        image_size=args.image_size or (224 if model == "resnet50" else 32),
        batch_size=args.batch_size or (128 if device == "cuda" else 32),
        amp=args.amp,
        channels_last=args.channels_last,
    )
    impl = lessons.resolve_impl(args.impl)
    window = args.window or (10 if device == "cuda" else 5)
    rows = plan(
        settings,
        [lessons.get(n).number for n in args.lessons],
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
        "kind": KIND,
        "settings": settings.__dict__,
        "provenance": provenance(argv, settings),
        "rows": [],
    }
    print(title(doc))
    precision = args.amp + ("-cl" if args.channels_last else "")
    default = (
        f"runs/bench/{time.strftime('%Y%m%d-%H%M%S')}-{device}{settings.gpus}-{precision}.json"
    )
    out = Path(args.out or default)
    out.parent.mkdir(parents=True, exist_ok=True)
    from course.files import write_json_atomic

    with tempfile.TemporaryDirectory(prefix="course-bench-files-") as scratch:
        folder = image_files(rows, settings, Path(scratch))
        for row in rows:
            print(f"  {row.lesson} {row.label}: {row.steps} steps ...", end="", flush=True)
            tic = time.monotonic()
            limit = 600 if device == "cuda" else 180
            record = measure(row, impl, settings, timeout=limit, files=folder)
            doc["rows"].append(record)
            status = f"{record['samples_per_s']:,.0f} img/s" if record["ok"] else "FAILED"
            print(f" {status} ({time.monotonic() - tic:.0f} s)", flush=True)
            add_ratios(doc["rows"])
            write_json_atomic(doc, out)  # after every row: a cut-short run keeps its rows
    print()
    print(table(doc))
    print(provenance_line(doc))
    print(f"wrote {out}")
    try:
        image = Path(args.plot_out or out.with_suffix(".png"))
        plot([doc], image)
        print(f"wrote {image}")
    except ImportError:
        print(
            "matplotlib is not installed: no plot (pip install matplotlib, then --plot FILE.json)"
        )
    failed = [r for r in doc["rows"] if not r["ok"]]
    for r in failed:
        print(f"\n{r['lesson']} {r['mode']} failed:\n{r['error']}", file=sys.stderr)
    return 1 if failed else 0
