"""Grades lesson 02: nn.DataParallel (lessons/02_data_parallel/train_dp.py).

On a CPU machine DataParallel cannot split anything, so the CPU tests check
what holds everywhere: the wrapper is used only with 2+ GPUs, checkpoints are
a plain model's, the script trains. The `gpus(2)` tests check the real thing:
the same outputs and gradients as one device, and a 2-GPU training run.
"""

from __future__ import annotations

import copy
import json
import sys

import pytest
import torch
from torch import nn

from course import checkpoint, lessons, models, procs
from course.grading import load_lesson

LESSON = lessons.get("02")
FUNCTIONS = ("wrap_model", "unwrap", "checkpoint_state", "restore", "main")


@pytest.fixture
def dp(impl):
    return load_lesson(impl, LESSON, requires=FUNCTIONS)


@pytest.fixture(scope="module")
def cpu_run(impl, tmp_path_factory):
    """One CPU training run with a checkpoint and a metrics file, shared by three tests."""
    folder = tmp_path_factory.mktemp("dp_cpu")
    args = ["--device", "cpu", "--epochs", "3", "--quiet"]
    args += ["--checkpoint", "ckpt/last.pt", "--metrics-out", "metrics.json"]
    result = procs.run([sys.executable, str(LESSON.path(impl)), *args], timeout=90, cwd=folder)
    if not result.ok:
        pytest.fail(result.describe(), pytrace=False)
    return result, folder


@pytest.mark.core
@pytest.mark.points(2)
def test_wraps_only_with_two_or_more_gpus(dp):
    model = nn.Linear(3, 2)
    # DataParallel can be built on a CPU machine (it then runs the plain module),
    # so the choice can be checked anywhere.
    wrapped = dp.wrap_model(model, [0, 1])
    assert isinstance(wrapped, nn.DataParallel) and wrapped.module is model
    assert dp.wrap_model(model, [0]) is model, "one GPU: use the model itself"
    assert dp.wrap_model(model, []) is model, "no GPU: use the model itself"


@pytest.mark.core
@pytest.mark.points(2)
def test_unwrap(dp):
    model = nn.Linear(3, 2)
    assert dp.unwrap(nn.DataParallel(model)) is model
    assert dp.unwrap(model) is model


@pytest.mark.core
@pytest.mark.points(3)
def test_checkpoint_of_a_wrapped_model_loads_into_a_plain_one(dp, tmp_path):
    torch.manual_seed(0)
    model = models.build_model("cnn", 10, 1)
    wrapped = nn.DataParallel(model)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    state = dp.checkpoint_state(wrapped, optimizer, 1, 5)
    prefixed = [k for k in state["model"] if k.startswith("module.")]
    assert not prefixed, f"keys carry the DataParallel prefix: {prefixed[:3]}"
    path = checkpoint.save(state, tmp_path / "c.pt")
    plain = models.build_model("cnn", 10, 1)
    plain.load_state_dict(checkpoint.load(path)["model"])  # strict: every key matches
    assert all(
        torch.equal(a, b) for a, b in zip(plain.parameters(), model.parameters(), strict=True)
    )


@pytest.mark.core
@pytest.mark.points(3)
def test_script_trains_on_cpu_and_says_it_is_not_data_parallel(cpu_run):
    result, folder = cpu_run
    assert "DataParallel needs at least 2 GPUs" in result.output
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["device"] == "cpu" and metrics["data_parallel"] is False
    assert metrics["final_accuracy"] >= 0.9, metrics["final_accuracy"]
    assert metrics["global_batch_size"] == 64


@pytest.mark.core
@pytest.mark.points(2)
def test_script_checkpoint_has_plain_keys(cpu_run):
    _, folder = cpu_run
    assert sorted(p.name for p in (folder / "ckpt").iterdir()) == ["last.pt"]
    state = checkpoint.load(folder / "ckpt" / "last.pt")
    assert not any(k.startswith("module.") for k in state["model"])
    models.build_model("cnn", 10, 1).load_state_dict(state["model"])
    assert state["epoch"] == 3


@pytest.mark.points(1)
def test_trains_with_bf16_autocast_and_channels_last(impl, run_script, tmp_path):
    """--amp bf16 --channels-last (what `python -m course bench` varies) still learns."""
    args = ["--device", "cpu", "--epochs", "2", "--quiet", "--amp", "bf16", "--channels-last"]
    run_script(LESSON.path(impl), *args, "--metrics-out", "m.json", timeout=90)
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["final_accuracy"] >= 0.8, metrics["final_accuracy"]


@pytest.mark.points(1)
def test_gpus_flag_on_cpu_is_a_clear_error(dp):
    with pytest.raises(ValueError, match="needs CUDA"):
        dp.main(["--device", "cpu", "--gpus", "2"])


# --- on a machine with 2+ GPUs ------------------------------------------------------


@pytest.mark.gpus(2)
@pytest.mark.points(3)
def test_data_parallel_matches_one_device(dp, monkeypatch):
    """The same weights and batch give the same outputs and gradients through DataParallel.

    eval(): in train mode each replica's BatchNorm normalises its own half of
    the batch, which legitimately differs from the whole-batch statistics.
    TF32 is off and cuDNN deterministic, so both paths do plain fp32 math; what
    remains is the order of summation.
    """
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)  # --cudnn-benchmark turns it on
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    torch.manual_seed(0)
    single = models.build_model("cnn", 10, 3).cuda(0).eval()
    parallel = dp.wrap_model(copy.deepcopy(single), [0, 1]).eval()
    assert isinstance(parallel, nn.DataParallel)
    x = torch.randn(32, 3, 16, 16, device="cuda:0")
    y = torch.randint(0, 10, (32,), device="cuda:0")
    out_single, out_parallel = single(x), parallel(x)
    assert out_parallel.device == torch.device("cuda", 0)  # gathered on the output device
    torch.testing.assert_close(out_parallel, out_single, atol=1e-5, rtol=1e-4)
    nn.functional.cross_entropy(out_single, y).backward()
    nn.functional.cross_entropy(out_parallel, y).backward()
    named = dict(dp.unwrap(parallel).named_parameters())
    for name, p in single.named_parameters():
        torch.testing.assert_close(named[name].grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.gpus(2)
@pytest.mark.points(2)
def test_trains_on_two_gpus(impl, run_script, tmp_path):
    path = LESSON.path(impl)
    # 32 per GPU: the global batch of 64 that lesson 01 reaches 95+ % with.
    args = ["--device", "cuda", "--gpus", "2", "--batch-size", "32", "--epochs", "4", "--quiet"]
    run_script(path, *args, "--checkpoint", "c.pt", "--metrics-out", "m.json", timeout=120)
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["data_parallel"] is True and metrics["global_batch_size"] == 64
    assert metrics["final_accuracy"] >= 0.9
    models.build_model("cnn", 10, 1).load_state_dict(checkpoint.load(tmp_path / "c.pt")["model"])
