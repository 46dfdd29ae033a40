"""python -m course find-unused: what DDP's find_unused_parameters=True costs a step.

    python -m course find-unused                         # lesson 09's model, 400 steps each way
    python -m course find-unused --steps 1000 --batch-size 64
    python -m course find-unused --device cuda          # one nccl rank on the first GPU

With find_unused_parameters=True, DDP walks the autograd graph from the outputs after
every forward, to find the parameters that will get no gradient in backward. Lesson 09
(exercise 2) fixes its error by removing the dead head instead; this measures what the
flag would have cost. Lesson 09's fixed model (lesson 01's CNN without BatchNorm) is
wrapped twice in one process, with and without the flag, and the two take their steps in
turns, so that both meet the same machine from moment to moment. One gloo rank: the walk
is each rank's own work, the same on any number of ranks. The forward (where the walk
runs) and the whole step (forward and backward) of each are timed; the first --warmup
steps are not counted. It prints the medians, the paired difference (each step with the
flag minus the one beside it without: median and quartiles), and the number of autograd
nodes the walk visits. Timings are CPU times of one thread, and change from run to run.
On a GPU (--device cuda, one nccl rank) the walk is still the CPU's work: the forward is
timed until its kernels are queued (what the CPU spends), the step until the GPU is done.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    from course.options import ArgumentParser, non_negative_int, positive_int

    p = ArgumentParser(prog="python -m course find-unused", description=__doc__.splitlines()[0])
    p.add_argument(
        "--steps", type=at_least_two, default=400, help="timed steps each way (default 400)"
    )
    p.add_argument(
        "--warmup", type=non_negative_int, default=20, help="steps each way not timed (default 20)"
    )
    p.add_argument("--batch-size", type=positive_int, default=32, help="digits a step (default 32)")
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu",
        help="cpu: one gloo rank; cuda: one nccl rank on the first GPU (default cpu)",
    )  # fmt: skip
    return p


def at_least_two(text: str) -> int:
    """--steps: quartiles of the paired differences need two of them."""
    value = int(text) if text.lstrip("-").isdigit() else None
    if value is None or value < 2:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 2, got {text}")
    return value


def graph_nodes(output) -> int:
    """The autograd nodes reachable from `output`: what DDP's walk visits."""
    seen, todo = set(), [output.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return len(seen)


def measure(steps: int, warmup: int, batch_size: int, device: str = "cpu") -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from course import data, models

    torch.set_num_threads(1)
    gpu = device == "cuda"
    if gpu:
        torch.cuda.set_device(0)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    train_set, *_ = data.digits()
    images, labels = train_set.tensors
    x, y = images[:batch_size].to(device), labels[:batch_size].to(device)
    times = {flag: {"forward": [], "step": []} for flag in (False, True)}
    with tempfile.TemporaryDirectory(prefix="course-find-unused-") as folder:
        store = f"file://{Path(folder) / 'store'}"
        backend = "nccl" if gpu else "gloo"
        dist.init_process_group(backend, init_method=store, rank=0, world_size=1)
        try:
            nets = {}
            for flag in (False, True):
                torch.manual_seed(0)
                model = models.SmallCNN(10, 1, norm="none").to(device)
                nets[flag] = DDP(model, find_unused_parameters=flag)
            nodes = graph_nodes(nets[False].module(x))  # the bare module: DDP adds no node
            for step in range(warmup + steps):
                order = (False, True) if step % 2 else (True, False)  # who goes first alternates
                for flag in order:
                    sync()  # the other model's step is over
                    start = time.perf_counter()
                    out = nets[flag](x)
                    forward = time.perf_counter()  # on a GPU: its kernels are queued
                    F.cross_entropy(out, y).backward()
                    sync()
                    end = time.perf_counter()
                    nets[flag].zero_grad(set_to_none=True)
                    if step >= warmup:
                        times[flag]["forward"].append(forward - start)
                        times[flag]["step"].append(end - start)
        finally:
            dist.destroy_process_group()
    where = torch.cuda.get_device_name(0) if gpu else "CPU"
    return {"nodes": nodes, "times": times, "device": device, "where": where}


def report(found: dict, steps: int, warmup: int, batch_size: int) -> str:
    times = found["times"]
    us = 1e6
    cells, diffs = {}, {}
    for part in ("forward", "step"):
        off, on = times[False][part], times[True][part]
        paired = [b - a for a, b in zip(off, on, strict=True)]
        quartiles = statistics.quantiles(paired, n=4)
        cells[part] = (statistics.median(off), statistics.median(on))
        diffs[part] = (statistics.median(paired), quartiles[0], quartiles[2])
    share = diffs["step"][0] / cells["step"][0]
    rank = "one gloo rank" if found["device"] == "cpu" else f"one nccl rank on {found['where']}"
    lines = [
        f"lesson 09's fixed model, {batch_size} digits a step, {rank}, one thread",
        f"{steps} steps each way, in turns, after {warmup} of warm-up",
        *(
            ["forward: until its kernels are queued; step: until the GPU is done"]
            if found["device"] == "cuda"
            else []
        ),
        f"the graph DDP walks after each forward: {found['nodes']} autograd nodes",
        f"{'':28}{'forward':>10}{'step':>10}",
    ]
    for flag in (False, True):
        row = "".join(f"{cells[p][flag] * us:>7.0f} us" for p in ("forward", "step"))
        lines.append(f"{f'find_unused_parameters={flag}':28}{row}")
    row = "".join(f"{diffs[p][0] * us:>7.0f} us" for p in ("forward", "step"))
    lines.append(f"{'True - False (paired)':28}{row}")
    spread = ", ".join(f"{p} {diffs[p][1] * us:.0f} to {diffs[p][2] * us:.0f} us" for p in diffs)
    lines.append(f"quartiles of the paired differences: {spread}")
    lines.append(f"find_unused_parameters=True: {100 * share:+.1f} % a step")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser().error("--device cuda: no GPU is visible (torch.cuda.is_available() is False)")
    found = measure(args.steps, args.warmup, args.batch_size, args.device)
    print(report(found, args.steps, args.warmup, args.batch_size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
