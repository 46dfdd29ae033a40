"""Lesson 10's MiniFSDP, driven in two ranks forked from a child process
(course/grader/cases.py).

Run by tests/lessons/test_10_sharding.py as `python lesson_10_fsdp.py LESSON_FILE OUT_DIR`. Each
rank builds the grader's TinyLM (tests/lessons/cases/lesson_10_models.py) from the same seed,
wraps it in the submission's MiniFSDP, once per compute dtype (fp32, bf16, fp16), and
trains FSDP_STEPS SGD steps on its half of each batch: forward, backward,
finish_gradient_synchronization(), step. It writes gather_full_params() after the last
step, and, after the first backward, the shape and dtype of every gradient under .module
and the bytes of every tensor reachable from the MiniFSDP object (its parameters and
their gradients included).

Every collective the submission issues is recorded below the Python API by the grading
kit's CommRecorder (course/measure/comm.py), whatever the call's form: its kind, the phase
(forward, backward, finish), its dtype and size. Wrappers of the Python functions,
installed before the submission is loaded, only note when an async one was waited for.
A forward hook of the grader's on every layer that holds a 2-D weight, run before the
submission's own, marks where each such layer's computation ended: an all-gather issued
before one end and waited for after it travelled while that layer computed (the
prefetch); one issued in a post-forward hook, after the layer computed, overlaps no
layer; one that spans two ends was fetched a layer too early.
"""

from __future__ import annotations

import inspect
import json
import math
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
import lesson_10_models as m  # noqa: E402

from course.grader.cases import Cases, Tensors  # noqa: E402
from course.measure.comm import CommRecorder  # noqa: E402

cases = Cases()

# The Python functions whose async handles the case watches (when each was waited for);
# what each sent is read from the communication recorder, below the Python API, so any
# call form counts alike: positional or keyword arguments, one function calling another.
WAITABLE = ("all_gather_into_tensor", "all_gather", "all_gather_single", "_all_gather_base",
            "reduce_scatter_tensor", "reduce_scatter", "reduce_scatter_single", "all_reduce",
            "broadcast")  # fmt: skip
