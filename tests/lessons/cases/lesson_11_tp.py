"""Lesson 11's tensor parallelism, driven in two gloo ranks forked from a child process
(course/grader/cases.py).

Run by tests/lessons/test_11_model_parallel.py as `python lesson_11_tp.py LESSON_FILE OUT_DIR`.
Each rank builds the grader's block (tests/lessons/cases/lesson_11_models.py), splits it with the
submission's ParallelBlock (case `by_hand`) or parallelize (case `dtensor`), runs one
forward and backward on the same input as every other rank, takes one SGD step and runs
a second input. Every collective the submission makes is recorded by phase, below the
Python API (the grading kit's CommRecorder: DTensor's redistributions too), with what it
sends. The test compares the outputs and the input's gradient with the whole block.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
import lesson_11_models as m  # noqa: E402

from course.grader.cases import Cases, Tensors  # noqa: E402
from course.measure.comm import CommRecorder  # noqa: E402

cases = Cases()
REQUIRES = ("ParallelBlock", "parallelize")


def held_values(module) -> int:
    """The values of the storages behind `module`'s parameters (each once): a slice kept as
    a view keeps its whole weight's storage alive, and counts as the whole."""
    storages = {}
    for p in module.parameters():
        local = getattr(p, "_local_tensor", p)
        storage = local.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes() // local.element_size()
    return sum(storages.values())


def _shared_gradient_kept(lesson) -> bool | None:
    """f's backward handed a gradient autograd also hands elsewhere: (v * 1) + f(x), so the
    sum's backward gives both paths one tensor, and f's (made later) runs first. Is v's
    gradient still w, or did f's all-reduce change that tensor in place? None where the
    lesson has no CopyToRanks."""
    f = getattr(lesson, "CopyToRanks", None)
    if f is None:
        return None
    x = torch.ones(4, requires_grad=True)
    v = torch.zeros(4, requires_grad=True)
    w = torch.arange(1.0, 5.0)
    ((v * 1.0 + f.apply(x)) * w).sum().backward()
    return bool(torch.equal(v.grad, w))


def _input_kept(lesson) -> bool | None:
    """g's forward given a tensor its caller keeps using: is it unchanged after the sum, or
    did g all-reduce it in place? None where the lesson has no SumOverRanks."""
    g = getattr(lesson, "SumOverRanks", None)
    if g is None:
        return None
    partial = torch.arange(1.0, 5.0)
    g.apply(partial)
    return bool(torch.equal(partial, torch.arange(1.0, 5.0)))


def _rank(rank, world, port, out, lesson_file, how):
    from course import ranks
    from course.grader import submission

    torch.set_num_threads(1)
    lesson = submission.load(Path(lesson_file), requires=REQUIRES)
    ranks.join_local(rank, world, "gloo", port)
    try:
        block = m.tp_block()
        if how == "by_hand":
            split = lesson.ParallelBlock(block, rank, world)
        else:
            from torch.distributed.device_mesh import init_device_mesh

            split = lesson.parallelize(block, init_device_mesh("cpu", (world,)))
        recorder = CommRecorder()
        x, weights, after = m.tp_inputs()
        x = x.clone().requires_grad_()
        with recorder:
            with recorder.during("forward"):
                output = split(x)
            with recorder.during("backward"):
                (output * weights).sum().backward()
            held = held_values(split)
            with torch.no_grad(), recorder.during("step"):
                for p in split.parameters():
                    p -= m.TP_LR * p.grad
            with torch.no_grad(), recorder.during("again"):
                again = split(after)
        log = [(r["op"], r["phase"], r["bytes"]) for r in recorder.records]
        tensors = {"output": output.detach(), "input_grad": x.grad, "again": again}
        torch.save(tensors, Path(out) / f"rank{rank}.pt")
        found = {"calls": log, "held": held}
        if how == "by_hand":
            found["shared_gradient_kept"] = _shared_gradient_kept(lesson)
            found["input_kept"] = _input_kept(lesson)
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(found))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _case(how: str):
    out = cases.out / how
    out.mkdir(parents=True, exist_ok=True)
    cases.spawn(_rank, m.TP_WORLD, str(out), str(cases.lesson_file), how,
                what=f"{m.TP_WORLD} gloo ranks, tensor parallel ({how})")  # fmt: skip
    tensors, found = {}, {}
    for rank in range(m.TP_WORLD):
        got = torch.load(out / f"rank{rank}.pt", weights_only=True)
        tensors |= {f"rank{rank}/{k}": v for k, v in got.items()}
        found[str(rank)] = json.loads((out / f"rank{rank}.json").read_text())
    return Tensors(tensors, found)


@cases.case
def by_hand(lesson):
    return _case("by_hand")


@cases.case
def dtensor(lesson):
    return _case("dtensor")


if __name__ == "__main__":
    cases.run(requires=REQUIRES)
