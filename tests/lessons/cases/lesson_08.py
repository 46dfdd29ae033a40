"""Lesson 08's train_one_epoch, called in two gloo ranks forked from a child process
(course/grader/cases.py).

Run by tests/lessons/test_08_performance.py as `python lesson_08.py LESSON_FILE OUT_DIR`. Each rank
wraps lesson 01's small CNN (no BatchNorm: no buffers to keep in step) in DDP, counts the
buckets DDP all-reduces with a communication hook, and runs train_one_epoch over 2 steps of
4 micro-batches of 8 images of its own, and 2 micro-batches more: the epoch's end is not a
multiple of 4, and its short group must step too. The test trains the reference itself.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import torch
import torch.distributed as dist

from course import models, ranks
from course.grader.cases import Cases, Tensors
from course.grader.tolerances import seed

cases = Cases()
STEPS, K, MICRO, LR, EXTRA = 2, 4, 8, 0.1, 2
MODEL_SEED = seed(0)  # the test's case_reference() uses the same


def micro_batches(rank: int) -> list:
    gen = torch.Generator().manual_seed(100 + rank)
    return [
        (torch.randn(MICRO, 1, 8, 8, generator=gen), torch.randint(0, 10, (MICRO,), generator=gen))
        for _ in range(STEPS * K + EXTRA)
    ]


def _rank(rank, world, port, out, lesson_file):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from course.grader import submission

    lesson = submission.load(Path(lesson_file), requires=("train_one_epoch",))
    ranks.join_local(rank, world, "gloo", port)
    try:
        torch.manual_seed(MODEL_SEED)
        model = DDP(models.SmallCNN(norm="none"))
        sent = 0

        def counting(state, bucket):  # DDP's own all-reduce, counted
            nonlocal sent
            sent += 1
            return default_hooks.allreduce_hook(dist.group.WORLD, bucket)

        model.register_comm_hook(None, counting)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        args = types.SimpleNamespace(accumulate=K, amp="off", progress=False)
        _, images, steps = lesson.train_one_epoch(
            model, micro_batches(rank), optimizer, scaler, torch.device("cpu"), args
        )
        torch.save(model.module.state_dict(), Path(out, f"{rank}.pt"))
        found = {"all_reduces": sent, "images": images, "steps": steps}
        Path(out, f"{rank}.json").write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()


@cases.case
def accumulate(lesson):
    """Both ranks' weights after train_one_epoch, and what each rank counted."""
    out = cases.out / "accumulate"
    out.mkdir(parents=True, exist_ok=True)
    cases.spawn(_rank, 2, str(out), str(cases.lesson_file), what="accumulating ranks", ddp=True)
    tensors = {}
    for rank in range(2):
        for key, value in torch.load(out / f"{rank}.pt", weights_only=True).items():
            tensors[f"{rank}/{key}"] = value
    counts = [json.loads((out / f"{rank}.json").read_text()) for rank in range(2)]
    return Tensors(tensors, {"ranks": counts})


if __name__ == "__main__":
    cases.run(requires=("train_one_epoch",))
