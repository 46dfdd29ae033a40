"""Lesson 10's FSDP2 and distributed-checkpoint functions, driven in ranks forked from a
child process (course/grader/cases.py).

Run by tests/lessons/test_10_sharding.py as `python lesson_10_fsdp2.py LESSON_FILE OUT_DIR`. The
model, the optimizer (AdamW), the data and the steps are the grader's, from
tests/lessons/cases/lesson_10_models.py (part 3), so that the test trains the same model in one
process as the reference.

shard: on 2 ranks, the submission's shard() in two settings, fp32 with resharding and
    bf16 without. Each reports which modules became FSDP units, each parameter's local
    and full sizes, the dtype a block's Linear saw in forward, which blocks' parameters
    were still whole after forward, the dtypes every all-gather and reduce-scatter carried,
    and (fp32) the full parameters after STEPS steps.
checkpoint: 2 ranks train SAVE_AT steps, lower the learning rate (as a scheduler would)
    and call save(), recording what each rank sends during it and whether the folder is
    there when it returns (rank 0's renames slowed); one more step, then a save whose
    writer fails before its metadata (as a crash would). Then 3 ranks, and 1 rank, build
    the model from another seed, load() the checkpoint and train to STEPS. Each reports
    what it loaded, its learning rates and where it ended.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).parent))
import lesson_10_models as m  # noqa: E402

from course.grader.cases import Cases, Tensors  # noqa: E402
from course.measure.comm import CommRecorder  # noqa: E402

cases = Cases()

REQUIRES = ("shard", "save", "latest", "load")
COLLECTIVES = (
    "all_gather_into_tensor", "all_gather_single", "reduce_scatter_tensor",
    "reduce_scatter_single",
)  # fmt: skip
build, train_step, LR = m.fsdp2_model, m.fsdp2_step, m.LR2
STEPS, SAVE_AT = m.STEPS2, m.SAVE_AT2


def full(tensor) -> torch.Tensor:
    whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    return whole.detach().float().clone()


def full_params(model) -> dict[str, torch.Tensor]:
    return {name: full(p) for name, p in model.named_parameters()}


def full_moments(model, optimizer) -> dict[str, torch.Tensor]:
    """AdamW's first moment of every parameter, whole, by parameter name."""
    return {
        name: full(optimizer.state[p]["exp_avg"])
        for name, p in model.named_parameters()
        if p in optimizer.state
    }


def log_dtypes(seen: list) -> None:
    """Note the dtypes each all-gather and reduce-scatter carries (FSDP2 calls them through
    torch.distributed; their names changed in PyTorch 2.14)."""
    for name in COLLECTIVES:
        original = getattr(dist, name, None)
        if original is None:
            continue

        def logged(*args, _original=original, _name=name, **kwargs):
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            kind = "gather" if "gather" in _name else "scatter"
            seen.append([kind, sorted({str(t.dtype) for t in tensors})])
            return _original(*args, **kwargs)

        setattr(dist, name, logged)