# The recorder's kinds, by the names the tests use.
NAMES = {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor"}


class Watched:
    """An async collective's Work, handed to the submission; notes when it was waited for."""

    def __init__(self, work, records: list[dict], log: Log):
        self._work, self._records, self._log = work, records, log

    def wait(self, *args, **kwargs):
        tick = self._log.tick()
        for record in self._records:
            record.setdefault("waited", tick)
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


class Log:
    """The collectives issued (the recorder's records), when async ones were waited for,
    and the ticks at which a layer's forward ended."""

    def __init__(self):
        self.recorder = CommRecorder()
        self.ends: list[int] = []
        self.depth = 0

    @property
    def phase(self) -> str:
        return self.recorder.phase

    @phase.setter
    def phase(self, value: str) -> None:
        self.recorder.phase = value

    @property
    def calls(self) -> list[dict]:
        """Every collective so far (barriers aside), in the shape the tests read. One not
        issued through a watched function counts as waited for at once."""
        return [
            {"op": NAMES.get(r["op"], r["op"]), "phase": r["phase"],
             "numel": sum(math.prod(shape) for shape in r["shapes"]),
             "dtype": (r["dtypes"] or ["?"])[0], "async": r.get("async", False),
             "issued": r["tick"], "waited": r.get("waited", None if r.get("async") else r["tick"])}
            for r in self.recorder.records if r["op"] != "barrier"
        ]  # fmt: skip

    def tick(self) -> int:
        return self.recorder.tick()

    def patch(self) -> None:
        for name in WAITABLE:
            original = getattr(dist, name, None)
            if original is not None:
                wrapped = self.wrap(original)
                setattr(dist, name, wrapped)
                setattr(dist.distributed_c10d, name, wrapped)

    def wrap(self, original):
        signature = inspect.signature(original)

        def collective(*args, **kwargs):
            if self.depth:  # one collective calling another (2.14's *_tensor call *_single)
                return original(*args, **kwargs)
            try:
                async_op = bool(signature.bind(*args, **kwargs).arguments.get("async_op"))
            except TypeError:  # a call torch itself will refuse: let it say why
                return original(*args, **kwargs)
            first = len(self.recorder.records)
            self.depth += 1
            try:
                work = original(*args, **kwargs)
            finally:
                self.depth -= 1
            made = self.recorder.since(first)
            for record in made:
                record["async"] = async_op
            return Watched(work, made, self) if async_op and work is not None else work

        return collective


def reachable_bytes(root, module_name: str) -> int:
    """Bytes of the distinct tensor storages reachable from `root` (modules' parameters,
    buffers and attributes, dicts, lists, objects of the lesson's own classes), with the
    gradients of the parameters found."""
    seen, storages, stack = set(), {}, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if torch.is_tensor(obj):
            storages[obj.untyped_storage().data_ptr()] = obj.untyped_storage().nbytes()
            if obj.grad is not None:
                stack.append(obj.grad)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif isinstance(obj, torch.nn.Module) or type(obj).__module__ == module_name:
            stack.extend(vars(obj).values())
    return sum(storages.values())


def train(lesson, log: Log, rank: int, world: int, device, dtype_name: str):
    model = m.build().to(device)
    weighted = [mod for mod in model.modules() if getattr(mod, "weight", None) is not None
                and mod.weight.ndim == 2]  # fmt: skip
    fsdp = lesson.MiniFSDP(model, compute_dtype=m.DTYPES[dtype_name])
    for layer in weighted:  # before MiniFSDP's own: the moment a weighted layer computed
        layer.register_forward_hook(lambda *_: log.ends.append(log.tick()), prepend=True)
    optimizer = m.sgd(fsdp.parameters())
    half = m.BATCH // world
    notes = {"steps": []}
    for step in range(1, m.FSDP_STEPS + 1):
        inputs, targets = (t[rank * half : (rank + 1) * half].to(device) for t in m.batch(step))
        first = len(log.calls)
        log.phase = "forward"
        out = fsdp(inputs)
        loss = F.cross_entropy(out.float().reshape(-1, m.VOCAB), targets.reshape(-1))
        log.phase = "backward"
        loss.backward()
        log.phase = "finish"
        fsdp.finish_gradient_synchronization()
        log.phase = "other"
        if step == 1:
            notes["grads"] = {
                name: [list(p.shape), None if p.grad is None else list(p.grad.shape),
                       None if p.grad is None else str(p.grad.dtype), str(p.dtype)]
                for name, p in fsdp.module.named_parameters()
            }  # fmt: skip
            notes["reachable"] = reachable_bytes(fsdp, type(fsdp).__module__)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        notes["steps"].append({"calls": log.calls[first:], "ends": list(log.ends)})
        log.ends.clear()
    full = {k: v.detach().float().cpu().clone() for k, v in fsdp.gather_full_params().items()}
    return full, notes


def _rank(rank, world, port, out, lesson_file, backend):
    from course import ranks
    from course.grader import submission

    log = Log()
    log.patch()  # before the lesson is loaded: its own imports see the watching ones
    lesson = submission.load(Path(lesson_file), requires=("MiniFSDP",))
    device = ranks.join_local(rank, world, backend, port)
    try:
        tensors, notes = {}, {}
        for dtype_name in m.DTYPES:
            with log.recorder:
                full, notes[dtype_name] = train(lesson, log, rank, world, device, dtype_name)
            tensors |= {f"{dtype_name}/rank{rank}/{k}": v for k, v in full.items()}
        torch.save(tensors, Path(out) / f"rank{rank}.pt")
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(notes))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def drive(backend: str) -> Tensors:
    out = cases.out / f"fsdp-{backend}"
    out.mkdir(parents=True, exist_ok=True)
    args = (str(out), str(cases.lesson_file), backend)
    cases.spawn(_rank, 2, *args, what=f"2 {backend} ranks", cuda=backend == "nccl")
    tensors, notes = {}, {}
    for rank in (0, 1):
        tensors |= torch.load(out / f"rank{rank}.pt", weights_only=True)
        notes[str(rank)] = json.loads((out / f"rank{rank}.json").read_text())
    return Tensors(tensors, {"notes": notes})


@cases.case
def fsdp_gloo(lesson):
    return drive("gloo")


@cases.case
def fsdp_nccl(lesson):
    """On 2 GPUs only (the test marks its nccl run gpus(2))."""
    if torch.cuda.device_count() < 2:
        return None
    return drive("nccl")


if __name__ == "__main__":
    cases.run(requires=("MiniFSDP",))
