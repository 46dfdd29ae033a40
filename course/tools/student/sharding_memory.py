"""python -m course memory: lesson 10's ways of sharding, their memory predicted and counted.

    python -m course memory                              # 2 gloo ranks on the CPU
    python -m course memory --nproc 4 --dim 512 --depth 8 --out runs/memory.json
    python -m course memory --impl lessons               # with your zero.py and fsdp.py

Each rank builds the same TinyLM (course/models.py), wraps it five ways in turn (DDP, a
ShardedOptimizer of zero.py, PyTorch's ZeroRedundancyOptimizer, a MiniFSDP of fsdp.py,
FSDP2's fully_shard on every block and the root), takes one AdamW step on its own batch,
and counts the bytes it keeps: its parameters, their gradients, and the optimizer's state
(every tensor reachable from the optimizer that is neither a parameter nor a gradient).
Before that, the formula of the page predicts them, from P (parameters), P1 (1-D ones,
which MiniFSDP replicates) and N (ranks), fp32 weights and two fp32 Adam moments:

    DDP 16 P;  ZeRO-1 (both) 8 P + 8 P / N;  MiniFSDP 16 P2 / N + 16 P1;  FSDP2 16 P / N

On GPUs (nccl) it also reads torch.cuda.max_memory_allocated after the step, which adds
activations, gathered weights, DDP's buckets and the allocator's rounding. Rank 0 prints
one row per way, counted against predicted, and writes them to --out as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from course import REPO_ROOT

WAYS = ("DDP", "ZeRO-1 (yours)", "ZeroRedundancyOptimizer", "MiniFSDP", "FSDP2")


def parser() -> argparse.ArgumentParser:
    from course.options import ArgumentParser, positive_int

    p = ArgumentParser(prog="python -m course memory", description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=positive_int, help="ranks (default: GPUs, or 2)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl if CUDA works")
    p.add_argument("--dim", type=positive_int, default=256, help="model width (256)")
    p.add_argument("--depth", type=positive_int, default=4, help="blocks (4)")
    p.add_argument("--impl", default="solutions", help="where zero.py and fsdp.py are")
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    return p


def predict(p_all: int, p_1d: int, world: int) -> dict[str, float]:
    """Bytes per rank of parameters, gradients and AdamW's state, by the page's formula."""
    p_2d = p_all - p_1d
    zero1 = 8 * p_all + 8 * p_all / world
    return {
        "DDP": 16 * p_all,
        "ZeRO-1 (yours)": zero1,
        "ZeroRedundancyOptimizer": zero1,
        "MiniFSDP": 16 * p_2d / world + 16 * p_1d,
        "FSDP2": 16 * p_all / world,
    }


def local(tensor):
    """A DTensor's shard on this rank; any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def held(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (a DTensor counts its local shard)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        storage = local(t).untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def reachable(root, skip: set[int]) -> list:
    """Every tensor reachable from `root` through containers, modules and the attributes
    of objects, except the storages in `skip` (parameters and gradients)."""
    import torch

    found, stack, visited = [], [root], set()
    while stack:
        obj = stack.pop()
        if id(obj) in visited:
            continue
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor):
            mine = local(obj)
            if mine.untyped_storage().data_ptr() not in skip:
                found.append(mine)
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            stack.extend(vars(obj).values())
    return found


