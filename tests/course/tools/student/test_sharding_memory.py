"""python -m course memory: lesson 10's five ways, bytes per rank counted against the page's
formula, and one-line errors for bad input."""

from __future__ import annotations

import json
import sys

import pytest

from course import launch
from course.tools.student import sharding_memory

# Counted against predicted, largest rank, measured (PyTorch 2.14.1, 2 and 3 gloo ranks,
# dim 64 and 256): 1.00 to 1.03. Whole tensors make ZeRO-1's split uneven (its rank with
# the larger share is counted), FSDP2 pads each tensor's rows to a multiple of the ranks,
# and AdamW keeps a step counter per parameter. 10 % is the page's bar for a gap it must
# explain.
WITHIN = 0.10


def run(*args, timeout=120):
    return launch.run(args=[sys.executable, "-m", "course", "memory", *args], timeout=timeout)


def test_memory_counts_what_the_formula_predicts(tmp_path):
    """2 gloo ranks, a small TinyLM: every way within 10 % of its prediction, and the
    sharded ways well below DDP's 16 bytes a parameter."""
    out = tmp_path / "memory.json"
    result = run("--nproc", "2", "--backend", "gloo", "--dim", "64", "--depth", "2", "--out", out)
    assert result.returncode == 0, result.describe()
    found = json.loads(out.read_text())
    counted = {}
    for i, way in enumerate(sharding_memory.WAYS):
        rows = [ranks[i] for ranks in found["ranks"]]
        counted[way] = max(r["params"] + r["grads"] + r["state"] for r in rows)
        predicted = found["predicted"][way]
        assert abs(counted[way] / predicted - 1) <= WITHIN, (
            f"{way}: counted {counted[way]:,} bytes on the largest rank, predicted "
            f"{predicted:,.0f}\n{result.output}"
        )
    assert counted["FSDP2"] < 0.55 * counted["DDP"], counted
    assert counted["ZeRO-1 (yours)"] < 0.8 * counted["DDP"], counted
    assert way in result.output and "predicted" in result.output


def test_memory_refuses_a_folder_without_the_lesson_in_one_line(tmp_path):
    result = run("--impl", str(tmp_path))
    assert result.returncode == 2, result.describe()
    assert result.output.strip().splitlines()[-1].startswith("python -m course memory: error: ")
    assert "zero.py: no such file" in result.output


def test_memory_refuses_nccl_without_gpus_in_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    result = run("--backend", "nccl")
    assert result.returncode == 2, result.describe()
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "needs CUDA GPUs" in result.output
