"""Grades lesson 00: environment check (lessons/00_environment/env_check.py).

The lesson's functions run in a child process (tests/lessons/cases/lesson_00.py),
never in this one; its CUDA-present cases pretend GPUs exist, so they grade
on any laptop, and the `gpus` test checks the same functions on real GPUs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course import registry
from course.grader.case_runs import run_lesson_cases

LESSON = registry.get("00")
CASES = Path(__file__).with_name("cases") / "lesson_00.py"


@pytest.fixture(scope="module")
def env(impl, tmp_path_factory):
    """Every case of lesson 00, run once in one child process."""
    return run_lesson_cases(impl, LESSON, CASES, tmp_path_factory.mktemp("cases00"))


@pytest.mark.core
@pytest.mark.points(2)
@pytest.mark.parametrize("count", [1, 4])
def test_device_count_with_cuda(env, count):
    """cuda_device_count() returns the number of usable GPUs (1 and 2, simulated)."""
    got = env(f"device_count_{count}")
    assert got == count, (
        f"with {count} usable GPU(s), cuda_device_count() should return {count}, "
        f"but returned {got!r}. Likely cause: it does not ask torch.cuda.device_count()"
    )


@pytest.mark.core
@pytest.mark.points(2)
def test_device_count_is_zero_when_cuda_is_unusable(env):
    """cuda_device_count() is 0 when torch.cuda.is_available() is False, whatever device_count()
    says."""
    got = env("device_count_0")
    assert got == 0, (
        f"when torch.cuda.is_available() is False, cuda_device_count() should return 0, "
        f"but returned {got!r}. Likely cause: device_count() can report GPUs that a broken "
        "driver makes unusable; check is_available() first"
    )


@pytest.mark.core
@pytest.mark.points(2)
@pytest.mark.parametrize(
    ("case", "expected"),
    [("2_nccl", "nccl"), ("1_nccl", "nccl"), ("0_nccl", "gloo"), ("2_no_nccl", "gloo")],
    ids=["2-gpus", "1-gpu", "no-gpu", "no-nccl-in-build"],
)
def test_pick_backend(env, case, expected):
    """pick_backend() gives nccl only with a usable GPU and a build with NCCL, else gloo."""
    got = env(f"pick_backend_{case}")
    gpus, nccl = case.split("_", 1)
    situation = f"{gpus} usable GPU(s), NCCL {'absent from' if 'no' in nccl else 'in'} the build"
    assert got == expected, (
        f"with {situation}, pick_backend() should return {expected!r}, but returned {got!r}. "
        "nccl needs both a usable GPU and a build with NCCL; gloo works everywhere else"
    )


@pytest.mark.core
@pytest.mark.points(2)
def test_device_for_without_gpus_is_cpu(env):
    """device_for(rank) is the CPU for every rank on a machine without GPUs."""
    got = env("device_for_no_gpu")
    assert got == ["cpu", "cpu"], (
        f"without GPUs, device_for(0) and device_for(3) should both be cpu (CPU ranks share "
        f"the CPU), but were {got}"
    )


@pytest.mark.core
@pytest.mark.points(2)
def test_device_for_with_gpus_is_one_gpu_per_rank(env):
    """device_for(rank) gives each rank its own GPU: cuda:0 and cuda:1 with 2 GPUs."""
    got = env("device_for_two_gpus")
    assert got == ["cuda:0", "cuda:1"], (
        f"with 2 GPUs, device_for(0) and device_for(1) should be cuda:0 and cuda:1 (one GPU "
        f"per process), but were {got}"
    )


@pytest.mark.points(1)
@pytest.mark.parametrize("rank", [-1, 2])
def test_device_for_rejects_a_rank_without_a_gpu(env, rank):
    """device_for(rank) raises ValueError for a rank past the last GPU."""
    got = env(f"device_for_rank_{rank}")
    assert got["raised"] == "ValueError", (
        f"with 2 GPUs, device_for({rank}) should raise ValueError (there is no such GPU), "
        f"but returned {got.get('returned')!r}"
    )


@pytest.mark.core
@pytest.mark.points(2)
def test_library_report_matches_this_build(env):
    """The cuDNN, NCCL and gloo report says what this PyTorch build really has."""
    report = env("library_report")
    cudnn = torch.backends.cudnn.is_available()
    nccl = dist.is_available() and dist.is_nccl_available()
    expected = {
        "cudnn_available": cudnn,
        "cudnn_version": torch.backends.cudnn.version() if cudnn else None,
        "nccl_available": nccl,
        "nccl_version": ".".join(map(str, torch.cuda.nccl.version()))
        if nccl and torch.cuda.is_available()
        else None,
        "gloo_available": dist.is_available() and dist.is_gloo_available(),
    }
    wrong = {k: (report.get(k, "<missing>"), v) for k, v in expected.items() if report.get(k) != v}
    assert not wrong, (
        "library_report() differs from this PyTorch build (key: (reported, actual)): "
        f"{wrong}. Versions are None when the library is absent"
    )


@pytest.mark.points(1)
def test_json_report(env):
    """`env_check.py --json` prints one JSON object with this machine's GPU count and a backend."""
    out = env("main_json")
    try:
        report = json.loads(out)
    except ValueError:
        pytest.fail(f"`env_check.py --json` should print one JSON object, printed:\n{out}")
    expected_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert report.get("gpu_count") == expected_gpus, (
        f"gpu_count should be {expected_gpus} on this machine, was {report.get('gpu_count')!r}"
    )
    assert report.get("backend") in ("gloo", "nccl"), report


@pytest.mark.points(2)
def test_script_answers_the_gpu_question(impl, env, run_script, backend):
    """The script runs end to end and its all-reduce smoke test passes on `backend`.

    Printed lines alone prove nothing (a script can print anything), so the
    points also need the functions the smoke test relies on to work, as called
    by the grader in its own child process."""
    for case, want in (("pick_backend_0_nccl", "gloo"), ("device_for_no_gpu", ["cpu", "cpu"])):
        got = env(case)
        assert got == want, (
            f"the smoke test relies on pick_backend() and device_for(); case {case} gave "
            f"{got!r} instead of {want!r}"
        )
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
    got = env("real_gpus")
    want = {"count": count, "backend": "nccl", "device": f"cuda:{count - 1}", "sum": 2.0}
    assert got == want, f"on this GPU machine expected {want}, got {got}"
