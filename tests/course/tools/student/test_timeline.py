"""python -m course timeline: backward and all-reduce on one axis, from torch.profiler."""

from __future__ import annotations

import json
import sys

from course import REPO_ROOT, launch
from course.tools.student import timeline

TRACE = {
    "traceEvents": [
        {"ph": "X", "name": "autograd::engine::evaluate_function: AddmmBackward0", "ts": 1000,
         "dur": 400, "tid": 1},
        {"ph": "X", "name": "autograd::engine::evaluate_function: ReluBackward0", "ts": 1400,
         "dur": 600, "tid": 1},
        {"ph": "X", "name": "gloo:all_reduce", "ts": 1500, "dur": 200, "tid": 7},
        {"ph": "X", "name": "gloo:all_reduce", "ts": 1900, "dur": 300, "tid": 7},
        {"ph": "X", "name": "aten::mm", "ts": 1000, "dur": 50, "tid": 1},
        {"ph": "i", "name": "gloo:all_reduce", "ts": 1950, "tid": 7},
    ]
}  # fmt: skip


def test_the_trace_is_reduced_to_two_lanes_and_the_overlap_is_measured():
    """Backward functions and all-reduces only, from the first of them; 300 of the 500 us
    of all-reduce run before backward ends (at 2000 us)."""
    events = timeline.reduce_trace(TRACE)
    assert [(e["cat"], e["ts"], e["dur"]) for e in events] == [
        ("backward", 0.0, 400.0),
        ("backward", 400.0, 600.0),
        ("all-reduce", 500.0, 200.0),
        ("all-reduce", 900.0, 300.0),
    ]
    assert events[0]["name"] == "AddmmBackward0"
    stats = timeline.overlap(events)
    assert stats["all_reduces"] == 2 and stats["all_reduce_ms"] == 0.5
    assert stats["during_backward_ms"] == 0.3 and stats["during_backward"] == 0.6


# A GPU step: the CPU launches the backward's kernels early (its functions end at 1300 us),
# the GPU runs them later; NCCL's kernel runs on its own stream. Launches and kernels share
# a correlation id; a forward kernel (correlation 1) launched outside backward is left out.
GPU_TRACE = {
    "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 900, "dur": 50, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 910, "dur": 5,
         "tid": 1, "args": {"correlation": 1}},
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: "
         "AddmmBackward0", "ts": 1000, "dur": 200, "tid": 2},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1010, "dur": 5,
         "tid": 2, "args": {"correlation": 2}},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernelEx", "ts": 1100, "dur": 5,
         "tid": 2, "args": {"correlation": 3}},
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: "
         "ReluBackward0", "ts": 1250, "dur": 50, "tid": 2},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1260, "dur": 5,
         "tid": 2, "args": {"correlation": 4}},
        {"ph": "X", "cat": "kernel", "name": "sm90_gemm_fwd", "ts": 1500, "dur": 100,
         "tid": 7, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "sm90_gemm_a", "ts": 2000, "dur": 300, "tid": 7,
         "args": {"correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": "sm90_gemm_b", "ts": 2300, "dur": 300, "tid": 7,
         "args": {"correlation": 3}},
        {"ph": "X", "cat": "kernel", "name": "relu_backward", "ts": 2600, "dur": 400,
         "tid": 7, "args": {"correlation": 4}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
         "ts": 2500, "dur": 1000, "tid": 9, "args": {"correlation": 5}},
    ]
}  # fmt: skip


def test_on_gpus_the_lanes_are_the_kernels_when_the_gpu_ran_them():
    """The backward lane is the kernels the backward's functions launched, at the GPU's
    times and named after their function: backward ends at 3000 us (the CPU's functions
    ended at 1300), so 500 of the NCCL kernel's 1000 us overlap it, not none."""
    events = timeline.reduce_trace(GPU_TRACE)
    assert [(e["cat"], e["name"], e["ts"], e["dur"]) for e in events] == [
        ("backward", "AddmmBackward0", 0.0, 300.0),
        ("backward", "AddmmBackward0", 300.0, 300.0),
        ("all-reduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 500.0, 1000.0),
        ("backward", "ReluBackward0", 600.0, 400.0),
    ]
    stats = timeline.overlap(events)
    assert stats["backward_ms"] == 1.0 and stats["during_backward"] == 0.5


def test_a_trace_without_all_reduces_is_refused():
    bare = {"traceEvents": [e for e in TRACE["traceEvents"] if "gloo" not in e["name"]]}
    try:
        timeline.reduce_trace(bare)
    except ValueError as err:
        assert "no all-reduces" in str(err)
    else:
        raise AssertionError("a trace without all-reduces was accepted")


def test_the_published_record_loads_and_draws():
    """docs/results/overlap/cpu_gloo.json, which lessons 06 and 08 show."""
    doc = timeline.load(REPO_ROOT / "docs" / "results" / "overlap" / "cpu_gloo.json")
    assert doc["provenance"]["torch"] and doc["overlap"]["all_reduces"] >= 2
    assert timeline.overlap(doc["traceEvents"]) == doc["overlap"]
    assert timeline.render(doc)[:4] == b"\x89PNG"
    assert b"<svg" in timeline.render(doc, fmt="svg")


def test_two_gloo_ranks_write_a_record_perfetto_opens(tmp_path):
    out = tmp_path / "t.json"
    args = ["--out", str(out), "--layers", "4", "--width", "128", "--batch", "32"]
    result = launch.run([sys.executable, "-m", "course", "timeline", *args], timeout=120)
    assert result.ok, result.describe()
    doc = json.loads(out.read_text())
    lanes = {e["cat"] for e in doc["traceEvents"]}
    assert lanes == {"backward", "all-reduce"} and all(e["ph"] == "X" for e in doc["traceEvents"])
    assert doc["provenance"]["command"].startswith("python -m course timeline")
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert "of backward" in result.output


def test_nccl_without_two_gpus_is_one_line(tmp_path):
    args = ["timeline", "--backend", "nccl", "--out", str(tmp_path / "t.json")]
    result = launch.run(
        [sys.executable, "-m", "course", *args], timeout=60, env={"CUDA_VISIBLE_DEVICES": ""}
    )
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "nccl" in lines[0], result.describe()
