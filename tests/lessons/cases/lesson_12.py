"""Lesson 12's activation checkpointing, called in one child process (course/grader/cases.py).

Run by tests/lessons/test_12_long_sequences.py as `python lesson_12.py LESSON_FILE OUT_DIR`.
The grader's stack of 3 CausalBlocks with dropout (tests/lessons/cases/lesson_12_models.py)
runs two steps through the submission's Checkpoint (case `by_hand`) or run_block's "full"
and "selective" (case `torch_ways`, also with a stack input that needs no gradient), and
the case writes every gradient; then one step
more of each, measured: the bytes kept after forward (the saved-tensor meter and the
allocator), the most kept during backward, each block's forward calls, and the matmul
FLOPs of the step. Case `by_hand_cuda` runs the two steps on one GPU, beside the stack
unchecked there. torch.utils.checkpoint is behind a tripwire while the by-hand
Checkpoint runs: a Checkpoint that calls it is a shortcut, named.
"""

from __future__ import annotations

import sys
from pathlib import Path

from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import lesson_12_models as m  # noqa: E402

from course import memory  # noqa: E402
from course.grader.cases import Cases, Tensors, _error  # noqa: E402
from course.measure.tripwires import Tripwires  # noqa: E402

cases = Cases()
REQUIRES = ("Checkpoint", "run_block", "policy")
SEED = 5  # tests/lessons/test_12_long_sequences.py's CHECKPOINT_SEED
wires = Tripwires("checkpoint", "checkpoint_sequential", "CheckpointFunction").install()


def _measure(run) -> dict:
    """One step of the grader's stack, each block run by run(block, x), measured."""
    from torch.utils.flop_counter import FlopCounterMode

    stack = m.blocks(SEED)
    whole = nn.ModuleList(stack)
    x, w = m.inputs(SEED, 3)
    x.requires_grad_()
    found = {}
    with memory.SavedTensors(whole) as meter:
        out = x
        for block in stack:
            out = run(block, out)
        found["saved_after_forward"] = meter.live
        found["calls_forward"] = [b.calls for b in stack]
        (out * w).sum().backward()
        found["saved_peak"] = meter.peak
        found["calls_backward"] = [
            b.calls - f for b, f in zip(stack, found["calls_forward"], strict=True)
        ]
    x = x.detach().requires_grad_()
    with memory.Allocated("cpu") as held:
        out = x
        for block in stack:
            out = run(block, out)
    found["allocated_after_forward"] = held.net
    del out
    with FlopCounterMode(display=False) as flops:
        m.step(stack, run, x.detach(), w)
    found["flops"] = flops.get_total_flops()
    return found


@cases.case
def by_hand(lesson):
    before = list(wires.used)
    run = lambda block, x: lesson.Checkpoint.apply(block, x)  # noqa: E731
    grads = m.gradients(SEED, run)
    found = _measure(run)
    found["library"] = [n for n in wires.used if n not in before]
    return Tensors(grads, found)


@cases.case
def by_hand_cuda(lesson):
    """On one GPU (the test marks it gpus(1)): dropout draws from the CUDA generator, which
    the checkpoint must save and set again; the grader's stack unchecked, on the same GPU,
    is the reference."""
    import torch

    if not torch.cuda.is_available():
        return None
    run = lambda block, x: lesson.Checkpoint.apply(block, x)  # noqa: E731
    got = m.gradients(SEED, run, device="cuda")
    want = m.gradients(SEED, device="cuda")
    return Tensors(got | {f"reference/{k}": v for k, v in want.items()}, {})


@cases.case
def torch_ways(lesson):
    tensors, found = {}, {"errors": {}, "frozen_none": {}, "frozen_errors": {}}
    for mode in ("full", "selective"):
        run = lambda block, x, mode=mode: lesson.run_block(block, x, mode)  # noqa: E731
        try:  # one way's crash fails that way's tests, not the other's
            grads = m.gradients(SEED, run)
            if missing := [k for k, g in grads.items() if g is None]:
                raise RuntimeError(f"no gradient reached {', '.join(missing)} (None)")
            found[mode] = _measure(run)
        except Exception as err:  # noqa: BLE001 - the submission's failure, recorded
            e = _error(err, cases.lesson_file)
            where = f" at {e['where']}" if e["where"] else ""
            found["errors"][mode] = f"{e['type']}{where}: {e['message']}"
            continue
        tensors |= {f"{mode}/{k}": v for k, v in grads.items()}
        try:  # the stack's input needs no gradient: the blocks' parameters still get theirs
            frozen = m.gradients(SEED, run, frozen=True)
            found["frozen_none"][mode] = sorted(k for k, g in frozen.items() if g is None)
            tensors |= {f"{mode}/frozen/{k}": v for k, v in frozen.items() if v is not None}
        except Exception as err:  # noqa: BLE001 - the submission's failure, recorded
            e = _error(err, cases.lesson_file)
            found["frozen_errors"][mode] = f"{e['type']}: {e['message']}"
    found["none"] = _measure(lambda block, x: block(x))
    return Tensors(tensors, found)


if __name__ == "__main__":
    cases.run(requires=REQUIRES)
