"""Lesson 11's tensor parallelism, driven in two gloo ranks forked from a child process
(course/grader/cases.py).

Run by tests/lessons/test_11_model_parallel.py as `python lesson_11_tp.py LESSON_FILE OUT_DIR`.
Each rank builds the grader's block (tests/lessons/cases/lesson_11_models.py), splits it with the
submission's ParallelBlock (case `by_hand`) or parallelize (case `dtensor`), runs one
forward and backward on the same input as every other rank, takes one SGD step and runs
a second input. Every collective of torch.distributed the submission calls is counted,
by phase. The test compares the outputs and the input's gradient with the whole block.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
import lesson_11_models as m  # noqa: E402

from course.grader.cases import Cases, Tensors  # noqa: E402

cases = Cases()
REQUIRES = ("ParallelBlock", "parallelize")
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "broadcast", "reduce", "all_to_all",
               "all_to_all_single", "send", "recv", "isend", "irecv", "barrier")  # fmt: skip


def _counting(log: list, phase: list):
    """torch.distributed's collectives, each noting (its name, the phase) when called."""
    for name in COLLECTIVES:
        original = getattr(dist, name)

        @functools.wraps(original)
        def counted(*args, _name=name, _original=original, **kwargs):
            log.append((_name, phase[0]))
            return _original(*args, **kwargs)

        setattr(dist, name, counted)


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
        log, phase = [], ["forward"]
        _counting(log, phase)
        x, weights, after = m.tp_inputs()
        x = x.clone().requires_grad_()
        output = split(x)
        phase[0] = "backward"
        (output * weights).sum().backward()
        phase[0] = "step"
        held = sum(getattr(p, "_local_tensor", p).numel() for p in split.parameters())
        with torch.no_grad():
            for p in split.parameters():
                p -= m.TP_LR * p.grad
            phase[0] = "again"
            again = split(after)
        tensors = {"output": output.detach(), "input_grad": x.grad, "again": again}
        torch.save(tensors, Path(out) / f"rank{rank}.pt")
        found = {"calls": log, "held": held}
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
