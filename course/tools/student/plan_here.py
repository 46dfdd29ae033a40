"""`python -m course plan --predict/--measure`'s side of this machine: its matmul rate, its
link from a `course bandwidth` record, and lesson 14's composition timed on its ranks
(course/tools/student/planning.py is the command).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

BATCH = 32  # sequences a step, all data-parallel ranks together


def matmul_rate(device: str, threads: int, model: dict) -> float:
    """FLOP/s of one rank's float32 matmuls the size of the shapes' MLP, here."""
    import torch

    torch.set_num_threads(threads)
    tokens = BATCH * model["seq"] // 2
    a = torch.randn(tokens, model["dim"], device=device)
    b = torch.randn(model["dim"], 4 * model["dim"], device=device)
    times = []
    for i in range(8):
        if device == "cuda":
            torch.cuda.synchronize()
        tic = time.perf_counter()
        for _ in range(10):
            a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - tic) if i >= 2 else None
    return 10 * 2 * a.shape[0] * a.shape[1] * b.shape[1] / statistics.median(times)


def link(record: dict | None) -> tuple[float, float]:
    """(latency s, bus bandwidth B/s) from a `course bandwidth` record: its smallest
    message's time, and its best bus bandwidth."""
    if record is None:
        return 0.0, float("inf")
    rows = sorted(record["rows"], key=lambda r: r["bytes"])
    return rows[0]["time_us"] * 1e-6, max(r["busbw_gb_s"] for r in rows) * 1e9


def _bandwidth(path: str | None, backend: str, gpus: int) -> tuple[dict | None, str]:
    if path:
        return json.loads(Path(path).read_text()), path
    if backend == "nccl" and gpus < 2:
        return None, "none (one GPU: nothing to measure; no shape here communicates)"
    from course.tools.student import bandwidth

    rows = bandwidth.measure(backend, 2, [4096, 1 << 22], 2, 5)
    return {"rows": rows}, "measured now on 2 ranks (4 KiB and 4 MiB)"


def machine(plan, backend: str, record: dict | None, world: int, model: dict):
    """This machine as plan.Hardware, for a shape of `world` ranks."""
    from course import ranks

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    share = ranks.cpu_share(world) if backend == "gloo" else 1
    flops = matmul_rate("cuda" if backend == "nccl" else "cpu", share, model)
    if backend == "gloo":
        flops *= min(1.0, cores / (world * share))  # ranks that share cores share their rate
    latency, busbw = link(record)
    return plan.Hardware(memory=float("inf"), flops=flops, efficiency=1.0,
                         gpus_per_node=max(world, 1), intra=busbw, inter=busbw,
                         latency=latency)  # fmt: skip


def _timed_rank(rank, world, backend, port, shape, steps, model, out) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from course import ranks
    from course.measure.scale import Config, build, step

    device = ranks.join_local(rank, world, backend, port)
    torch.set_num_threads(ranks.cpu_share(world))
    pp, dp, tp, m = shape
    config = Config(pp=pp, dp=dp, tp=tp, batch=BATCH, micro_batches=m, **model)
    try:
        mesh = init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        model = build(config, mesh, device.type)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        times = []
        for _ in range(steps + 2):  # 2 warm-up steps
            dist.barrier()
            tic = time.perf_counter()
            step(config, model, mesh)
            optimizer.step()
            optimizer.zero_grad()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - tic)
        every = [None] * world
        dist.all_gather_object(every, times[2:])
        if rank == 0:  # a step ends when its slowest rank's does
            steps_ = [max(t) for t in zip(*every, strict=True)]
            Path(out).write_text(json.dumps([statistics.median(steps_), min(steps_),
                                             max(steps_)]))  # fmt: skip
    finally:
        dist.destroy_process_group()


def _spawn(backend: str, shape, steps: int, model: dict, out: str) -> None:
    import torch.multiprocessing as mp

    from course import ranks

    world = shape[0] * shape[1] * shape[2]
    args = (world, backend, ranks.free_port(), shape, steps, model, out)
    mp.start_processes(_timed_rank, args=args, nprocs=world, start_method="spawn")


def measure(backend: str, shape, steps: int, model: dict, timeout: float = 300) -> list[float]:
    """The shape's step, in seconds: [median, fastest, slowest] over the timed steps (each
    step's slowest rank); its ranks spawned from a child of this process, under a deadline
    that kills them all."""
    from course import launch

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "seconds.json"
        call = f"_spawn({backend!r}, {tuple(shape)!r}, {steps}, {model!r}, {str(out)!r})"
        code = "from course.tools.student.plan_here import _spawn; " + call
        python = os.path.abspath(sys.executable)  # the child runs in another folder
        result = launch.run([python, "-c", code], timeout=timeout, cwd=tmp)
        if out.exists():  # written before the group is torn down: that is all that counts
            return json.loads(out.read_text())
        raise ValueError(f"timing pp {shape[0]}, dp {shape[1]}, tp {shape[2]} failed: "
                         + result.describe(lines=1).splitlines()[0])  # fmt: skip
