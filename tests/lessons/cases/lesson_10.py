"""Lesson 10's ShardedOptimizer, driven in two gloo ranks forked from a child process
(course/grader/cases.py).

Run by tests/lessons/test_10_sharding.py as `python lesson_10.py LESSON_FILE OUT_DIR`. Each rank
builds the grader's TinyLM (tests/lessons/cases/lesson_10_models.py) from the same seed, wraps
AdamW in the submission's ShardedOptimizer with two parameter groups, and trains STEPS
steps on its half of each batch; this script averages the gradients (an all-reduce, as DDP
would), so what is graded is the optimizer alone. Before each step the first group's lr
may change, through optimizer.param_groups, as a scheduler changes it. Each rank then
counts the bytes of every tensor its optimizer holds, parameters and gradients left out;
calls state_dict() (a collective); loads it into a second ShardedOptimizer over a copy of
the model; and takes one more step with both. The test compares all of it with torch's
AdamW in one process.

The grading kit (course/grader/) watches how the work is done: the library's
ZeroRedundancyOptimizer (and FSDP) behind a tripwire, and the optimizer state held *during*
each step(): after every optimizer step inside it (the inner one, or any other a
submission makes), a global step hook counts the bytes reachable from the ShardedOptimizer
and from the optimizer that stepped. A ZeRO-1 that steps the whole model and then drops
what it does not own peaks at the whole state, and ends with a shard. The state_dict()'s
tensors are read as soon as it returns: a state_dict() that hands out the live state
tensors, as torch's own optimizers do, is as right as one that copies them.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

sys.path.insert(0, str(Path(__file__).parent))
import lesson_10_models as m  # noqa: E402

from course.grader.cases import Cases, Tensors  # noqa: E402
from course.measure.tripwires import Tripwires, naming_shortcuts  # noqa: E402

# What would do ZeRO for the student: PyTorch's own stage 1, or FSDP.
LIBRARY = ("ZeroRedundancyOptimizer", "FullyShardedDataParallel", "fully_shard")

cases = Cases()


def held_bytes(optimizer, model, module: str) -> int:
    """Bytes of the distinct tensors reachable from `optimizer` (its attributes, dicts,
    lists, the optimizers inside it and objects of the lesson's own classes, `module`),
    except the model's parameters and gradients."""
    skip = set()
    for p in model.parameters():
        skip.add(p.untyped_storage().data_ptr())
        if p.grad is not None:
            skip.add(p.grad.untyped_storage().data_ptr())
    seen, storages, stack = set(), {}, [optimizer]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if torch.is_tensor(obj):
            ptr = obj.untyped_storage().data_ptr()
            if ptr not in skip:
                storages[ptr] = obj.untyped_storage().nbytes()
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif isinstance(obj, torch.optim.Optimizer) or type(obj).__module__ == module:
            stack.extend(vars(obj).values())
    return sum(storages.values())


def _gradients(model, step, rank, world) -> None:
    inputs, targets = m.batch(step)
    half = m.BATCH // world
    m.loss(
        model, inputs[rank * half : (rank + 1) * half], targets[rank * half : (rank + 1) * half]
    ).backward()
    for p in model.parameters():  # the average over the ranks: what DDP would leave in .grad
        dist.all_reduce(p.grad)
        p.grad /= world


def _step(model, optimizer, step, rank, world) -> None:
    optimizer.zero_grad()
    _gradients(model, step, rank, world)
    m.set_lr(optimizer, step)
    optimizer.step()


def held_during_steps(optimizer, model, module: str):
    """A context that keeps, in the list it yields, the most bytes held_bytes counts after any
    optimizer's step while it is open: the ShardedOptimizer's and the stepping one's."""
    most = [0]

    def hook(stepped, args, kwargs):
        most[0] = max(most[0], held_bytes([optimizer, stepped], model, module))

    handle = register_optimizer_step_post_hook(hook)
    return most, handle


def _rank(rank, world, port, out, lesson_file):
    from course import ranks
    from course.grader import submission

    # Before the lesson: its imports bind these.
    wires = Tripwires(*LIBRARY, log=Path(out, f"rank{rank}.tripwires")).install()
    lesson = submission.load(Path(lesson_file), requires=("ShardedOptimizer",))
    ranks.join_local(rank, world, "gloo", port)
    out = Path(out)
    try:
        model = m.build()
        optimizer = lesson.ShardedOptimizer(m.groups(model), torch.optim.AdamW, lr=m.LR)
        during, handle = held_during_steps(optimizer, model, lesson.__name__)
        try:
            for step in range(1, m.STEPS + 1):
                _step(model, optimizer, step, rank, world)
        finally:
            handle.remove()
        held = held_bytes(optimizer, model, lesson.__name__)
        saved = optimizer.state_dict()
        # Read now: the next step may move tensors a state_dict() shares with the optimizer.
        state_now = {f"state/{index}/{key}": value.detach().cpu().clone()
                     for index, entry in saved["state"].items()
                     for key, value in entry.items() if torch.is_tensor(value)}  # fmt: skip
        # The same state, loaded into another ShardedOptimizer over a copy of the model.
        again = copy.deepcopy(model)
        reloaded = lesson.ShardedOptimizer(m.groups(again), torch.optim.AdamW, lr=m.LR)
        reloaded.load_state_dict(copy.deepcopy(saved))
        after = {}
        for name, net, opt in (("continued", model, optimizer), ("reloaded", again, reloaded)):
            _step(net, opt, m.STEPS + 1, rank, world)
            after |= {f"{name}/{k}": v.detach().clone() for k, v in net.named_parameters()}
        tensors = {f"rank{rank}/{k}": v for k, v in after.items()}
        if rank == 0:
            tensors |= state_now
        torch.save(tensors, out / f"rank{rank}.pt")
        found = {"held_bytes": held, "held_in_step": during[0], "groups": saved["param_groups"]}
        found["library"] = wires.used
        found["state_keys"] = sorted(int(i) for i in saved["state"])
        (out / f"rank{rank}.json").write_text(json.dumps(found, default=str))
    finally:
        dist.destroy_process_group()


@cases.case
def sharded_adamw(lesson):
    out = cases.out / "sharded"
    out.mkdir(parents=True, exist_ok=True)
    with naming_shortcuts(out, "ShardedOptimizer"):
        cases.spawn(_rank, 2, str(out), str(cases.lesson_file), what="2 gloo ranks")
    tensors, found = {}, {}
    for rank in (0, 1):
        tensors |= torch.load(out / f"rank{rank}.pt", weights_only=True)
        found[str(rank)] = json.loads((out / f"rank{rank}.json").read_text())
    return Tensors(tensors, found)


if __name__ == "__main__":
    cases.run(requires=("ShardedOptimizer",))
