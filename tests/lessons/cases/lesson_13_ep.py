"""Lesson 13's expert parallelism, in gloo ranks forked from a child process
(course/grader/cases.py).

Run by tests/lessons/test_13_experts.py as `python lesson_13_ep.py LESSON_FILE OUT_DIR`.
Case `ep`: WORLD ranks (2 or 4, drawn from the grading seed) split the grader's 8 experts
(tests/lessons/cases/lesson_13_models.py) with the submission's ExpertParallel; each rank
routes its own tokens (rank 0's leave the last expert out), and runs a forward and a backward
of (output x w).sum(). Case
`ep_dp`: 4 ranks as 2 groups of 2 (the submission's `groups`), each rank's loss its
tokens' mean, then the submission's average_gradients. Each rank writes its output and
gradients, and what the grading kit's recorder saw below torch.distributed: every
collective, its phase and bytes; and which of torch's differentiable all-to-alls (a
tripwire each) did the hand-written AllToAll's work.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
import lesson_13_models as m  # noqa: E402

from course.grader.cases import Cases, Tensors  # noqa: E402
from course.grader.tolerances import seed  # noqa: E402
from course.measure.comm import CommRecorder  # noqa: E402
from course.measure.draws import draw  # noqa: E402
from course.measure.tripwires import DIFFERENTIABLE_ALL_TO_ALL, Tripwires, naming_shortcuts  # noqa: E402

cases = Cases()
REQUIRES = ("ExpertParallel", "AllToAll", "groups", "average_gradients")
WORLD = draw("13.ep_ranks", (2, 4))
SEED = seed(6)  # tests/lessons/test_13_experts.py's
FACTOR = 1.25


@contextlib.contextmanager
def gloo_list_form_explained():
    """gloo's list-form all_to_all takes tensors of one size only (ProcessGroupGloo::alltoall
    checks each against the first): with routing's uneven counts it cannot work there.
    Say so, instead of gloo's one line about a tensor's size."""
    try:
        yield
    except RuntimeError as err:
        if "ProcessGroupGloo::alltoall" not in str(err):
            raise
        raise RuntimeError(
            "dist.all_to_all (the list form) on gloo needs every tensor the same size, and "
            "routing sends each rank a different number of rows; gloo said: "
            f"{str(err).splitlines()[0]}. Use dist.all_to_all_single with output and input "
            "split sizes (gloo supports those); the list form works on nccl"
        ) from None


def _rank(rank, world, port, out, lesson_file, how):
    from course import ranks
    from course.grader import submission

    torch.set_num_threads(1)
    # The hand-written AllToAll is the exercise: torch's differentiable ones are tripwired.
    wires = Tripwires(*DIFFERENTIABLE_ALL_TO_ALL, log=Path(out, f"rank{rank}.tripwires"))
    wires.install()  # before the lesson loads: `from x import y` binds
    lesson = submission.load(Path(lesson_file), requires=REQUIRES)
    ranks.join_local(rank, world, "gloo", port)
    try:
        router, experts = m.experts_like(SEED)
        if how == "ep":
            group, same = dist.group.WORLD, None
        else:
            group, same = lesson.groups(world, 2)
        layer = lesson.ExpertParallel(router, experts, m.K, FACTOR, group)
        x, w = m.ep_inputs(SEED, rank, router)  # rank 0 sends the last expert nothing
        x.requires_grad_()
        recorder = CommRecorder()
        with recorder, gloo_list_form_explained():
            with recorder.during("forward"):
                y, aux, _ = layer(x)
            with recorder.during("backward"):
                loss = (y * w).sum() if how == "ep" else (y * w).sum() / len(x)
                loss.backward()
            if how == "ep_dp":
                with recorder.during("average"):
                    lesson.average_gradients(layer, layer.local, same, world)
        tensors = {"out": y.detach(), "x": x.grad, "router": router.weight.grad}
        held = [e for e, ex in enumerate(experts) if ex[0].weight.grad is not None]
        for e in held:
            for name, p in experts[e].named_parameters():
                tensors[f"{e}.{name}"] = p.grad
        records = [{k: r[k] for k in ("op", "phase", "bytes", "received", "dtypes", "group")}
                   for r in recorder.records]  # fmt: skip
        torch.save(tensors, Path(out) / f"rank{rank}.pt")
        found = {"held": held, "records": records, "library": wires.used}
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(found))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(how: str, world: int):
    out = cases.out / how
    out.mkdir(parents=True, exist_ok=True)
    with naming_shortcuts(out, "AllToAll"):
        cases.spawn(_rank, world, str(out), str(cases.lesson_file), how,
                    what=f"{world} gloo ranks running ExpertParallel ({how})")  # fmt: skip
    tensors, found = {}, {"world": world}
    for rank in range(world):
        got = torch.load(out / f"rank{rank}.pt", weights_only=True)
        tensors |= {f"rank{rank}/{k}": v for k, v in got.items()}
        found[str(rank)] = json.loads((out / f"rank{rank}.json").read_text())
    return Tensors(tensors, found)


@cases.case
def ep(lesson):
    return _spawn("ep", WORLD)


@cases.case
def ep_dp(lesson):
    return _spawn("ep_dp", 4)


if __name__ == "__main__":
    cases.run(requires=REQUIRES)
