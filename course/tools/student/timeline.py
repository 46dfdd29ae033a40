"""python -m course timeline: when DDP's all-reduces run, against the backward pass.

    python -m course timeline --out docs/results/overlap/cpu_gloo.json   # 2 gloo ranks
    python -m course timeline --backend nccl --out runs/overlap.json     # 2 GPUs

Two ranks train a stack of equal Linear layers (so each layer's backward costs the
same) with torch's DistributedDataParallel and small buckets (--bucket-cap-mb), and
torch.profiler records one step on rank 0. The record keeps, from the trace, the
backward's autograd functions (on the thread that runs backward) and the all-reduces
(gloo's `gloo:all_reduce` on its own threads), each with its start and length, and the
provenance; on GPUs, the kernels those functions launched and NCCL's kernels, when the
GPU ran them. It is itself a Chrome trace: Perfetto
(ui.perfetto.dev) or chrome://tracing open it. `render` draws it, and `overlap` says
how much of the all-reduce time ran while backward was still running: the overlap
lesson 06 builds by hand and lesson 08 tunes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

from course import __version__, atomic

KIND = "course-timeline"
BACKWARD, ALL_REDUCE = "backward", "all-reduce"


def _worker(rank: int, port: int, args, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from course import ranks

    device = ranks.join_local(rank, 2, args.backend, port)
    torch.set_num_threads(1)  # each rank its share of a small machine
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[_layer(args.width) for _ in range(args.layers)]).to(device)
    ids = [device.index] if device.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=ids, bucket_cap_mb=args.bucket_cap_mb
    )
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(args.batch, args.width, device=device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        ddp(x).square().mean().backward()
        optimizer.step()

    for _ in range(3):  # warm-up: DDP's first steps rebuild its buckets
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ids else [])
    with profile(activities=activities) as prof:
        step()
        if ids:
            torch.cuda.synchronize()
    if rank == 0:
        prof.export_chrome_trace(out)
    dist.barrier()
    dist.destroy_process_group()


def _layer(width: int):
    import torch

    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU())


def reduce_trace(trace: dict) -> list[dict]:
    """The backward and the all-reduces of one profiled step, as Chrome trace events
    (times in microseconds, from the first of them).

    On the CPU (gloo) the backward lane is the autograd functions, on the thread that runs
    backward. On GPUs those only *launch* kernels, and the CPU runs ahead of the GPU: the
    lane is then the GPU kernels that the backward's functions launched (matched through
    the profiler's correlation ids), each named after its function, and the all-reduces are
    NCCL's kernels. Both lanes then show when the GPU did the work."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    backward = [e for e in events if e["name"].startswith("autograd::engine::evaluate_function")]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if kernels:
        reduces = [e for e in kernels if "nccl" in e["name"].lower() and "AllReduce" in e["name"]]
        backward = _kernels_launched_by(backward, events, kernels)
    else:
        reduces = [e for e in events if e["name"] == "gloo:all_reduce"]
    if not backward or not reduces:
        raise ValueError("the trace holds no backward functions or no all-reduces")
    start = min(float(e["ts"]) for e in backward + reduces)
    kept = []
    for lane, chosen in ((BACKWARD, backward), (ALL_REDUCE, reduces)):
        for e in chosen:
            name = e["name"].removeprefix("autograd::engine::evaluate_function: ")
            kept.append(
                {"name": name, "cat": lane, "ph": "X", "pid": 0, "tid": lane,
                 "ts": round(float(e["ts"]) - start, 1), "dur": round(float(e["dur"]), 1)}
            )  # fmt: skip
    return sorted(kept, key=lambda e: e["ts"])


def _kernels_launched_by(functions: list[dict], events: list[dict], kernels: list[dict]):
    """The non-NCCL kernels whose launch (a CUDA runtime call, matched to the kernel by its
    correlation id) happened inside one of `functions` on its thread, named after it."""
    spans = [(float(f["ts"]), float(f["ts"]) + float(f["dur"]), f["tid"], f) for f in functions]
    caller = {}
    for launch in events:
        if (
            launch.get("cat") not in ("cuda_runtime", "cuda_driver")
            or "Launch" not in launch["name"]
        ):
            continue
        ts = float(launch["ts"])
        inside = [f for begin, end, tid, f in spans if begin <= ts <= end and tid == launch["tid"]]
        if inside:  # the innermost: the function that launched it
            caller[(launch.get("args") or {}).get("correlation")] = min(
                inside, key=lambda f: float(f["dur"])
            )
    found = []
    for kernel in kernels:
        function = caller.get((kernel.get("args") or {}).get("correlation"))
        if function is not None and "nccl" not in kernel["name"].lower():
            found.append({**kernel, "name": function["name"]})
    return found


