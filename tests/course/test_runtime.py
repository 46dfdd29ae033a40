"""course.runtime: device choice and one-line errors."""

from __future__ import annotations

import pytest
import torch

from course import runtime


def test_pick_device_cpu_and_auto(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime.pick_device("cpu") == torch.device("cpu")
    assert runtime.pick_device("auto") == torch.device("cpu")


@pytest.mark.parametrize("spec", ["cuda", "cuda:1"])
def test_cuda_requested_but_absent_says_so(monkeypatch, spec):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available"):
        runtime.pick_device(spec)


def test_cuda_index_out_of_range(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert runtime.pick_device("cuda:1") == torch.device("cuda", 1)
    assert runtime.pick_device("auto") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="only 2 GPU"):
        runtime.pick_device("cuda:2")
    with pytest.raises(ValueError, match="unknown"):
        runtime.pick_device("tpu")


def test_exit_with_one_line(capsys):
    def main(argv):
        raise FileNotFoundError("--data x: no such\nfolder")

    assert runtime.exit_with_one_line(main, [], prog="train.py") == 2
    assert capsys.readouterr().err == "train.py: error: --data x: no such folder\n"

    def unreachable(argv):
        raise ConnectionError("cannot reach 10.0.0.1:29400")

    assert runtime.exit_with_one_line(unreachable, [], prog="launch.py") == 2
    assert capsys.readouterr().err == "launch.py: error: cannot reach 10.0.0.1:29400\n"
    # main's own exit code (a launcher passing on its child's) comes through; None is 0
    assert runtime.exit_with_one_line(lambda argv: 3, []) == 3
    assert runtime.exit_with_one_line(lambda argv: None, []) == 0


def test_an_unsolved_todo_is_one_line_and_other_bugs_keep_their_traceback(capsys):
    def starter(argv):
        raise NotImplementedError("TODO at 10_sharding/fsdp2.py:62 is not done yet")

    assert runtime.exit_with_one_line(starter, [], prog="fsdp2.py") == 1
    assert capsys.readouterr().err == (
        "fsdp2.py: the TODO at 10_sharding/fsdp2.py:62 is not done yet (python -m course hint 10)\n"
    )

    class ProcessRaisedException(Exception):  # what mp.spawn raises for a rank's error
        pass

    def ranks(argv):
        raise ProcessRaisedException(
            "-- Process 1 terminated with the following error:\nTraceback ...\n"
            "NotImplementedError: TODO at 11_model_parallel/tensor.py:40 is not done yet\n"
        )

    assert runtime.exit_with_one_line(ranks, [], prog="tensor.py") == 1
    assert "TODO at 11_model_parallel/tensor.py:40" in capsys.readouterr().err

    def bug(argv):
        raise NotImplementedError("a bug of the author's")

    with pytest.raises(NotImplementedError):  # not a starter's TODO: the traceback stays
        runtime.exit_with_one_line(bug, [])
    with pytest.raises(ZeroDivisionError):
        runtime.exit_with_one_line(lambda argv: 1 / 0, [])


def test_gpu_ids_for_data_parallel(monkeypatch):
    cpu = torch.device("cpu")
    assert runtime.gpu_ids(cpu, None) == [] and runtime.gpu_ids(cpu, 1) == []
    with pytest.raises(ValueError, match="needs CUDA GPUs"):
        runtime.gpu_ids(cpu, 2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert runtime.gpu_ids(torch.device("cuda", 0), None) == [0, 1, 2]
    assert runtime.gpu_ids(torch.device("cuda", 1), 2) == [1, 2]
    with pytest.raises(ValueError, match="only 3 GPU"):
        runtime.gpu_ids(torch.device("cuda", 2), 2)
