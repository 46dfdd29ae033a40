"""Lesson 01's functions, called in a child process (course/grader/cases.py).

Run by tests/lessons/test_01_single_device.py as `python lesson_01.py LESSON_FILE OUT_DIR`,
in the test's own folder: the resume case writes its checkpoints there.
"""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from course import checkpoint, models
from course.grader.cases import Cases, Exit, Tensors, exits, raised
from course.grader.tolerances import seed

cases = Cases()
FUNCTIONS = ("parse_args", "train_one_epoch", "evaluate", "checkpoint_state", "restore", "main")
CPU = torch.device("cpu")


def tiny_problem(n=64):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=gen)
    y = (x[:, 0] > 0).long()  # learnable by a linear model
    return DataLoader(TensorDataset(x, y), batch_size=16)


@cases.case
def train_one_epoch(lesson):
    """Losses of 6 epochs on a learnable problem, and what one epoch and max_steps count."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = tiny_problem()
    losses, counts = [], []
    for _ in range(6):
        loss, images, steps = lesson.train_one_epoch(model, loader, optimizer, CPU)
        losses.append(loss)
        counts.append([images, steps])
    _, images, steps = lesson.train_one_epoch(model, loader, optimizer, CPU, 2)
    return {"losses": losses, "counts": counts, "max_steps_2": [images, steps]}


class Fixed(nn.Module):
    """Predicts class 0 for negative inputs and class 1 for positive ones; has no weights."""

    def forward(self, x):
        logits = torch.zeros(len(x), 2)
        logits[:, 0] = (x[:, 0] < 0).float() * 2.0
        logits[:, 1] = (x[:, 0] > 0).float() * 2.0
        return logits


class ModeAware(nn.Module):
    """Right in eval mode, always wrong in train mode: evaluate must call model.eval()."""

    def forward(self, x):
        logits = Fixed()(x)
        return logits if not self.training else logits.flip(1)


EVAL_X = torch.tensor([[-1.0], [-1.0], [1.0], [1.0]])
EVAL_Y = torch.tensor([0, 1, 1, 1])  # predictions 0, 0, 1, 1: three of four right


@cases.case
def evaluate(lesson):
    loader = DataLoader(TensorDataset(EVAL_X, EVAL_Y), batch_size=3)  # uneven batches
    loss, accuracy = lesson.evaluate(Fixed(), loader, CPU)
    _, mode_accuracy = lesson.evaluate(ModeAware().train(), loader, CPU)
    return {"loss": loss, "accuracy": accuracy, "train_mode_model_accuracy": mode_accuracy}


@cases.case
def checkpoint_round_trip(lesson):
    torch.manual_seed(0)
    model = models.build_model("cnn", 10, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 1, 8, 8)).sum().backward()
    optimizer.step()
    state = lesson.checkpoint_state(model, optimizer, 3, 42)
    keys = sorted(state) if isinstance(state, dict) else repr(type(state))
    path = checkpoint.save(state, "round_trip.pt")
    expected_draw = torch.rand(3)
    fresh = models.build_model("cnn", 10, 1)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    returned = lesson.restore(checkpoint.load(path), fresh, fresh_opt)
    draw = torch.rand(3)
    tensors = {f"saved/{k}": v for k, v in model.state_dict().items()}
    tensors |= {f"restored/{k}": v for k, v in fresh.state_dict().items()}
    tensors |= {"expected_draw": expected_draw, "draw": draw}
    extra = {
        "keys": keys,
        "returned": list(returned) if isinstance(returned, tuple) else repr(returned),
        "momentum_restored": bool(fresh_opt.state_dict()["state"]),
    }
    return Tensors(tensors, extra)


@cases.case
def resume(lesson):
    """2 epochs straight; 1 epoch, then resumed for a 2nd, with the global RNG disturbed."""
    common = ["--device", "cpu", "--batch-size", "128", "--quiet"]
    for folder in ("straight", "split"):  # course.checkpoint.save would make them; torch.save not
        Path(folder).mkdir(exist_ok=True)
    lesson.main([*common, "--epochs", "2", "--checkpoint", "straight/last.pt"])
    lesson.main([*common, "--epochs", "1", "--checkpoint", "split/last.pt"])
    torch.manual_seed(1234)  # the resumed run must not depend on the global RNG
    metrics = lesson.main([*common, "--epochs", "2", "--checkpoint", "split/last.pt", "--resume"])
    return {"start_epoch": metrics.get("start_epoch") if isinstance(metrics, dict) else None}


@cases.case
def reference_recipe(lesson):
    """--epochs 2 cut to one epoch by --max-steps 12, at --norm none --seed 3 --lr 0.1 with
    --channels-last (no flag at its default): the grader trains the same recipe itself and
    compares the weights."""
    argv = ["--device", "cpu", "--batch-size", "128", "--epochs", "2", "--max-steps", "12"]
    argv += ["--norm", "none", "--channels-last"]
    Path("ref").mkdir(exist_ok=True)
    chosen = str(seed(3))  # a measurement of the bound runs other seeds (course tolerances)
    lesson.main([*argv, "--seed", chosen, "--lr", "0.1", "--quiet", "--checkpoint", "ref/last.pt"])
    return {}


BAD_FLAGS = {
    "epochs-0": ["--epochs", "0"],
    "batch-size-text": ["--batch-size", "many"],
    "negative-lr": ["--lr", "-1"],
    "resume-without-checkpoint": ["--resume"],
    "model": ["--model", "x"],
}

for name, argv in BAD_FLAGS.items():

    def bad_flags(lesson, argv=argv):
        got = exits(lesson.parse_args, argv)
        return got if isinstance(got, Exit) else None  # None: the flags were accepted

    bad_flags.__name__ = f"bad_flags_{name}"
    cases.case(bad_flags)


@cases.case
def cuda_without_cuda(lesson):
    with mock.patch.object(torch.cuda, "is_available", lambda: False):
        return raised(lesson.main, ["--device", "cuda", "--quiet"])


if __name__ == "__main__":
    cases.run(requires=FUNCTIONS)
