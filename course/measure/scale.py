"""The grading kit's program at scale: one rank of a world of 64 to 1024, counted in one process.

PyTorch's `fake` process-group backend (torch.testing._internal.distributed.fake_pg) lets
one process join a world of any size as any rank: every collective returns at once, with
no data moved. FSDP2, DTensor's tensor parallelism and point-to-point sends run on it
unchanged, so the program that a 1024-GPU job would run can be built and stepped here, as
its rank r, and what that rank holds and sends counted:

    with fake_world(1024, rank=1000):
        found = count(Config(pp=4, dp=64, tp=4, depth=7, dim=96, ...))
    found["held"]["params"], found["traffic"][("dp", "reduce_scatter")]

The model is lesson 14's (course.models.StagedLM), composed as lesson 14 composes it: cut
into pp stages (depth * s // pp blocks before stage s: unequal when pp does not divide
depth), each block's MLP split over tp (up by its rows, down by its columns), then
sharded over dp by FSDP2 (each tensor's first dimension padded to a multiple of dp). The
pipeline is the grader's own loop of sends and receives (GPipe or 1F1B); PyTorch's
schedules fail on the fake group under torch 2.14 (stage 0's backward receives no
gradient). Gradients are reduced once a step, at the last micro-batch.

Counted on the rank (bytes): its parameters, gradients and AdamW state (the local shards),
the activations autograd keeps at the forward's high-water mark (course.memory's meter,
FSDP's gathered weights not counted: they are parameters), and every collective by mesh
axis and kind (the grading kit's recorder), summed over one step.

And the rank's whole peak (`tracked_peak`): every tensor alive at the step's worst moment,
FSDP's gathered weights and whole gradients, the loss and the backward's temporaries
included, as torch's own MemTracker (torch.distributed._tools.mem_tracker) sees it, the
tracker torchtitan's scripts/estimate/estimation.py uses.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

AXES = ("pp", "dp", "tp")


@dataclass(frozen=True)
class Config:
    pp: int
    dp: int
    tp: int
    depth: int = 4
    dim: int = 64
    vocab: int = 64
    seq: int = 16
    batch: int = 0  # sequences a step, all data-parallel ranks together (0: 4 per dp rank)
    micro_batches: int = 1
    schedule: str = "1f1b"  # or "gpipe"
    hidden: int = 0  # each block's MLP width (0: 4 x dim)

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def rows(self) -> int:
        """Sequences in one micro-batch on one data-parallel rank."""
        return (self.batch or 4 * self.dp) // self.dp // self.micro_batches


# --8<-- [start:fake]
@contextlib.contextmanager
def fake_world(world: int, rank: int):
    """This process as rank `rank` of `world` on the fake backend, for the block's length."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


# --8<-- [end:fake]