def overlap(events: list[dict]) -> dict:
    """How much all-reduce time ran before the backward's last function ended."""
    backward = [e for e in events if e["cat"] == BACKWARD]
    end = max(e["ts"] + e["dur"] for e in backward)
    reduces = [e for e in events if e["cat"] == ALL_REDUCE]
    total = sum(e["dur"] for e in reduces)
    hidden = sum(max(0.0, min(e["ts"] + e["dur"], end) - e["ts"]) for e in reduces)
    return {
        "backward_ms": round((end - min(e["ts"] for e in backward)) / 1e3, 3),
        "all_reduce_ms": round(total / 1e3, 3),
        "all_reduces": len(reduces),
        "during_backward_ms": round(hidden / 1e3, 3),
        "during_backward": round(hidden / total, 3) if total else 0.0,
    }


def render(doc: dict, path: str | Path | None = None, fmt: str = "png") -> bytes:
    """The two lanes of the record as a timeline figure (transparent, 10 pt text)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course.tools.student.bench.render import TEXT_PT, WIDTH_IN  # a page's legible plot

    events = doc["traceEvents"]
    lanes = [ALL_REDUCE, BACKWARD]
    colours = {BACKWARD: "tab:blue", ALL_REDUCE: "tab:orange"}
    with plt.rc_context({"font.size": TEXT_PT, "svg.fonttype": "none"}):
        fig, ax = plt.subplots(figsize=(WIDTH_IN, 2.8))
        for row, lane in enumerate(lanes):
            spans = [(e["ts"] / 1e3, e["dur"] / 1e3) for e in events if e["cat"] == lane]
            ax.broken_barh(spans, (row - 0.35, 0.7), facecolors=colours[lane], edgecolor="white")
        end = max(e["ts"] + e["dur"] for e in events if e["cat"] == BACKWARD) / 1e3
        ax.axvline(end, color="grey", linestyle="--", linewidth=0.8)
        ax.annotate("backward ends", (end, 1.45), ha="center", color="grey")
        gpu = doc.get("settings", {}).get("backend") == "nccl"
        lower = "backward\n(GPU kernels)" if gpu else "backward\n(autograd)"
        ax.set_yticks(range(len(lanes)), ["all-reduce\n(communication)", lower])
        ax.set_ylim(-0.6, 1.7)
        ax.set_xlabel("time within one training step (ms)")
        stats = doc["overlap"]
        ax.set_title(
            f"{stats['all_reduces']} all-reduces; {stats['during_backward']:.0%} of their "
            f"time runs while backward still runs ({doc['provenance']['device']})"
        )
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt, dpi=200, transparent=True)
        plt.close(fig)
    image = buffer.getvalue()
    if path is not None:
        Path(path).write_bytes(image)
    return image


def load(path: str | Path) -> dict:
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ValueError(f'{path}: not a `course timeline` record (no "kind": "{KIND}")')
    return doc


def provenance(argv: list[str], backend: str) -> dict:
    import torch

    info = {
        "device": "CPU, 2 gloo ranks" if backend == "gloo" else "",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpus": __import__("os").cpu_count(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m course timeline " + " ".join(argv),
        "course": __version__,
    }
    if backend == "nccl":
        info["device"] = f"{torch.cuda.get_device_name(0)} x2, nccl"
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return info


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m course timeline", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--out", required=True, help="the record (JSON, a Chrome trace); a .png beside it"
    )
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--layers", type=int, default=8, help="equal Linear layers (default 8)")
    p.add_argument("--width", type=int, default=512, help="their width (default 512)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--bucket-cap-mb", type=float, default=1.0, help="DDP's buckets (default 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    import tempfile

    import torch.multiprocessing as mp

    from course import ranks  # torch and torch._dynamo: not for render() and load()

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    ranks.backend_and_world_size(args.backend, 2)  # nccl without 2 GPUs: one line
    with tempfile.TemporaryDirectory(prefix="course-timeline-") as folder:
        trace = str(Path(folder) / "trace.json")
        mp.spawn(_worker, args=(ranks.free_port(), args, trace), nprocs=2)
        events = reduce_trace(json.loads(Path(trace).read_text()))
    doc = {
        "kind": KIND,
        "provenance": provenance(argv, args.backend),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "overlap": overlap(events),
        "traceEvents": events,
        "displayTimeUnit": "ms",
    }
    out = Path(args.out)
    atomic.write_json(doc, out, indent=1)
    render(doc, out.with_suffix(".png"))
    stats = doc["overlap"]
    print(
        f"{stats['all_reduces']} all-reduces, {stats['all_reduce_ms']} ms; "
        f"{stats['during_backward']:.0%} of it during the {stats['backward_ms']} ms of backward"
    )
    print(f"wrote {out} (open it in ui.perfetto.dev) and {out.with_suffix('.png')}")
    return 0
