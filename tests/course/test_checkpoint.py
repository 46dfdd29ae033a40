"""course.checkpoint: atomic saves and the random state of a resumable run."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from course import checkpoint


def test_round_trip_with_rng_state(tmp_path):
    path = checkpoint.save({"w": torch.arange(3), "rng": checkpoint.rng_state()}, tmp_path / "c.pt")
    state = checkpoint.load(path)
    assert torch.equal(state["w"], torch.arange(3))
    expected = (torch.rand(2), np.random.rand(2), random.random())
    checkpoint.set_rng_state(state["rng"])
    again = (torch.rand(2), np.random.rand(2), random.random())
    assert torch.equal(expected[0], again[0])
    assert np.array_equal(expected[1], again[1]) and expected[2] == again[2]
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary file left


def test_crash_before_the_rename_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = checkpoint.save({"epoch": 1}, tmp_path / "c.pt")

    def crash(*args):
        raise OSError("simulated crash between write and rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated"):
        checkpoint.save({"epoch": 2, "big": torch.zeros(10_000)}, path)
    monkeypatch.undo()
    assert checkpoint.load(path) == {"epoch": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("crash halfway through writing")


def test_crash_while_writing_keeps_the_old_checkpoint(tmp_path):
    path = checkpoint.save({"epoch": 1}, tmp_path / "c.pt")
    with pytest.raises(RuntimeError, match="halfway"):
        checkpoint.save({"weights": torch.zeros(10_000), "bad": Unpicklable()}, path)
    assert checkpoint.load(path) == {"epoch": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        checkpoint.load(tmp_path / "nope.pt")
