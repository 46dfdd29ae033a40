"""Lesson 02's functions, called in a child process (course/grader/cases.py).

Run by tests/lessons/test_02_data_parallel.py as `python lesson_02.py LESSON_FILE OUT_DIR`.
"""

from __future__ import annotations

import copy
import os

# The cases build DataParallel on the CPU, whatever GPUs this machine has: on a machine
# with one GPU, DataParallel(model, device_ids=[0, 1]) would refuse a GPU that is not
# there (lesson 02's GPU runs are the tests marked gpus).
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch  # noqa: E402 - after hiding the GPUs
from torch import nn  # noqa: E402

from course import models  # noqa: E402
from course.grader.cases import Cases, Tensors, raised  # noqa: E402

cases = Cases()
FUNCTIONS = ("wrap_model", "unwrap", "checkpoint_state", "restore", "main")


def describe(got, model) -> dict:
    """What a wrap/unwrap call returned, as data: its type and what it holds."""
    inner = getattr(got, "module", None)
    return {"type": type(got).__name__, "is_model": got is model, "holds_model": inner is model}


@cases.case
def wrap_model(lesson):
    model = nn.Linear(3, 2)
    # DataParallel can be built on a CPU machine (it then runs the plain module).
    return {
        "two": describe(lesson.wrap_model(model, [0, 1]), model),
        "one": describe(lesson.wrap_model(model, [0]), model),
        "none": describe(lesson.wrap_model(model, []), model),
    }


@cases.case
def unwrap(lesson):
    model = nn.Linear(3, 2)
    return {
        "wrapped": describe(lesson.unwrap(nn.DataParallel(model)), model),
        "plain": describe(lesson.unwrap(model), model),
    }


@cases.case
def checkpoint_of_wrapped(lesson):
    torch.manual_seed(0)
    model = models.build_model("cnn", 10, 1)
    wrapped = nn.DataParallel(model)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    state = lesson.checkpoint_state(wrapped, optimizer, 1, 5)
    tensors = {f"saved/{k}": v for k, v in state["model"].items()}
    tensors |= {f"model/{k}": v for k, v in model.state_dict().items()}
    return Tensors(tensors)


@cases.case
def gpus_flag_on_cpu(lesson):
    return raised(lesson.main, ["--device", "cpu", "--gpus", "2"])


@cases.case
def data_parallel_on_two_gpus(lesson):
    """Outputs and gradients of one model and of its DataParallel copy, same batch.

    eval(): in train mode each replica's BatchNorm normalises its own half of
    the batch, which legitimately differs from the whole-batch statistics.
    TF32 off and cuDNN deterministic: both paths do plain fp32 math."""
    if torch.cuda.device_count() < 2:
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.manual_seed(0)
    single = models.build_model("cnn", 10, 3).cuda(0).eval()
    parallel = lesson.wrap_model(copy.deepcopy(single), [0, 1]).eval()
    x = torch.randn(32, 3, 16, 16, device="cuda:0")
    y = torch.randint(0, 10, (32,), device="cuda:0")
    out_single, out_parallel = single(x), parallel(x)
    nn.functional.cross_entropy(out_single, y).backward()
    nn.functional.cross_entropy(out_parallel, y).backward()
    named = dict(lesson.unwrap(parallel).named_parameters())
    tensors = {"out/single": out_single, "out/parallel": out_parallel}
    for name, p in single.named_parameters():
        tensors[f"grad_single/{name}"] = p.grad
        tensors[f"grad_parallel/{name}"] = named[name].grad
    extra = {"type": type(parallel).__name__, "output_device": str(out_parallel.device)}
    return Tensors(tensors, extra)


if __name__ == "__main__":
    cases.run(requires=FUNCTIONS)