def cuts(depth: int, stages: int) -> list[int]:
    """The first block of each stage, and depth: stage s runs blocks cuts[s] to cuts[s+1]-1."""
    return [depth * s // stages for s in range(stages + 1)]


def build(config: Config, mesh, device: str = "cpu"):
    """This rank's stage of StagedLM, split over tp and sharded over dp, on the CPU."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from course import models

    stage, first = mesh["pp"].get_local_rank(), cuts(config.depth, config.pp)
    with torch.device("meta"):  # 1024 ranks' worth of weights is never allocated whole
        model = models.StagedLM(config.vocab, config.dim, config.depth, config.hidden)
    for key in list(model.blocks):
        if not first[stage] <= int(key) < first[stage + 1]:
            del model.blocks[key]
    if stage > 0:
        model.embed = None
    if stage < config.pp - 1:
        model.norm = model.head = None
    plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    for block in model.blocks.values():
        parallelize_module(block, mesh["tp"], plan)
        fully_shard(block, mesh=mesh["dp"], reshard_after_forward=False)
    fully_shard(model, mesh=mesh["dp"], reshard_after_forward=False)
    model.to_empty(device=device)
    for p in model.parameters():
        torch.nn.init.normal_(_local(p), std=0.02)
    return model


def _local(tensor):
    return getattr(tensor, "_local_tensor", tensor)


def _enter(meter, block) -> None:
    """Count what the block saves, not its weights: after FSDP's pre-forward hook (registered
    first, so run first) its parameters are the gathered ones, whose local tensors (not
    themselves Parameters under TP) autograd saves for the matmuls."""
    meter.skip.update(_local(p).untyped_storage().data_ptr() for p in block.parameters())
    meter.__enter__()


def _call(method, *args) -> None:
    method(*args)  # a hook that returns something replaces the module's input or output


def _order(config: Config, stage: int) -> list[tuple[str, int]]:
    """The stage's forwards ("F", i) and backwards ("B", i), in its schedule's order."""
    m = config.micro_batches
    if config.schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(config.pp - stage - 1, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(warmup, m):
        order += [("F", i), ("B", i - warmup)]
    return order + [("B", i) for i in range(m - warmup, m)]


def step(config: Config, model, mesh) -> None:
    """One step's forwards and backwards on this rank's stage (no optimizer step), in its
    schedule's order: activations to the next stage and gradients to the previous one by
    send and receive over the pp group."""
    stage = mesh["pp"].get_local_rank()
    first, last = stage == 0, stage == config.pp - 1
    group, rows, size = mesh["pp"].get_group(), config.rows, (config.rows, config.seq, config.dim)
    device = _local(next(model.parameters())).device
    alive: dict[int, tuple] = {}
    sent = []  # isend: gloo's blocking send of a large message waits for its receive, and
    # 1F1B's stage 0 sends micro-batch 1 while stage 1 sends micro-batch 0's gradient back
    for kind, i in _order(config, stage):
        if kind == "F":
            if first:
                x = torch.randint(0, config.vocab, (rows, config.seq), device=device)
            else:
                x = torch.empty(size, device=device)
                dist.recv(x, group=group, group_src=stage - 1)
                x.requires_grad_()
            y = model(x)
            if last:
                targets = torch.zeros(rows * config.seq, dtype=torch.long, device=device)
                y = F.cross_entropy(y.flatten(0, 1), targets) / config.micro_batches
            else:
                sent.append(dist.isend(y.detach(), group=group, group_dst=stage + 1))
            alive[i] = (x, y)
        else:
            x, y = alive.pop(i)
            end = i == config.micro_batches - 1  # reduce, and free the gathered weights, once
            model.set_requires_gradient_sync(end, recurse=True)
            model.set_reshard_after_backward(end, recurse=True)
            if last:
                y.backward()
            else:
                grad = torch.empty(size, device=device)
                dist.recv(grad, group=group, group_src=stage + 1)
                y.backward(grad)
            if not first:
                sent.append(dist.isend(x.grad, group=group, group_dst=stage - 1))
    for work in sent:
        work.wait()


def count(config: Config) -> dict:
    """One training step as this process's rank (inside fake_world): bytes held, and
    bytes sent by axis and kind."""
    from torch.distributed.device_mesh import init_device_mesh

    from course.measure.comm import CommRecorder
    from course.memory import SavedTensors

    shape = (config.pp, config.dp, config.tp)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=AXES)
    stage = mesh["pp"].get_local_rank()
    model = build(config, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    held = {"params": sum(_local(p).nbytes for p in model.parameters())}
    recorder, meter = CommRecorder(), SavedTensors(parameters=False)
    for block in model.blocks.values():  # the blocks' activations: what the pipeline multiplies
        block.register_forward_pre_hook(lambda b, _: _enter(meter, b))
        block.register_forward_hook(lambda *_: _call(meter.__exit__, None, None, None))
    with recorder:
        step(config, model, mesh)
        held["grads"] = sum(_local(p.grad).nbytes for p in model.parameters())
        optimizer.step()
    held["activations"] = meter.peak
    held["optimizer"] = sum(
        _local(t).nbytes for s in optimizer.state.values() for t in s.values() if t.dim()
    )
    groups = {a: sorted(mesh[a].mesh.flatten().tolist()) for a in AXES}
    traffic, calls = Counter(), Counter()
    for record in recorder.records:
        if len(record["group"]) == 1:  # torch 2.8's TP all-reduces over a tp of 1: no bytes move
            continue
        axis = next((a for a in AXES if groups[a] == sorted(record["group"])), "other")
        key = f"{axis}.{record['op']}"
        traffic[key] += record["bytes"] or record["received"]
        calls[key] += 1
    return {"stage": stage, "blocks": sorted(int(k) for k in model.blocks), "held": held,
            "traffic": dict(traffic), "calls": dict(calls), "groups": groups}  # fmt: skip


def tracked_peak(config: Config) -> dict[str, int]:
    """Bytes alive at this rank's peak over its second step (the first has no AdamW state
    yet), by torch's MemTracker category ("Parameter", "Gradient", "Activation", "Temp",
    "Optstate"...) and "Total". One fake world a process: the tracker's DTensor dispatch
    keeps the first world's groups."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (config.pp, config.dp, config.tp), mesh_dim_names=AXES)
    model = build(config, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tracker = MemTracker()
    tracker.track_external(model, optimizer)

    class EachForward:  # MemTracker refuses a root module called twice in one step
        def __call__(self, x):
            tracker.reset_mod_stats()  # its per-module figures only: the peak stays
            return model(x)

        def __getattr__(self, name):
            return getattr(model, name)

    with tracker:
        for _ in range(2):
            step(config, EachForward(), mesh)
            optimizer.step()
            optimizer.zero_grad()
    (snapshot,) = tracker.get_tracker_snapshot("peak").values()
    return {getattr(k, "value", k): v for k, v in snapshot.items()}
