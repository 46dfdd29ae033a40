"""Lesson 13's mixture of experts, called in one child process (course/grader/cases.py).

Run by tests/lessons/test_13_experts.py as `python lesson_13.py LESSON_FILE OUT_DIR`. Case
`routing` calls route on router outputs skewed towards two experts, and kept and
balance_loss on the grader's own routing of them (so that each is graded alone). Case
`layer` loads the grader's router and experts (tests/lessons/cases/lesson_13_models.py)
into the submission's MoE, runs a forward and a backward of (output x w).sum() plus the
balancing loss, and writes the output, the loss and every gradient. Case `layer_cuda`
does the same on one GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import lesson_13_models as m  # noqa: E402

from course.grader.cases import Cases, Tensors  # noqa: E402
from course.grader.tolerances import seed  # noqa: E402

cases = Cases()
REQUIRES = ("route", "kept", "balance_loss", "MoE")
SEED = seed(4)  # tests/lessons/test_13_experts.py's


@cases.case
def routing(lesson):
    logits = m.skewed_logits(SEED)
    probs, gates, experts = lesson.route(logits, m.K)
    _, ref_experts = m.route(logits)[0], m.route(logits)[2]
    keep = lesson.kept(ref_experts, m.E, m.capacity(m.TOKENS))
    loss = lesson.balance_loss(m.route(logits)[0], ref_experts, m.E)
    starved, _, unchosen = m.route(m.last_expert_unchosen(logits))
    unused = lesson.balance_loss(starved, unchosen, m.E)
    return Tensors({"probs": probs, "gates": gates, "experts": experts, "keep": keep,
                    "loss": torch.as_tensor(loss).reshape(()),
                    "loss_unused": torch.as_tensor(unused).reshape(())})  # fmt: skip


def _layer(lesson, device: str = "cpu") -> Tensors:
    router, experts = m.experts_like(SEED)
    moe = lesson.MoE(m.DIM, m.E, m.K, m.FACTOR)
    with torch.no_grad():
        moe.router.weight.copy_(router.weight)
        for mine, theirs in zip(moe.experts, experts, strict=True):
            mine.load_state_dict(theirs.state_dict())
    moe.to(device)
    x, w = (t.to(device) for t in m.inputs(SEED))
    x.requires_grad_()
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)  # what the forward computes, in any call form
    with counter:
        out, aux, stats = moe(x)
    ((out * w).sum() + aux).backward()
    found = {"out": out.detach(), "aux": aux.detach().reshape(()), "x": x.grad,
             "router": moe.router.weight.grad}  # fmt: skip
    for e, expert in enumerate(moe.experts):
        for name, p in expert.named_parameters():
            found[f"{e}.{name}"] = p.grad if p.grad is not None else torch.zeros_like(p)
    found = {k: v.cpu() for k, v in found.items()}
    return Tensors(found, {"load": stats["load"].tolist(), "dropped": int(stats["dropped"]),
                           "flops": int(counter.get_total_flops())})  # fmt: skip


@cases.case
def layer(lesson):
    return _layer(lesson)


@cases.case
def layer_cuda(lesson):
    """The same on one GPU (the test marks it gpus(1)), TF32 off: float32 as on the CPU."""
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    return _layer(lesson, "cuda")


if __name__ == "__main__":
    cases.run(requires=REQUIRES)
