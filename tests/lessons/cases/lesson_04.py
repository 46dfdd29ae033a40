"""Lesson 04's functions, called in a child process (course/grader/cases.py) and in gloo
ranks forked from it.

Run by tests/lessons/test_04_torchrun.py as `python lesson_04.py LESSON_FILE OUT_DIR`. The
snapshot cases call save_snapshot and load_snapshot directly, in a group of one or two
ranks, without torchrun: what the whole runs of test_04 check end to end (a resumed run
is bit-exact, a crash mid-write leaves the old snapshot), one function at a time.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from course import checkpoint, models, ranks
from course.grader.cases import Cases, Tensors, raised
from course.grader.tolerances import seed

cases = Cases()
SNAPSHOT = "snapshot.pt"


def _trained(seed: int):
    """A DDP model and an SGD with momentum that has taken one step (it has state)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(seed)
    model = DDP(models.SmallCNN(norm="none"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    images, labels = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    optimizer.step()
    return model, optimizer


def _watch_writes(log: list) -> None:
    """Note how files named snapshot.pt are written: opened (or torch.save'd) in place,
    or renamed onto from a temporary file."""
    from course.probes.write_log import opened_for_writing

    def hook(event, args):
        if event == "os.rename" and os.path.basename(os.fsdecode(args[1])) == SNAPSHOT:
            log.append("renamed onto")
        elif event == "open":
            path = opened_for_writing(args)
            if path is not None and os.path.basename(path) == SNAPSHOT:
                log.append("written in place")

    sys.addaudithook(hook)
    save = torch.save

    def watched(obj, f, *a, **kw):  # torch.save to a path opens it in C++: no audit event
        if isinstance(f, (str, os.PathLike)) and os.path.basename(os.fsdecode(f)) == SNAPSHOT:
            log.append("written in place")
        return save(obj, f, *a, **kw)

    torch.save = watched


def _round_trip_rank(rank, world, port, out, lesson_file):
    from course.grader import submission

    lesson = submission.load(Path(lesson_file), requires=("save_snapshot", "load_snapshot"))
    ranks.join_local(rank, world, "gloo", port)
    try:
        path, writes = Path(out) / SNAPSHOT, []
        model, optimizer = _trained(seed=1)
        lesson.save_snapshot(path, model, optimizer, 1, 3, 7)  # a first snapshot
        _watch_writes(writes)
        lesson.save_snapshot(path, model, optimizer, 1, 3, 7)  # the one that replaces it
        after_save = torch.rand(4)  # what the generator gives next, at the snapshot
        other, other_optimizer = _trained(seed=2)  # other weights, other momentum
        returned = lesson.load_snapshot(path, other, other_optimizer, torch.device("cpu"))
        after_load = torch.rand(4)

        def momentum(opt):
            return [state["momentum_buffer"] for state in opt.state_dict()["state"].values()]

        torch.save(
            {
                "saved": model.module.state_dict(),
                "loaded": other.module.state_dict(),
                "saved_momentum": momentum(optimizer),
                "loaded_momentum": momentum(other_optimizer),
                "rng": torch.stack([after_save, after_load]),
            },
            Path(out) / "found.pt",
        )
        found = {"returned": list(returned), "writes": writes}
        Path(out, "found.json").write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()


@cases.case
def snapshot_round_trip(lesson):
    """One rank: save_snapshot twice (the second replaces the first, watched), then
    load_snapshot into another model and optimizer; what each holds, and how the file
    was written."""
    out = cases.out / "round-trip"
    out.mkdir(parents=True, exist_ok=True)
    cases.spawn(
        _round_trip_rank, 1, str(out), str(cases.lesson_file), what="snapshot round trip", ddp=True
    )
    found = torch.load(out / "found.pt", weights_only=True)
    tensors = {f"saved/{k}": v for k, v in found["saved"].items()}
    tensors |= {f"loaded/{k}": v for k, v in found["loaded"].items()}
    for side in ("saved", "loaded"):
        tensors |= {f"{side}_momentum/{i}": m for i, m in enumerate(found[f"{side}_momentum"])}
    tensors["rng"] = found["rng"]
    return Tensors(tensors, json.loads((out / "found.json").read_text()))


@cases.case
def main_without_torchrun(lesson):
    """Started without torchrun (no LOCAL_RANK), the script must say how to start it."""
    os.environ.pop("LOCAL_RANK", None)
    return raised(lesson.main, [])


def _save_rank(rank, world, port, out, lesson_file):
    from course.grader import submission

    lesson = submission.load(Path(lesson_file), requires=("save_snapshot",))
    ranks.join_local(rank, world, "gloo", port)
    try:
        model, optimizer = _trained(seed=1)
        lesson.save_snapshot(Path(out) / SNAPSHOT, model, optimizer, 0, 5, 5)
    finally:
        dist.destroy_process_group()


def _load_rank(rank, world, port, out, lesson_file):
    from course.grader import submission

    lesson = submission.load(Path(lesson_file), requires=("load_snapshot",))
    ranks.join_local(rank, world, "gloo", port)
    try:
        model, optimizer = _trained(seed=2)
        try:
            lesson.load_snapshot(Path(out) / SNAPSHOT, model, optimizer, torch.device("cpu"))
            found = {"raised": None}
        except Exception as err:  # noqa: BLE001 - which error, and what it says, is the finding
            found = {"raised": type(err).__name__, "message": str(err)}
        Path(out, "found.json").write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()


@cases.case
def snapshot_other_world(lesson):
    """A snapshot that 2 ranks saved, loaded by a group of 1: what load_snapshot raised."""
    out = cases.out / "other-world"
    out.mkdir(parents=True, exist_ok=True)
    cases.spawn(_save_rank, 2, str(out), str(cases.lesson_file), what="2-rank snapshot", ddp=True)
    cases.spawn(_load_rank, 1, str(out), str(cases.lesson_file), what="1-rank load", ddp=True)
    return json.loads((out / "found.json").read_text())


# train() as the grader's resume case calls it: 2 ranks x 32 without BatchNorm, 2 epochs
# (46 steps), a snapshot every 4 steps, at --seed 2 --lr 0.1 (neither the default).
# tests/lessons/test_04_torchrun.py has the same numbers (RESUME_SEED, RESUME_LR); a measurement of
# the bound (`python -m course tolerances 04`) runs other seeds.
RESUME_ARGS = ["--norm", "none", "--batch-size", "32", "--seed", str(seed(2)), "--lr", "0.1"]
RESUME_ARGS += ["--epochs", "2", "--snapshot-every", "4", "--quiet"]
# --max-steps of the interrupted calls: stopped after step 10 (snapshot at 8), resumed and
# stopped after step 14 (snapshot at 12, inside the resumed epoch), resumed to the end.
STOPS = (10, 14, None)


def _resume_rank(rank, world, port, out, lesson_file):
    from course.grader import submission
    from course.probes import weight_log

    lesson = submission.load(Path(lesson_file), requires=("setup", "train", "parse_args"))
    out = Path(out)
    # What torchrun puts in the environment of 2 nodes x 1 process: LOCAL_RANK is 0 on both.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0")
    os.environ.update(LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # as each rank of a launch of two on this machine
    got_rank, got_world, device = lesson.setup("gloo")
    joined = {"rank": got_rank, "world": got_world, "group_rank": dist.get_rank()}
    (out / f"joined{rank}.json").write_text(json.dumps(joined))
    try:
        runs = [("whole", None)] + [("resumed", stop) for stop in STOPS]
        for name, stop in runs:
            folder = out / name
            if name == "resumed" and stop is None:  # the last call: watch the replicas
                os.environ[weight_log.LOG_ENV] = str(out / "replicas")
                weight_log.install()
            argv = [*RESUME_ARGS, "--snapshot", str(folder / "snapshot.pt")]
            argv += ["--checkpoint", str(folder / "final.pt")]
            argv += ["--max-steps", str(stop)] if stop else []
            lesson.train(got_rank, got_world, device, lesson.parse_args(argv))
            dist.barrier()
    finally:
        dist.destroy_process_group()


@cases.case
def resumed_twice(lesson):
    """setup("gloo") with 2 nodes' environment, then train() in two forked ranks: once
    whole, and once stopped twice (--max-steps) and resumed from its snapshot each time.
    Returns how each rank joined, the two final checkpoints' steps and weights."""
    out = cases.out / "resume"
    for sub in ("whole", "resumed", "replicas"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    cases.spawn(_resume_rank, 2, str(out), str(cases.lesson_file), what="resume", ddp=True)
    found = {"joined": [json.loads((out / f"joined{r}.json").read_text()) for r in (0, 1)]}
    found["folder"] = str(out)
    tensors = {}
    for name in ("whole", "resumed"):
        path = out / name / "final.pt"
        state = checkpoint.load(path) if path.is_file() else None
        found[f"{name}_step"] = state["step"] if state else None
        for key, value in (state or {}).get("model", {}).items():
            tensors[f"{name}/{key}"] = value
    return Tensors(tensors, found)


if __name__ == "__main__":
    cases.run(requires=("main",))