def load(impl: str, name: str):
    path = Path(impl) if Path(impl).is_absolute() else REPO_ROOT / impl
    path = path / "10_sharding" / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (--impl names the lessons' folder)")
    spec = importlib.util.spec_from_file_location(f"memory_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    return module


def wrap(way: str, model, device, impl):
    """(the module to call, its optimizer, the parameters it keeps) for one way."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    adamw = dict(lr=1e-3)
    if way == "DDP":
        ddp = DDP(model, device_ids=[device] if device.type == "cuda" else None)
        return ddp, torch.optim.AdamW(model.parameters(), **adamw), list(model.parameters())
    if way == "ZeRO-1 (yours)":
        ddp = DDP(model, device_ids=[device] if device.type == "cuda" else None)
        opt = load(impl, "zero.py").ShardedOptimizer(model.parameters(), torch.optim.AdamW, **adamw)
        return ddp, opt, list(model.parameters())
    if way == "ZeroRedundancyOptimizer":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        ddp = DDP(model, device_ids=[device] if device.type == "cuda" else None)
        opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, **adamw)
        return ddp, opt, list(model.parameters())
    if way == "MiniFSDP":
        fsdp = load(impl, "fsdp.py").MiniFSDP(model)
        return fsdp, torch.optim.AdamW(fsdp.parameters(), **adamw), list(fsdp.parameters())
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), **adamw), list(model.parameters())


def measure(rank: int, world: int, device, args) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from course import data, models

    rows = []
    for way in WAYS:
        torch.manual_seed(0)
        model = models.TinyLM(64, args.dim, args.depth).to(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        module, optimizer, params = wrap(way, model, device, args.impl)
        tokens, targets = (t.to(device) for t in data.lookup_tokens(1, rank, 16, 64))
        F.cross_entropy(module(tokens).flatten(0, 1), targets.flatten()).backward()
        if hasattr(module, "finish_gradient_synchronization"):
            module.finish_gradient_synchronization()
        optimizer.step()
        grads = [p.grad for p in params]
        skip = {local(t).untyped_storage().data_ptr() for t in [*params, *grads] if t is not None}
        row = {"way": way, "params": held(params), "grads": held(grads)}
        row["state"] = held(reachable(optimizer, skip))
        if device.type == "cuda":
            row["peak_allocated"] = torch.cuda.max_memory_allocated(device)
        rows.append(row)
        del module, optimizer, params, grads, model
    return rows


def worker(rank: int, world: int, backend: str, port: int, args, out: str) -> None:
    import torch
    import torch.distributed as dist

    from course import models, ranks

    torch.set_num_threads(ranks.cpu_share(world))
    device = ranks.join_local(rank, world, backend, port)
    try:
        rows = measure(rank, world, device, args)
        everyone = [None] * world
        dist.all_gather_object(everyone, rows)
        if rank == 0:
            model = models.TinyLM(64, args.dim, args.depth)
            p_all = sum(p.numel() for p in model.parameters())
            p_1d = sum(p.numel() for p in model.parameters() if p.dim() < 2)
            Path(out).write_text(json.dumps({
                "world": world, "backend": backend, "dim": args.dim, "depth": args.depth,
                "parameters": p_all, "parameters_1d": p_1d,
                "predicted": predict(p_all, p_1d, world), "ranks": everyone,
            }))  # fmt: skip
        dist.barrier()
    finally:
        dist.destroy_process_group()


def table(found: dict) -> str:
    world, p_all = found["world"], found["parameters"]
    lines = [
        f"TinyLM dim {found['dim']}, depth {found['depth']}: {p_all:,} parameters "
        f"({found['parameters_1d']:,} in 1-D tensors); {world} {found['backend']} ranks; "
        "AdamW, fp32",
        f"{'way':<24} {'predicted':>12} {'counted':>12} {'ratio':>6}   largest rank's "
        "params + grads + state, bytes",
    ]
    for i, way in enumerate(WAYS):
        rows = [ranks[i] for ranks in found["ranks"]]
        counted = max(r["params"] + r["grads"] + r["state"] for r in rows)
        predicted = found["predicted"][way]
        peak = max(r.get("peak_allocated", 0) for r in rows)
        extra = f"   peak allocated {peak:,}" if peak else ""
        lines.append(f"{way:<24} {predicted:>12,.0f} {counted:>12,} {counted / predicted:>6.2f}"
                     f"{extra}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import tempfile

    import torch.multiprocessing as mp

    from course import ranks

    args = parser().parse_args(argv)
    backend, world = ranks.backend_and_world_size(args.backend, args.nproc)
    for name in ("zero.py", "fsdp.py"):  # a wrong --impl: one line, before any rank starts
        path = Path(args.impl) if Path(args.impl).is_absolute() else REPO_ROOT / args.impl
        if not (path / "10_sharding" / name).is_file():
            raise FileNotFoundError(f"{path / '10_sharding' / name}: no such file (--impl)")
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "memory.json")
        mp.spawn(worker, args=(world, backend, ranks.free_port(), args, out), nprocs=world)
        found = json.loads(Path(out).read_text())
    print(table(found))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(found, indent=1) + "\n")
    return 0
