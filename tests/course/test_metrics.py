"""course.metrics: the printed epoch lines and the metrics file the grader reads."""

import argparse
import json

from course.metrics import RunLog


def test_epochs_are_printed_recorded_and_written(tmp_path, capsys):
    args = argparse.Namespace(data="digits", model="cnn", epochs=2, metrics_out=tmp_path / "m.json")
    log = RunLog(args, 0, world_size=2)
    log.epoch(1, 1.5, 1.25, 0.5, images=100, seconds=0.5, steps=4, complete=True)
    log.epoch(2, 0.5, 0.25, 0.75, images=300, seconds=0.5, steps=4, complete=False)
    metrics = log.finish(0.75, 8)
    out = capsys.readouterr().out.splitlines()
    first = "epoch 1/2: train loss 1.5000, test loss 1.2500, test accuracy 50.00%, 200 img/s"
    assert out[0] == first
    assert out[-1] == "final test accuracy 75.00% after 8 steps (1.0 s training)"
    written = json.loads((tmp_path / "m.json").read_text())
    assert written == json.loads(json.dumps(metrics))
    assert written["world_size"] == 2 and written["start_epoch"] == 0
    assert [e["epoch"] for e in written["epochs"]] == [1, 2]
    assert [e["complete"] for e in written["epochs"]] == [True, False]
    assert written["images_per_second"] == 400.0 and written["steps"] == 8


def test_no_metrics_file_unless_asked(tmp_path, capsys):
    args = argparse.Namespace(data="digits", model="cnn", epochs=1, metrics_out=None)
    assert RunLog(args).finish(0.5, 0)["images_per_second"] == 0.0
    assert list(tmp_path.iterdir()) == []


def test_evaluate_counts_loss_and_accuracy():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from course.metrics import evaluate

    x = torch.eye(4)
    y = torch.tensor([0, 1, 2, 0])  # the identity "model" is right on the first three
    loss, accuracy = evaluate(torch.nn.Identity(), DataLoader(TensorDataset(x, y), 3), "cpu")
    assert accuracy == 0.75
    want = torch.nn.functional.cross_entropy(x, y).item()
    assert abs(loss - want) < 1e-6
