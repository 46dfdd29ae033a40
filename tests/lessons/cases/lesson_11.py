"""Lesson 11's pipeline schedules, driven in three gloo ranks forked from a child process
(course/grader/cases.py).

Run by tests/lessons/test_11_model_parallel.py as `python lesson_11.py LESSON_FILE OUT_DIR`. Each
rank builds its stage of the grader's model (tests/lessons/cases/lesson_11_models.py), a `Costly`
stage that waits a controlled time in forward and backward and notes when, wraps it in
the submission's Pipe, and runs STEPS steps of the submission's gpipe and one_f_one_b;
then one step (after one to learn the shapes) of PyTorch's ScheduleGPipe and
Schedule1F1B as the submission's torch_schedule builds them, with a token cost. Every
step runs the same whole batch. Each rank writes its first step's gradients and
outputs, and every step's timings, loss and activation count; the test compares them
with the whole model run in one process.

The grading kit watches how the hand-written schedules work: torch.distributed.pipelining
is behind tripwires while they run (a gpipe built on ScheduleGPipe is a shortcut, named),
and the recorder notes each step's point-to-point messages below torch.distributed:
peer, bytes and dtype, whatever call sent them.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
import lesson_11_models as m  # noqa: E402

from course.grader.cases import Cases, Tensors  # noqa: E402
from course.measure.comm import CommRecorder  # noqa: E402
from course.measure.tripwires import PIPELINING, Tripwires, naming_shortcuts  # noqa: E402

cases = Cases()
SCHEDULES = ("gpipe", "1f1b", "torch-gpipe", "torch-1f1b")
REQUIRES = ("Pipe", "gpipe", "one_f_one_b", "torch_schedule")


def _run(lesson, name: str, stage, pipe, tokens, targets):
    """One step of schedule `name`; the loss on the last stage, else None."""
    if name == "gpipe":
        return lesson.gpipe(pipe, tokens.chunk(m.MICRO), targets.chunk(m.MICRO))
    if name == "1f1b":
        return lesson.one_f_one_b(pipe, tokens.chunk(m.MICRO), targets.chunk(m.MICRO))
    schedule = pipe.torch_schedule
    losses = []
    kwargs = dict(target=targets, losses=losses) if pipe.last else {}
    schedule.step(*([tokens] if pipe.first else []), **kwargs)
    return torch.stack(losses).mean() if pipe.last else None


def _rank(rank, world, port, out, lesson_file, only):
    from course import ranks
    from course.grader import submission

    torch.set_num_threads(1)  # 3 ranks on 2 cores: more threads would wait on each other
    by_hand = not any(name.startswith("torch") for name in only)
    if by_hand:  # before the lesson is loaded: its imports bind these
        wires = Tripwires(*PIPELINING, log=Path(out, f"rank{rank}.tripwires")).install()
    lesson = submission.load(Path(lesson_file), requires=REQUIRES)
    ranks.join_local(rank, world, "gloo", port)
    out = Path(out)
    tensors, found = {}, {}
    try:
        tokens, targets = m.batch(1)
        for name in only:
            torch_made = name.startswith("torch")  # graded on exactness and memory only
            stage = m.Costly(rank, 0.002 if torch_made else m.FORWARD_S)
            pipe = lesson.Pipe(stage, rank, world, (m.ROWS, m.SEQ, m.DIM), torch.device("cpu"))
            if torch_made:
                pipe.torch_schedule = lesson.torch_schedule(stage, pipe, name, m.MICRO)
                # Its first step also runs each stage once more, to learn the shapes: not graded.
                _run(lesson, name, stage, pipe, tokens, targets)
            steps = []
            for step in range(1, (1 if torch_made else m.STEPS) + 1):
                stage.reset()
                dist.barrier()  # every rank starts the step together
                # The first step's messages: the recorder's own cost (it sees every operator)
                # then weighs on one step's timing of three, whose median is graded.
                recorder = CommRecorder() if step == 1 else contextlib.nullcontext()
                with recorder:
                    loss = _run(lesson, name, stage, pipe, tokens, targets)
                messages = [{k: r[k] for k in ("op", "peer", "bytes", "dtypes")}
                            for r in recorder.records] if step == 1 else None  # fmt: skip
                steps.append({"events": stage.events, "most_alive": stage.most_alive,
                              "alive_after": stage.alive, "messages": messages,
                              "loss": None if loss is None else float(loss.detach())})  # fmt: skip
                if step == 1:
                    for key, grad in stage.gradients().items():
                        tensors[f"{name}/grad/{key}"] = grad.detach().clone()
                    if pipe.last and stage.outputs:
                        tensors[f"{name}/logits"] = torch.cat(stage.outputs)
            found[name] = steps
        if by_hand:
            found["library"] = wires.used
        torch.save(tensors, out / f"rank{rank}.pt")
        (out / f"rank{rank}.json").write_text(json.dumps(found))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _schedules(names):
    out = cases.out / "-".join(names)
    out.mkdir(parents=True, exist_ok=True)
    with naming_shortcuts(out, "gpipe and one_f_one_b"):
        cases.spawn(_rank, m.STAGES, str(out), str(cases.lesson_file), list(names),
                    what=f"{m.STAGES} gloo ranks running {', '.join(names)}")  # fmt: skip
    tensors, found = {}, {}
    for rank in range(m.STAGES):
        tensors |= {f"rank{rank}/{k}": v for k, v in
                    torch.load(out / f"rank{rank}.pt", weights_only=True).items()}  # fmt: skip
        found[str(rank)] = json.loads((out / f"rank{rank}.json").read_text())
    return Tensors(tensors, found)


@cases.case
def by_hand(lesson):
    return _schedules(("gpipe", "1f1b"))


@cases.case
def with_torch(lesson):
    return _schedules(("torch-gpipe", "torch-1f1b"))


if __name__ == "__main__":
    cases.run(requires=REQUIRES)
