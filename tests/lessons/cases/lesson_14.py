"""Lesson 14's composed runs, in 8 gloo ranks forked from a child process
(course/grader/cases.py).

Run by tests/lessons/test_14_composing.py as `python lesson_14.py LESSON_FILE OUT_DIR`.
Every run builds the grader's model (tests/lessons/cases/lesson_14_models.py) with the
submission's make_mesh, stage_of, parallelize and pipeline, and trains it with the
grader's own loop on the grader's batches.

Case `layout`: make_mesh on (pp 2, dp 2, tp 2), and stage_of on the rank's stage; each
rank writes its mesh groups and what its stage holds (no step: cheap).

Case `composed`: mesh (pp 2, dp 2, tp 2), 2 steps. Each rank writes its mesh groups, every
collective the grading kit's recorder saw in each step (kind, group, bytes, dtype, peer),
and its loss; one rank per stage writes the stage's step-1 gradients, gathered whole.

Case `shapes`: the 1-D FSDP control (dp 8) and (dp 2, tp 4), (dp 4, tp 2), (pp 2, dp 2,
tp 2), each STEPS steps from the same seed, each rank noting the bytes of its parameters'
local parts. The last saves a checkpoint at SAVED_AT with
torch.distributed.checkpoint, which (dp 4, tp 2) loads and trains on; then this process,
alone, loads it into the whole model and trains on too.

Case `one_gpu`: the one-rank mesh (pp 1, dp 1, tp 1) on a GPU, nccl, STEPS steps.
"""

from __future__ import annotations

import json
import logging
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
import lesson_14_models as m  # noqa: E402

from course.grader.cases import Cases, Tensors  # noqa: E402
from course.grader.tolerances import seed  # noqa: E402
from course.measure.comm import CommRecorder  # noqa: E402
from course.measure.draws import draw  # noqa: E402

cases = Cases()
REQUIRES = ("make_mesh", "stage_of", "parallelize", "pipeline")
SEED = seed(7)  # tests/lessons/test_14_composing.py's
# Never the pp size (2): a schedule given pp.size() micro-batches instead of its argument
# runs the same steps when they are equal.
MICRO = draw("14.micro_batches", (4, 8))
WORLD = 8
KEPT = ("op", "phase", "bytes", "received", "dtypes", "group", "peer")


def _whole(t):
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


