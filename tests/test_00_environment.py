"""Grades lesson 00: environment check (lessons/00_environment/env_check.py).

The CUDA-present cases are simulated with monkeypatch so they grade on any
laptop; the `gpus` tests check the same functions against real GPUs.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from course import lessons
from course.grading import load_lesson

LESSON = lessons.get("00")
FUNCTIONS = ("cuda_device_count", "library_report", "pick_backend", "device_for", "main")


@pytest.fixture
def env(impl):
    return load_lesson(impl, LESSON, requires=FUNCTIONS)


def fake_gpus(monkeypatch, count: int, nccl: bool = True):
    """Pretend this machine has `count` usable GPUs (0 = CUDA unusable)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    # A device count without a usable CUDA: what a broken driver looks like.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count or 2)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: nccl)


@pytest.mark.core
@pytest.mark.points(2)
@pytest.mark.parametrize("count", [1, 4])
def test_device_count_with_cuda(env, monkeypatch, count):
    fake_gpus(monkeypatch, count)
    assert env.cuda_device_count() == count


@pytest.mark.core
@pytest.mark.points(2)
def test_device_count_is_zero_when_cuda_is_unusable(env, monkeypatch):
    fake_gpus(monkeypatch, 0)
    assert env.cuda_device_count() == 0


@pytest.mark.core
@pytest.mark.points(2)
@pytest.mark.parametrize(
    ("count", "nccl", "expected"),
    [(2, True, "nccl"), (1, True, "nccl"), (0, True, "gloo"), (2, False, "gloo")],
    ids=["2-gpus", "1-gpu", "no-gpu", "no-nccl-in-build"],
)
def test_pick_backend(env, monkeypatch, count, nccl, expected):
    fake_gpus(monkeypatch, count, nccl)
    assert env.pick_backend() == expected


@pytest.mark.core
@pytest.mark.points(2)
def test_device_for_without_gpus_is_cpu(env, monkeypatch):
    fake_gpus(monkeypatch, 0)
    assert env.device_for(0) == torch.device("cpu")
    assert env.device_for(3) == torch.device("cpu")  # CPU ranks share the CPU


@pytest.mark.core
@pytest.mark.points(2)
def test_device_for_with_gpus_is_one_gpu_per_rank(env, monkeypatch):
    fake_gpus(monkeypatch, 2)
    assert [env.device_for(r) for r in (0, 1)] == [torch.device("cuda", 0), torch.device("cuda", 1)]


@pytest.mark.points(1)
@pytest.mark.parametrize("rank", [-1, 2])
def test_device_for_rejects_a_rank_without_a_gpu(env, monkeypatch, rank):
    fake_gpus(monkeypatch, 2)
    with pytest.raises(ValueError):
        env.device_for(rank)


@pytest.mark.core
@pytest.mark.points(2)
def test_library_report_matches_this_build(env):
    report = env.library_report()
    assert report["cudnn_available"] == torch.backends.cudnn.is_available()
    if report["cudnn_available"]:
        assert report["cudnn_version"] == torch.backends.cudnn.version()
    else:
        assert report["cudnn_version"] is None
    assert report["nccl_available"] == (dist.is_available() and dist.is_nccl_available())
    assert report["gloo_available"] == (dist.is_available() and dist.is_gloo_available())
    if report["nccl_available"] and torch.cuda.is_available():
        assert report["nccl_version"] == ".".join(map(str, torch.cuda.nccl.version()))
    else:
        assert report["nccl_version"] is None


@pytest.mark.points(1)
def test_json_report(env, capsys):
    env.main(["--json"])
    report = json.loads(capsys.readouterr().out)
    expected_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert report["gpu_count"] == expected_gpus
    assert report["backend"] in ("gloo", "nccl")


@pytest.mark.points(2)
def test_script_answers_the_gpu_question(impl, run_script, backend):
    """The script runs end to end and its all-reduce smoke test passes on `backend`."""
    result = run_script(LESSON.path(impl), "--smoke", "2", "--backend", backend, timeout=90)
    assert "How many GPUs does this process see?" in result.output
    assert f"smoke test passed: 2 processes, backend {backend}" in result.output
    ranks = "".join(result.rank_logs.values())
    assert "rank 0/2" in ranks and "rank 1/2" in ranks


@pytest.mark.gpus(1)
@pytest.mark.points(1)
def test_real_gpus(env):
    """On a GPU machine the unpatched functions see the real devices."""
    count = torch.cuda.device_count()
    assert env.cuda_device_count() == count
    assert env.pick_backend() == "nccl"
    device = env.device_for(count - 1)
    assert torch.ones(2, device=device).sum().item() == 2