def _shard(rank, world, port, out, lesson_file, backend):
    from course import ranks
    from course.grader import submission

    seen: list = []
    log_dtypes(seen)
    lesson = submission.load(Path(lesson_file), requires=REQUIRES)
    ranks.join_local(rank, world, backend, port)
    summed = not ranks.reduce_scatter_averages()  # PyTorch 2.8's gloo (lesson_10_models.py)
    try:
        notes, tensors = {}, {}
        for setting, dtype, reshard in (("fp32", None, True), ("bf16", torch.bfloat16, False)):
            model = build()
            sizes = {name: p.numel() for name, p in model.named_parameters()}
            lesson.shard(model, dtype, reshard)
            units = {"root": isinstance(model, FSDPModule)}
            units |= {f"blocks.{i}": isinstance(b, FSDPModule) for i, b in enumerate(model.blocks)}
            local = {
                name: [p.to_local().numel() if isinstance(p, DTensor) else p.numel(), sizes[name]]
                for name, p in model.named_parameters()
            }
            linear = next(x for x in model.blocks[0].modules() if isinstance(x, torch.nn.Linear))
            computed: list = []

            def note(mod, inputs, _, computed=computed):
                computed.append([str(mod.weight.dtype), str(inputs[0].dtype)])

            linear.register_forward_hook(note)
            optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
            tokens, targets = m.fsdp2_batch(1, rank, world)
            seen.clear()
            logits = model(tokens)
            whole = [not isinstance(p, DTensor) for b in model.blocks for p in b.parameters()]
            claimed = {id(p) for b in model.blocks for p in b.parameters()}
            root_whole = [not isinstance(p, DTensor) for p in model.parameters()
                          if id(p) not in claimed]  # fmt: skip
            F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()).backward()
            for p in model.parameters() if summed else ():
                p.grad /= world
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            notes[setting] = {
                "units": units, "local": local, "computed": computed[:1],
                "whole_after_forward": whole, "root_whole_after_forward": root_whole,
                "collectives": list(seen),
            }  # fmt: skip
            if setting == "fp32":
                for step in range(2, STEPS + 1):
                    train_step(model, optimizer, step, rank, world, summed)
                tensors = {f"rank{rank}/{k}": v for k, v in full_params(model).items()}
        torch.save(tensors, Path(out) / f"rank{rank}.pt")
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(notes))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@cases.case
def shard(lesson):
    out = cases.out / "shard"
    out.mkdir(parents=True, exist_ok=True)
    cases.spawn(_shard, 2, str(out), str(cases.lesson_file), "gloo", what="2 gloo ranks")
    tensors, notes = {}, {}
    for rank in (0, 1):
        tensors |= torch.load(out / f"rank{rank}.pt", weights_only=True)
        notes[str(rank)] = json.loads((out / f"rank{rank}.json").read_text())
    return Tensors(tensors, {"notes": notes})


class CrashBeforeMetadata(RuntimeError):
    pass


@contextlib.contextmanager
def slow_renames(rank: int, seconds: float = 0.5):
    """On rank 0, each rename waits `seconds` first (os.rename and os.replace, which
    Path.rename, Path.replace and shutil.move call): a rank that returns from save() before
    rank 0 has put the folder in place sees no folder."""
    if rank != 0:
        yield
        return
    originals = {name: getattr(os, name) for name in ("rename", "replace")}

    def slowed(name):
        def rename(*args, **kwargs):
            time.sleep(seconds)
            return originals[name](*args, **kwargs)

        return rename

    for name in originals:
        setattr(os, name, slowed(name))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(os, name, original)


def shard_bytes(model, optimizer) -> int:
    """Bytes of this rank's own shards: its parameters' local parts and AdamW's moments."""
    local = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]
    moments = [t.to_local() if isinstance(t, DTensor) else t
               for state in optimizer.state.values() for t in state.values()
               if torch.is_tensor(t) and t.ndim > 0]  # fmt: skip
    return sum(t.numel() * t.element_size() for t in local + moments)