class Run:
    """One shape's model, built with the submission's functions, and the grader's loop."""

    def __init__(self, lesson, shape, summed: bool, device: str = "cpu"):
        pp, dp, tp = shape
        self.shape, self.summed, self.device = shape, summed, device
        self.mesh = lesson.make_mesh(device, pp, dp, tp)
        self.stage = self.mesh["pp"].get_local_rank()
        self.dp_rank, self.tp_rank = (self.mesh[a].get_local_rank() for a in ("dp", "tp"))
        model = m.whole(SEED)
        cut = lesson.stage_of(model, self.stage, pp)
        self.model = (model if cut is None else cut).to(device)
        lesson.parallelize(self.model, self.mesh)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=m.LR)
        self.schedule = None
        if pp > 1:
            self.schedule = lesson.pipeline(self.model, self.mesh, MICRO, torch.device(device))

    @property
    def writer(self) -> bool:
        """The rank that writes its stage's tensors: the stage's first."""
        return self.dp_rank == 0 and self.tp_rank == 0

    def step(self, step: int) -> float | None:
        """One training step; this rank's loss (its share of the batch) on the last stage,
        else None."""
        loss = self.backward(step)
        self.update()
        return loss

    def backward(self, step: int) -> float | None:
        pp, dp, _ = self.shape
        tokens, targets = (t.chunk(dp)[self.dp_rank].to(self.device) for t in m.batch(step))
        first, last = self.stage == 0, self.stage == pp - 1
        if self.schedule is None:
            loss = F.cross_entropy(self.model(tokens).flatten(0, 1), targets.flatten())
            loss.backward()
        else:
            losses = []
            kwargs = dict(target=targets, losses=losses) if last else {}
            self.schedule.step(*([tokens] if first else []), **kwargs)
            loss = torch.stack(losses).mean() if last else None
        for p in self.model.parameters() if self.summed else ():  # torch 2.8's gloo: a sum
            p.grad /= dp
        return loss.item() if last else None

    def update(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def whole_grads(self) -> dict:
        """The stage's gradients, whole (a collective per tensor, on the stage's ranks)."""
        return {f"grad/{n}": _whole(p.grad) for n, p in self.model.named_parameters()}

    def whole_state(self) -> dict:
        """The stage's weights and AdamW's first moments, whole (a collective per tensor)."""
        state = {}
        for name, p in self.model.named_parameters():
            state[f"param/{name}"] = _whole(p.detach())
            state[f"exp_avg/{name}"] = _whole(self.optimizer.state[p]["exp_avg"])
        return state


def _save(run: Run, path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(run.model, run.optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)


def _load(model, optimizer, path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])  # fmt: skip


def _layout(lesson, rank: int, out: Path, summed: bool) -> dict:
    """The mesh and the stage only: no parallelize, no step."""
    mesh = lesson.make_mesh("cpu", *m.COMPOSED)
    stage = mesh["pp"].get_local_rank()
    model = m.whole(SEED)
    cut = lesson.stage_of(model, stage, m.COMPOSED[0])
    model = model if cut is None else cut
    return {
        "groups": {a: mesh[a].mesh.flatten().tolist() for a in ("pp", "dp", "tp")},
        "blocks": sorted(int(k) for k in model.blocks) if model.blocks else [],
        "embed": model.embed is not None,
        "norm": model.norm is not None,
        "head": model.head is not None,
        "stage": stage,
    }


def _composed(lesson, rank: int, out: Path, summed: bool) -> dict:
    run = Run(lesson, m.COMPOSED, summed)
    found = {
        "groups": {a: run.mesh[a].mesh.flatten().tolist() for a in ("pp", "dp", "tp")},
        "stage": run.stage,
        "local_bytes": sum(getattr(p, "_local_tensor", p).nbytes for p in run.model.parameters()),
    }
    losses, recorder = [], CommRecorder()
    for step in (1, 2):
        with recorder, recorder.during(str(step)):
            losses.append(run.backward(step))
        if step == 1:  # outside the recorder: gathering them whole is the grader's doing
            grads = run.whole_grads()
            if run.writer:
                torch.save(grads, out / f"rank{rank}.pt")
        with recorder, recorder.during(str(step)):
            run.update()
    found["records"] = [{k: r.get(k) for k in KEPT} for r in recorder.records]
    found["losses"] = losses
    return found


def _held(run: Run) -> dict:
    """Where this rank sits in its run's mesh, and the bytes of its parameters' local parts:
    what the tests add up per stage and tp rank, to see every axis of the shape at work."""
    local = sum(getattr(p, "_local_tensor", p).nbytes for p in run.model.parameters())
    return {"stage": run.stage, "tp_rank": run.tp_rank, "local_bytes": local}


def _shapes(lesson, rank: int, out: Path, summed: bool) -> dict:
    found = {"held": {}}
    for shape in m.SHAPES:
        run = Run(lesson, shape, summed)
        losses, name = [], ",".join(map(str, shape))
        found["held"][name] = _held(run)
        for step in range(1, m.STEPS + 1):
            losses.append(run.step(step))
            if shape == m.COMPOSED and step == m.SAVED_AT:
                _save(run, out / "checkpoint")
                state = run.whole_state()
                if run.writer:
                    torch.save(state, out / f"saved{rank}.pt")
        found[name] = losses
        del run
    run = Run(lesson, m.RESUMED, summed)
    found["held"]["resumed"] = _held(run)
    _load(run.model, run.optimizer, out / "checkpoint")
    state = run.whole_state()
    if rank == 0:
        torch.save(state, out / "loaded.pt")
    found["resumed"] = [run.step(step) for step in range(m.SAVED_AT + 1, m.STEPS + 1)]
    return found


def _one_gpu(lesson, rank: int, out: Path, summed: bool) -> dict:
    """The one-rank mesh (pp 1, dp 1, tp 1) on a GPU, STEPS steps: what lesson 14's script
    does on a machine with one GPU."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    run = Run(lesson, (1, 1, 1), summed, device="cuda")
    losses = [run.step(step) for step in range(1, m.STEPS + 1)]
    devices = sorted({str(p.device.type) for p in run.model.parameters()})
    return {"losses": losses, "devices": devices}


def _rank(rank, world, port, out, lesson_file, how):
    from course import ranks
    from course.grader import submission

    torch.set_num_threads(1)
    # Gathering a 2-D-sharded tensor whole takes two all-gathers, and DTensor logs so.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    lesson = submission.load(Path(lesson_file), requires=REQUIRES)
    ranks.join_local(rank, world, "nccl" if how == "one_gpu" else "gloo", port)
    try:
        summed = not ranks.reduce_scatter_averages()
        work = {"layout": _layout, "composed": _composed, "shapes": _shapes,
                "one_gpu": _one_gpu}[how]  # fmt: skip
        found = work(lesson, rank, Path(out), summed)
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(found))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(how: str, world: int = WORLD) -> tuple[Path, dict]:
    out = cases.out / how
    out.mkdir(parents=True, exist_ok=True)
    cuda = how == "one_gpu"
    what = f"{world} {'nccl' if cuda else 'gloo'} rank(s) running the {how} case"
    cases.spawn(_rank, world, str(out), str(cases.lesson_file), how, cuda=cuda, what=what)
    found = {"micro_batches": MICRO, "summed": None}
    for rank in range(world):
        found[str(rank)] = json.loads((out / f"rank{rank}.json").read_text())
    return out, found


def _tensors(path: Path, prefix: str) -> dict:
    got = torch.load(path, weights_only=True)
    return {f"{prefix}/{k}": v for k, v in got.items()}


@cases.case
def one_gpu(lesson):
    """On one GPU only (the test marks it gpus(1))."""
    if not torch.cuda.is_available():
        return None
    return _spawn("one_gpu", world=1)[1]


@cases.case
def layout(lesson):
    return _spawn("layout")[1]


@cases.case
def composed(lesson):
    out, found = _spawn("composed")
    tensors = {}
    for rank in range(WORLD):
        if (out / f"rank{rank}.pt").exists():
            tensors |= _tensors(out / f"rank{rank}.pt", f"stage{found[str(rank)]['stage']}")
    return Tensors(tensors, found)


@cases.case
def shapes(lesson):
    out, found = _spawn("shapes")
    tensors = _tensors(out / "loaded.pt", "loaded")
    for path in sorted(out.glob("saved*.pt")):
        tensors |= _tensors(path, "saved")
    # One process, no process group: the checkpoint into the whole model, then on.
    model = m.whole(SEED + 1)  # other weights than the saved ones: the load must replace them
    optimizer = torch.optim.AdamW(model.parameters(), lr=m.LR)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.simplefilter("ignore", UserWarning)
        _load(model, optimizer, out / "checkpoint")
    for name, p in model.named_parameters():
        tensors[f"single/param/{name}"] = p.detach().clone()
        tensors[f"single/exp_avg/{name}"] = optimizer.state[p]["exp_avg"].clone()
    found["single"] = m.one_process(SEED, m.STEPS, model, optimizer, start=m.SAVED_AT)[0]
    return Tensors(tensors, found)


if __name__ == "__main__":
    cases.run(requires=REQUIRES)
