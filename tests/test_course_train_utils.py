"""course.train_utils: device choice and one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from course import train_utils


def test_pick_device_cpu_and_auto(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert train_utils.pick_device("cpu") == torch.device("cpu")
    assert train_utils.pick_device("auto") == torch.device("cpu")


@pytest.mark.parametrize("spec", ["cuda", "cuda:1"])
def test_cuda_requested_but_absent_says_so(monkeypatch, spec):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available"):
        train_utils.pick_device(spec)


def test_cuda_index_out_of_range(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert train_utils.pick_device("cuda:1") == torch.device("cuda", 1)
    assert train_utils.pick_device("auto") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="only 2 GPU"):
        train_utils.pick_device("cuda:2")
    with pytest.raises(ValueError, match="unknown"):
        train_utils.pick_device("tpu")


def test_exit_with_one_line(capsys):
    def main(argv):
        raise FileNotFoundError("--data x: no such\nfolder")

    assert train_utils.exit_with_one_line(main, [], prog="train.py") == 2
    assert capsys.readouterr().err == "train.py: error: --data x: no such folder\n"


def test_write_json_is_whole(tmp_path):
    path = train_utils.write_json({"a": 1}, tmp_path / "m" / "metrics.json")
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in path.parent.iterdir()] == ["metrics.json"]