def _save(rank, world, port, out, lesson_file, backend):
    from course import ranks
    from course.grader import submission

    lesson = submission.load(Path(lesson_file), requires=REQUIRES)
    ranks.join_local(rank, world, backend, port)
    summed = not ranks.reduce_scatter_averages()  # PyTorch 2.8's gloo (lesson_10_models.py)
    try:
        model = build()
        lesson.shard(model, None, True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        for step in range(1, SAVE_AT + 1):
            train_step(model, optimizer, step, rank, world, summed)
        optimizer.param_groups[0]["lr"] = m.LR2_SAVED  # as a scheduler would: saved, restored
        recorder = CommRecorder()
        with recorder, slow_renames(rank):
            saved = lesson.save(model, optimizer, SAVE_AT, Path(out) / "ckpt")
        there = saved.is_dir()  # on every rank, the moment save() returned
        # The values it sends, not the pickled metadata (uint8) DCP's planning exchanges.
        sent = sum(r["bytes"] for r in recorder.records if "torch.uint8" not in r["dtypes"])
        tensors = {f"saved/{k}": v for k, v in full_params(model).items()}
        tensors |= {f"saved_moment/{k}": v for k, v in full_moments(model, optimizer).items()}
        train_step(model, optimizer, SAVE_AT + 1, rank, world, summed)
        writer = dcp.FileSystemWriter
        finish = writer.finish

        def crash(self, *args, **kwargs):
            raise CrashBeforeMetadata("the grader's crash, before the metadata")

        writer.finish, crashed = crash, ""
        try:
            lesson.save(model, optimizer, SAVE_AT + 1, Path(out) / "ckpt")
        except (Exception, CheckpointException) as err:  # noqa: BLE001 - DCP wraps the crash
            crashed = type(err).__name__  # in its CheckpointException, a BaseException
        finally:
            writer.finish = finish
        seen = [None] * world
        dist.all_gather_object(seen, {"there": there, "sent": sent})
        if rank == 0:
            latest = lesson.latest(Path(out) / "ckpt")
            notes = {"saved": str(saved), "crashed": crashed, "latest": str(latest),
                     "there": [n["there"] for n in seen], "sent": [n["sent"] for n in seen],
                     "shard_bytes": shard_bytes(model, optimizer)}  # fmt: skip
            (Path(out) / "save.json").write_text(json.dumps(notes))
            torch.save(tensors, Path(out) / "save.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _resume(rank, world, port, out, lesson_file, backend):
    from course import ranks
    from course.grader import submission

    lesson = submission.load(Path(lesson_file), requires=REQUIRES)
    ranks.join_local(rank, world, backend, port)
    summed = not ranks.reduce_scatter_averages()  # PyTorch 2.8's gloo (lesson_10_models.py)
    try:
        model = build(m.SEED2 + 1)  # other values, which the load must replace
        lesson.shard(model, None, True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        path = Path(json.loads((Path(out) / "save.json").read_text())["saved"])
        step = lesson.load(model, optimizer, path)
        tensors = {f"{world}/loaded/{k}": v for k, v in full_params(model).items()}
        moments = full_moments(model, optimizer)
        tensors |= {f"{world}/loaded_moment/{k}": v for k, v in moments.items()}
        for later in range(int(step) + 1, STEPS + 1):
            train_step(model, optimizer, later, rank, world, summed)
        tensors |= {f"{world}/end/{k}": v for k, v in full_params(model).items()}
        # save() on this many ranks too: one whole checkpoint, there on every rank's return
        saved = lesson.save(model, optimizer, STEPS, Path(out) / f"again{world}")
        there = [None] * world
        dist.all_gather_object(there, saved.is_dir())
        if rank == 0:
            torch.save(tensors, Path(out) / f"resume{world}.pt")
            notes = {"step": int(step), "lr": [g["lr"] for g in optimizer.param_groups],
                     "saved": str(saved), "there": there,
                     "latest": str(lesson.latest(Path(out) / f"again{world}"))}  # fmt: skip
            (Path(out) / f"resume{world}.json").write_text(json.dumps(notes))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@cases.case
def checkpoint(lesson):
    out = cases.out / "checkpoint"
    out.mkdir(parents=True, exist_ok=True)
    args = (str(out), str(cases.lesson_file), "gloo")
    cases.spawn(_save, 2, *args, what="2 gloo ranks saving")
    tensors = torch.load(out / "save.pt", weights_only=True)
    notes = {"save": json.loads((out / "save.json").read_text())}
    for world in (3, 1):
        cases.spawn(_resume, world, *args, what=f"{world} gloo ranks resuming")
        tensors |= torch.load(out / f"resume{world}.pt", weights_only=True)
        notes[f"resume{world}"] = json.loads((out / f"resume{world}.json").read_text())
    return Tensors(tensors, notes)


if __name__ == "__main__":
    cases.run(requires=REQUIRES)
