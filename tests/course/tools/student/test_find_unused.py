"""python -m course find-unused: lesson 09's model timed with and without DDP's
find_unused_parameters, in turns; the graph it walks counted; one-line errors for bad input."""

from __future__ import annotations

import re
import sys

import pytest
import torch

from course import launch, models


def run(*args, timeout=120):
    return launch.run(args=[sys.executable, "-m", "course", "find-unused", *args], timeout=timeout)


def autograd_nodes() -> int:
    """The grader's own count: every node reachable from the CNN's output, by its
    next_functions."""
    torch.manual_seed(0)
    out = models.SmallCNN(10, 1, norm="none")(torch.zeros(2, 1, 8, 8))
    seen, todo = set(), [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo += [n for n, _ in node.next_functions]
    return len(seen)


def test_it_times_both_settings_and_counts_the_graph():
    """--steps 6 --warmup 0 --batch-size 8: the header says so, the graph's nodes are the
    grader's own count, and each setting has a positive forward and step time, the step
    longer than its forward."""
    result = run("--steps", "6", "--warmup", "0", "--batch-size", "8")
    assert result.returncode == 0, result.describe()
    out = result.output
    assert "8 digits a step" in out and "6 steps each way" in out and "after 0 of" in out, out
    nodes = re.search(r"(\d+) autograd nodes", out)
    assert nodes and int(nodes[1]) == autograd_nodes(), (nodes and nodes[1], autograd_nodes())
    for flag in ("False", "True"):
        row = re.search(rf"find_unused_parameters={flag} +(\d+) us +(\d+) us", out)
        assert row and 0 < int(row[1]) < int(row[2]), (flag, out)
    assert re.search(r"True - False \(paired\) +-?\d+ us +-?\d+ us", out), out
    assert re.search(r"quartiles of the paired differences: forward -?\d+ to -?\d+ us", out), out
    assert re.search(r"find_unused_parameters=True: [+-][\d.]+ % a step", out), out


def test_bad_input_is_one_line():
    """--steps 1 leaves no quartiles to take (two paired differences at least), and
    --warmup -1 no sense: each is refused in one line."""
    for flag, value in (("--steps", "1"), ("--warmup", "-1"), ("--batch-size", "0")):
        result = run(flag, value)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1, result.describe()
        assert flag in lines[0], lines


def test_device_cuda_without_a_gpu_is_one_line():
    """--device cuda where no GPU is visible: refused in one line that says so (on a GPU
    machine, CUDA_VISIBLE_DEVICES="" hides them)."""
    result = launch.run(
        args=[sys.executable, "-m", "course", "find-unused", "--device", "cuda"],
        timeout=120,
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.describe()
    assert "--device cuda" in lines[0] and "no GPU" in lines[0], lines


@pytest.mark.gpus(1)
def test_on_a_gpu_it_times_one_nccl_rank():
    """--device cuda: one nccl rank on the first GPU, named in the header; the forward is
    timed until its kernels are queued and the step until the GPU is done, so each
    setting's step is longer than its forward, as on the CPU."""
    result = run("--device", "cuda", "--steps", "6", "--warmup", "2", "--batch-size", "8")
    assert result.returncode == 0, result.describe()
    out = result.output
    assert f"one nccl rank on {torch.cuda.get_device_name(0)}" in out, out
    assert "step: until the GPU is done" in out, out
    for flag in ("False", "True"):
        row = re.search(rf"find_unused_parameters={flag} +(\d+) us +(\d+) us", out)
        assert row and 0 < int(row[1]) < int(row[2]), (flag, out)
