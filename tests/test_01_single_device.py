"""Grades lesson 01: one device (lessons/01_single_device/train.py).

Two script runs are shared by several tests (module-scoped fixtures): the
default digits run and a run on a generated image folder. The resume test runs
the lesson's `main` in this process, which skips the cost of importing torch.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from course import checkpoint, data, lessons, models, procs
from course.grading import load_lesson

LESSON = lessons.get("01")
FUNCTIONS = ("parse_args", "train_one_epoch", "evaluate", "checkpoint_state", "restore", "main")
CHECKPOINT_KEYS = {"model", "optimizer", "epoch", "step", "rng"}


@pytest.fixture
def train(impl):
    return load_lesson(impl, LESSON, requires=FUNCTIONS)


def run_once(impl, folder, *args, timeout=90):
    """Run the lesson script in `folder`; fail every test that uses it if it fails."""
    return procs.run(
        [sys.executable, str(LESSON.path(impl)), *map(str, args)], timeout=timeout, cwd=folder
    )


def ok(result):
    if not result.ok:
        pytest.fail(result.describe(), pytrace=False)
    return result


@pytest.fixture(scope="module")
def digits_run(impl, tmp_path_factory):
    """The default run, on the CPU, with a metrics file."""
    folder = tmp_path_factory.mktemp("digits")
    result = run_once(
        impl, folder, "--device", "cpu", "--epochs", "3", "--quiet", "--metrics-out", "metrics.json"
    )
    return result, folder


@pytest.fixture(scope="module")
def resume_runs(impl, tmp_path_factory):
    """In this process: 2 epochs straight, and 1 epoch + a resumed 2nd; returns both folders."""
    train = load_lesson(impl, LESSON, requires=FUNCTIONS)
    folder = tmp_path_factory.mktemp("resume")
    common = ["--device", "cpu", "--batch-size", "128", "--quiet"]
    straight, split = folder / "straight", folder / "split"
    train.main([*common, "--epochs", "2", "--checkpoint", str(straight / "last.pt")])
    train.main([*common, "--epochs", "1", "--checkpoint", str(split / "last.pt")])
    torch.manual_seed(1234)  # disturb the global RNG: the resumed run must not depend on it
    metrics = train.main(
        [*common, "--epochs", "2", "--checkpoint", str(split / "last.pt"), "--resume"]
    )
    return straight, split, metrics


@pytest.fixture(scope="module")
def folder_run(impl, tmp_path_factory):
    """A run on an ImageFolder tree of generated PNGs (train/ and val/)."""
    folder = tmp_path_factory.mktemp("images")
    data.make_image_folder(folder / "tree", classes=3, per_class=24, val_per_class=8, size=16)
    result = run_once(
        impl, folder, "--device", "cpu", "--data", "tree", "--epochs", "3", "--batch-size", "16",
        "--num-workers", "0", "--quiet", "--metrics-out", "metrics.json",
    )  # fmt: skip
    return result, folder


def metrics_of(run):
    result, folder = run
    ok(result)
    return json.loads((folder / "metrics.json").read_text())


# --- the script, end to end ----------------------------------------------------


@pytest.mark.core
@pytest.mark.points(3)
def test_default_run_learns_digits_on_cpu(digits_run):
    metrics = metrics_of(digits_run)
    losses = [e["train_loss"] for e in metrics["epochs"]]
    assert losses[-1] < losses[0] * 0.5, f"the training loss barely moved: {losses}"
    assert metrics["final_accuracy"] >= 0.90, metrics["final_accuracy"]
    assert metrics["device"] == "cpu"


@pytest.mark.core
@pytest.mark.points(2)
def test_metrics_json_shape(digits_run):
    metrics = metrics_of(digits_run)
    assert {"device", "epochs", "final_accuracy", "steps", "images_per_second"} <= set(metrics)
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2, 3]
    for epoch in metrics["epochs"]:
        assert {"train_loss", "test_loss", "test_accuracy", "images_per_second"} <= set(epoch)
        assert 0.0 <= epoch["test_accuracy"] <= 1.0
    assert metrics["steps"] == 3 * 23  # 1438 training images in batches of 64
    assert metrics["images_per_second"] > 0


@pytest.mark.core
@pytest.mark.points(2)
def test_learns_an_image_folder(folder_run):
    metrics = metrics_of(folder_run)
    losses = [e["train_loss"] for e in metrics["epochs"]]
    assert losses[-1] < losses[0], f"the training loss did not decrease: {losses}"
    assert metrics["final_accuracy"] >= 0.9, metrics["final_accuracy"]


@pytest.mark.core
@pytest.mark.points(2)
def test_checkpoint_is_complete_and_written_atomically(resume_runs):
    straight, _, _ = resume_runs
    files = sorted(p.name for p in straight.iterdir())
    assert files == ["last.pt"], f"temporary files left next to the checkpoint: {files}"
    state = checkpoint.load(straight / "last.pt")
    assert CHECKPOINT_KEYS <= set(state), f"missing {CHECKPOINT_KEYS - set(state)}"
    assert (state["epoch"], state["step"]) == (2, 24)  # 1438 images in batches of 128
    model = models.build_model("cnn", 10, 1)
    model.load_state_dict(state["model"])  # loads into a fresh model, strict
    assert state["optimizer"]["state"], "the optimizer state (momentum) is empty"


@pytest.mark.core
@pytest.mark.points(4)
def test_resume_is_bit_exact(resume_runs):
    """2 epochs straight == 1 epoch, stop, resume for 1 more: the same bits, on the CPU."""
    straight, split, metrics = resume_runs
    assert metrics["start_epoch"] == 1
    a, b = checkpoint.load(straight / "last.pt"), checkpoint.load(split / "last.pt")
    assert (a["epoch"], a["step"]) == (b["epoch"], b["step"]) == (2, 24)
    differ = [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]
    assert not differ, f"resumed weights differ from the uninterrupted run's: {differ[:5]}"
    for key, buf in a["optimizer"]["state"].items():
        assert torch.equal(buf["momentum_buffer"], b["optimizer"]["state"][key]["momentum_buffer"])


# --- the functions, in this process ---------------------------------------------


def tiny_problem(n=64):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=gen)
    y = (x[:, 0] > 0).long()  # learnable by a linear model
    return DataLoader(TensorDataset(x, y), batch_size=16)


@pytest.mark.core
@pytest.mark.points(2)
def test_train_one_epoch_takes_optimizer_steps(train):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = tiny_problem()
    first, images, steps = train.train_one_epoch(model, loader, optimizer, torch.device("cpu"))
    assert (images, steps) == (64, 4)
    for _ in range(5):
        last, _, _ = train.train_one_epoch(model, loader, optimizer, torch.device("cpu"))
    assert last < first * 0.7, (first, last)
    _, images, steps = train.train_one_epoch(model, loader, optimizer, torch.device("cpu"), 2)
    assert (images, steps) == (32, 2), "max_steps is not respected"


class Fixed(nn.Module):
    """Predicts class 0 for the first half of the inputs and class 1 for the rest."""

    def forward(self, x):
        logits = torch.zeros(len(x), 2)
        logits[:, 0] = (x[:, 0] < 0).float() * 2.0
        logits[:, 1] = (x[:, 0] > 0).float() * 2.0
        return logits


@pytest.mark.core
@pytest.mark.points(2)
def test_evaluate_counts_accuracy_and_loss(train):
    x = torch.tensor([[-1.0], [-1.0], [1.0], [1.0]])
    y = torch.tensor([0, 1, 1, 1])  # predictions 0, 0, 1, 1: three of four right
    loader = DataLoader(TensorDataset(x, y), batch_size=3)  # uneven batches
    loss, accuracy = train.evaluate(Fixed(), loader, torch.device("cpu"))
    assert accuracy == pytest.approx(0.75)
    expected = nn.functional.cross_entropy(Fixed()(x), y).item()
    assert loss == pytest.approx(expected, rel=1e-5)


@pytest.mark.core
@pytest.mark.points(2)
def test_checkpoint_state_round_trip(train, tmp_path):
    torch.manual_seed(0)
    model = models.build_model("cnn", 10, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 1, 8, 8)).sum().backward()
    optimizer.step()
    path = checkpoint.save(train.checkpoint_state(model, optimizer, 3, 42), tmp_path / "c.pt")
    expected_draw = torch.rand(3)
    fresh = models.build_model("cnn", 10, 1)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    assert train.restore(checkpoint.load(path), fresh, fresh_opt) == (3, 42)
    assert torch.equal(torch.rand(3), expected_draw), "the RNG state was not restored"
    for key, value in model.state_dict().items():
        assert torch.equal(value, fresh.state_dict()[key]), key
    assert fresh_opt.state_dict()["state"], "the optimizer's momentum was not restored"


# --- errors a user makes ---------------------------------------------------------


@pytest.mark.points(1)
@pytest.mark.parametrize(
    "argv",
    [["--epochs", "0"], ["--batch-size", "many"], ["--lr", "-1"], ["--resume"], ["--model", "x"]],
    ids=["epochs-0", "batch-size-text", "negative-lr", "resume-without-checkpoint", "model"],
)
def test_bad_flags_give_one_line(train, capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        train.parse_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "error" in err, err


@pytest.mark.points(1)
def test_missing_data_folder_gives_one_line(impl, run_script, tmp_path):
    result = run_script(LESSON.path(impl), "--data", tmp_path / "missing", check=False)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.returncode not in (0, None), result.describe()
    assert len(lines) == 1, f"expected one line, got:\n{result.output}"
    assert lines[0].startswith("train.py: error:") and "no such folder" in lines[0]


@pytest.mark.points(1)
def test_cuda_requested_without_cuda_is_a_clear_error(train, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available"):
        train.main(["--device", "cuda", "--quiet"])


# --- on a GPU machine --------------------------------------------------------------


@pytest.mark.gpus(1)
@pytest.mark.points(2)
def test_trains_and_resumes_on_cuda(impl, run_script, tmp_path):
    """2 epochs on cuda:0, then resumed to 3 from the checkpoint (exact bits are CPU-only)."""
    path = LESSON.path(impl)
    args = ["--device", "cuda", "--quiet", "--checkpoint", "gpu.pt"]
    run_script(path, *args, "--epochs", "2", timeout=120)
    run_script(path, *args, "--epochs", "3", "--resume", "--metrics-out", "gpu.json", timeout=120)
    metrics = json.loads((tmp_path / "gpu.json").read_text())
    assert metrics["device"] == "cuda:0" and metrics["start_epoch"] == 2
    assert metrics["final_accuracy"] >= 0.9, metrics["final_accuracy"]
    state = checkpoint.load(tmp_path / "gpu.pt")  # map_location="cpu": loads anywhere
    assert state["epoch"] == 3
    models.build_model("cnn", 10, 1).load_state_dict(state["model"])
