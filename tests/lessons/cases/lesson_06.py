"""Lesson 06's MiniDDP, driven in ranks started by a child process (course/grader/cases.py).

Run by tests/lessons/test_06_ddp_from_scratch.py as `python lesson_06.py LESSON_FILE OUT_DIR`. A
case
starts `world` ranks with mp.spawn. Every rank counts the calls of dist.all_reduce (patched
before the lesson is loaded), then, for each scenario (a model of lesson_06_models.py and a
bucket cap):
- builds the model from its own seed (the ranks start different), wraps it in the lesson's
  MiniDDP, and keeps the state before and after the wrapping;
- trains STEPS steps of SGD on its shard of the full batch: forward through the wrapper,
  backward, finish_gradient_synchronization(), step;
- notes, each step, how many all-reduces were issued, whether those issued during backward
  were asynchronous, and how many were issued before the first layer's gradient was ready
  (a hook of the grader, registered before the wrapper's, on the plain model's first weight),
  and whether any was waited for during backward (the Work it returns is watched).
The case returns the states and the notes; the test compares them with its own reference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
import lesson_06_models as m  # noqa: E402

from course import ranks  # noqa: E402
from course.grader.cases import Cases, Tensors  # noqa: E402

cases = Cases()
SCENARIOS = (
    ("plain", None),
    ("plain", m.MID_CAP_MB),
    ("plain", m.LARGE_CAP_MB),
    ("tied", None),
    ("tied", m.MID_CAP_MB),
)


def scenario_key(name: str, cap) -> str:
    return f"{name}-{'none' if cap is None else cap}"


class Watched:
    """An async all-reduce's Work, handed to the lesson; notes the phase its wait() ran in."""

    def __init__(self, work, call: dict, counter: Counter):
        self._work, self._call, self._counter = work, call, counter

    def wait(self, *args, **kwargs):
        self._call.setdefault("waited_in", self._counter.phase)
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


class Counter:
    """Counts dist.all_reduce calls; `phase` is set by the driver around backward."""

    def __init__(self):
        self.calls: list[dict] = []
        self.phase = "other"
        self.first_grad_ready = False

    def patch(self) -> None:
        original = dist.all_reduce

        def all_reduce(tensor, *args, **kwargs):
            async_op = kwargs.get("async_op", args[2] if len(args) > 2 else False)
            call = {
                "phase": self.phase,
                "async": bool(async_op),
                "early": not self.first_grad_ready,
            }
            self.calls.append(call)
            work = original(tensor, *args, **kwargs)
            return Watched(work, call, self) if async_op and work is not None else work

        dist.all_reduce = all_reduce
        dist.distributed_c10d.all_reduce = all_reduce


def run_scenario(lesson, counter, rank, world, device, name, cap):
    model = m.build(name, m.FIRST_SEED + rank).to(device)
    before = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    if name == "plain":  # registered before the wrapper's hooks: it runs first

        def ready(_):
            counter.first_grad_ready = True

        model.layers[0].weight.register_post_accumulate_grad_hook(ready)
    counter.phase = "construct"
    wrapped = lesson.MiniDDP(model, bucket_cap_mb=cap)
    after = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    notes = {"module_is_model": getattr(wrapped, "module", None) is model, "steps": []}
    notes["buffers"] = [name for name, _ in model.named_buffers()]
    optimizer = torch.optim.SGD(model.parameters(), lr=m.LR, momentum=m.MOMENTUM)
    x, y = (t.to(device) for t in m.batch(name))
    per = m.BATCH // world
    x, y = x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]
    for _ in range(m.STEPS):
        counter.phase = "forward"
        loss = m.loss_of(name, wrapped(x), y)
        optimizer.zero_grad(set_to_none=True)
        start, counter.first_grad_ready = len(counter.calls), False
        counter.phase = "backward"
        loss.backward()
        counter.phase = "finish"
        wrapped.finish_gradient_synchronization()
        counter.phase = "step"
        optimizer.step()
        calls = counter.calls[start:]
        during = [c for c in calls if c["phase"] == "backward"]
        notes["steps"].append(
            {
                "all_reduces": len(calls),
                "during_backward": len(during),
                "async_during_backward": sum(c["async"] for c in during),
                "waited_during_backward": sum(c.get("waited_in") == "backward" for c in during),
                "before_first_layer": sum(c["early"] for c in during),
            }
        )
    final = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return before, after, final, notes


def _rank(rank, world, port, lesson_file, out, backend) -> None:
    from course.grader import submission

    counter = Counter()
    counter.patch()  # before the lesson is loaded: its own imports see the counting one
    device = ranks.join_local(rank, world, backend, port)
    try:
        lesson = submission.load(Path(lesson_file), requires=("MiniDDP",))
        tensors, notes = {}, {}
        for name, cap in SCENARIOS:
            key = scenario_key(name, cap)
            states = run_scenario(lesson, counter, rank, world, device, name, cap)
            for stage, state in zip(("before", "after", "final"), states[:3], strict=True):
                tensors |= {f"{key}/{rank}/{stage}/{k}": v for k, v in state.items()}
            notes[key] = states[3]
        torch.save(tensors, Path(out) / f"rank{rank}.pt")
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(notes))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def drive(world: int, backend: str = "gloo") -> Tensors:
    out = cases.out / f"ranks-{backend}-{world}"
    out.mkdir(parents=True, exist_ok=True)
    args = (str(cases.lesson_file), str(out), backend)
    cases.spawn(_rank, world, *args, what=f"{world} {backend} ranks", cuda=backend == "nccl")
    tensors, notes = {}, {}
    for rank in range(world):
        tensors |= torch.load(out / f"rank{rank}.pt", weights_only=True)
        notes[str(rank)] = json.loads((out / f"rank{rank}.json").read_text())
    return Tensors(tensors, extra={"notes": notes})


@cases.case
def ranks_2(lesson):
    return drive(2)


@cases.case
def ranks_3(lesson):
    return drive(3)


@cases.case
def ranks_nccl(lesson):
    """On 2 GPUs only (tests/lessons/test_06_ddp_from_scratch.py marks its tests gpus(2))."""
    if torch.cuda.device_count() < 2:
        return None
    return drive(2, backend="nccl")


if __name__ == "__main__":
    cases.run(requires=("MiniDDP",))
