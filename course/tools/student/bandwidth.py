"""python -m course bandwidth: how fast dist.all_reduce moves data, by message size.

    python -m course bandwidth                        # 2 gloo ranks on the CPU
    python -m course bandwidth --backend nccl         # one rank per visible GPU
    python -m course bandwidth --out docs/results/05_allreduce/cpu-gloo.json

For each size every rank all-reduces a float32 tensor of that many bytes,
--warmup times untimed and then --iters times, each one timed between a
barrier and the end of the call (on GPUs after torch.cuda.synchronize); the
median is kept. Two rates, as NVIDIA's nccl-tests report them:

    algorithm bandwidth  bytes / time
    bus bandwidth        algorithm bandwidth x 2 (n - 1) / n: what each link
                         carries in a ring all-reduce (lesson 05), comparable
                         with the link's rated speed whatever the number of ranks

Lesson 05's page shows the records this command writes.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from course import __version__

KIND = "course-bandwidth"
DEFAULT_SIZES = [1 << k for k in range(12, 25, 2)]  # 4 KiB .. 16 MiB


def _rank(rank, world, backend, port, sizes, warmup, iters, out) -> None:
    import torch
    import torch.distributed as dist

    from course import ranks

    device = ranks.join_local(rank, world, backend, port)
    torch.set_num_threads(ranks.cpu_share(world))
    try:
        seconds = {}
        for size in sizes:
            tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
            times = []
            for i in range(warmup + iters):
                dist.barrier()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                tic = time.perf_counter()
                dist.all_reduce(tensor)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if i >= warmup:
                    times.append(time.perf_counter() - tic)
            seconds[size] = statistics.median(times)
        slowest = [None] * world
        dist.all_gather_object(slowest, seconds)  # a collective ends when its last rank does
        if rank == 0:
            worst = {s: max(r[s] for r in slowest) for s in sizes}
            Path(out).write_text(json.dumps({str(s): t for s, t in worst.items()}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def measure(backend: str, world: int, sizes: list[int], warmup: int, iters: int) -> list[dict]:
    import torch.multiprocessing as mp

    from course import ranks

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "seconds.json"
        args = (world, backend, ranks.free_port(), sizes, warmup, iters, str(out))
        mp.spawn(_rank, args=args, nprocs=world)
        seconds = {int(k): v for k, v in json.loads(out.read_text()).items()}
    rows = []
    for size in sizes:
        algbw = size / seconds[size] / 1e9
        rows.append(
            {
                "bytes": size,
                "time_us": seconds[size] * 1e6,
                "algbw_gb_s": algbw,
                "busbw_gb_s": algbw * 2 * (world - 1) / world,
            }
        )
    return rows


def provenance(argv: list[str], backend: str, world: int) -> dict:
    import torch

    from course.tools.student.bench import provenance as bench_provenance

    info = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m course bandwidth " + shlex.join(argv),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0,
        "device": "CPU",
        "gpu_count": 0,
        "interconnect": "",
        "cuda": torch.version.cuda or "",
        "nccl": "",
        "backend": backend,
        "ranks": world,
        "course": __version__,
    }
    if backend == "nccl":
        info["device"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
        if world >= 2:
            info["interconnect"] = bench_provenance.interconnect(
                bench_provenance._run(["nvidia-smi", "topo", "-m"])
            )
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return info


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


# A message is latency-bound while it costs at most this many times the smallest one's
# time: its size hardly matters yet, the fixed cost of starting the collective does.
LATENCY_BOUND = 2.0


def figures(doc: dict) -> dict[str, str]:
    """What a page quotes from a record ([[bandwidth:FOLDER/FILE:NAME]]): smallest_time,
    the smallest message's median time; latency_bound, the largest size that costs at
    most LATENCY_BOUND times that (up to there, latency dominates); peak_busbw, the
    largest bus bandwidth measured."""
    rows = sorted(doc["rows"], key=lambda r: r["bytes"])
    base = rows[0]["time_us"]
    bound = rows[0]["bytes"]
    for r in rows:
        if r["time_us"] > LATENCY_BOUND * base:
            break
        bound = r["bytes"]
    peak = max(r["busbw_gb_s"] for r in rows)
    return {"smallest_time": f"{base:.0f} us", "latency_bound": _size(bound),
            "peak_busbw": f"{peak:.0f} GB/s" if peak >= 10 else f"{peak:.2f} GB/s"}  # fmt: skip


def table(doc: dict, markdown: bool = False, limit_gb_s: float | None = None) -> str:
    """The rows; with `limit_gb_s` (a link's rated speed, per direction), the bus
    bandwidth's share of it too."""
    head = ["size", "time (us, median)", "algbw (GB/s)", "busbw (GB/s)"]
    head += [f"busbw / {limit_gb_s:g} GB/s"] if limit_gb_s else []
    rows = [
        [_size(r["bytes"]), f"{r['time_us']:,.1f}", f"{r['algbw_gb_s']:.3f}"]
        + [f"{r['busbw_gb_s']:.3f}"]
        + ([f"{r['busbw_gb_s'] / limit_gb_s:.0%}"] if limit_gb_s else [])
        for r in doc["rows"]
    ]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    fmt = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    return "\n".join([fmt(head), *map(fmt, rows)])


def provenance_line(doc: dict) -> str:
    p = doc["provenance"]
    parts = [f"{p['ranks']} {p['backend']} ranks on {p['device']}"]
    if p.get("interconnect"):
        parts.append(f"GPU0-GPU1 link {p['interconnect']}")
    parts.append(f"torch {p['torch']}")
    parts += [f"NCCL {p['nccl']}"] if p.get("nccl") else []
    parts += [f"{p['cpus']} CPUs", p["date"]]
    return ", ".join(parts)


def parser():
    from course.options import ArgumentParser, positive_int

    p = ArgumentParser(prog="python -m course bandwidth", description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl if CUDA works")
    p.add_argument("--nproc", type=positive_int, help="ranks (default: GPUs, or 2 with gloo)")
    p.add_argument("--sizes", type=positive_int, nargs="+", help="bytes (default 4 KiB..16 MiB)")
    p.add_argument("--warmup", type=positive_int, default=3)
    p.add_argument("--iters", type=positive_int, default=10)
    p.add_argument("--out", help="write the JSON record here")
    return p


def main(argv: list[str] | None = None) -> int:
    from course import ranks

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    backend, world = ranks.backend_and_world_size(args.backend, args.nproc)
    if world < 2:
        raise ValueError(f"--nproc {world}: an all-reduce needs at least 2 ranks")
    sizes = sorted(args.sizes or DEFAULT_SIZES)
    doc = {
        "kind": KIND,
        "rows": measure(backend, world, sizes, args.warmup, args.iters),
        "provenance": provenance(argv, backend, world),
    }
    print(f"dist.all_reduce, {provenance_line(doc)}")
    print(table(doc))
    if args.out:
        from course import atomic

        print(f"wrote {atomic.write_json(doc, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
