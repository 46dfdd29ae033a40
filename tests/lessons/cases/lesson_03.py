"""Lesson 03's functions, called in a child process (course/grader/cases.py) and in gloo
ranks forked from it.

Run by tests/lessons/test_03_ddp_spawn.py as `python lesson_03.py LESSON_FILE OUT_DIR`. The
`train_in_two_ranks` case calls setup() and train() in two forked ranks, without
mp.spawn: what the whole launches of test_03 check end to end (the grader's one-process
result, each rank's own shard, one writer), one function at a time, for a fraction of a
launch's start-up cost (course/grader/cases.py, Cases.spawn).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from course import checkpoint
from course.grader.cases import Cases, Tensors, raised
from course.grader.tolerances import seed

cases = Cases()

# What test_03's `ddp` launch trains: 2 ranks x 64 without BatchNorm, 2 epochs, at
# --seed 3 --lr 0.1 (neither the default). The test module has the same numbers.
# A measurement of the bound (`python -m course tolerances 03`) runs other seeds.
TRAIN_ARGS = ["--norm", "none", "--batch-size", "64", "--seed", str(seed(3)), "--lr", "0.1"]
TRAIN_ARGS += ["--epochs", "2", "--quiet"]


def _train_rank(rank, world, port, out, lesson_file):
    from course.grader import submission
    from course.probes import batch_log, weight_log, write_log

    lesson = submission.load(Path(lesson_file), requires=("setup", "train", "parse_args"))
    out = Path(out)
    # What mp.spawn's parent would have put in the environment (main's TODO), and the
    # probes a launch arms through its environment (course/probes/__init__.py).
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ[batch_log.LOG_ENV] = str(out / "batches")
    os.environ[weight_log.LOG_ENV] = str(out / "replicas")
    batch_log.install()
    weight_log.install()
    write_log.install(str(out / "writes.log"))
    torch.set_num_threads(1)  # as each rank of a launch of two on this machine
    device = lesson.setup(rank, world, "gloo")
    joined = {"rank": dist.get_rank(), "world": dist.get_world_size(), "device": str(device)}
    (out / f"joined{rank}.json").write_text(json.dumps(joined))
    try:
        args = lesson.parse_args([*TRAIN_ARGS, "--checkpoint", str(out / "out" / "ckpt.pt")])
        lesson.train(rank, world, device, args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@cases.case
def train_in_two_ranks(lesson):
    """setup(rank, 2, "gloo") and train() in two forked ranks: how each joined, the
    checkpoint rank 0 saved, and the probes' logs (batches, replicas, writes) in the
    case's folder for the test to read."""
    out = cases.out / "train"
    for sub in ("batches", "replicas", "out"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    cases.spawn(_train_rank, 2, str(out), str(cases.lesson_file), what="training", ddp=True)
    joined = [json.loads((out / f"joined{r}.json").read_text()) for r in (0, 1)]
    ckpt = out / "out" / "ckpt.pt"
    state = checkpoint.load(ckpt) if ckpt.is_file() else None
    found = {"joined": joined, "folder": str(out), "saved": state is not None}
    if state is None:
        return Tensors({}, found)
    found |= {"step": state.get("step"), "epoch": state.get("epoch")}
    return Tensors(dict(state.get("model", {})), found)


@cases.case
def sync_bn_with_gloo(lesson):
    """--sync-bn with gloo must be refused before any process starts."""
    return raised(lesson.main, ["--sync-bn", "--backend", "gloo"])


if __name__ == "__main__":
    cases.run(requires=("main",))
