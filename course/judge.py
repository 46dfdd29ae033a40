"""Numbers the grader computes itself, from the files a run left.

A submission's own report of how well it did (its metrics JSON, its printed
accuracy) can say anything. So a test that awards points for learning reads
the checkpoint the run wrote (weights only: `checkpoint.load` cannot run code)
and evaluates it here, in the grading process, with the course's own model
and data: forged numbers or untrained weights score nothing.
"""

from __future__ import annotations

from pathlib import Path

import torch

from course import checkpoint, data, models


@torch.no_grad()
def digits_accuracy(path: str | Path, norm: str = "batch") -> float:
    """Test accuracy of the `cnn` weights in the checkpoint at `path`, on digits' test split.

    Raises ValueError (one line) when the file holds no loadable cnn weights."""
    state = checkpoint.load(path)
    weights = state.get("model") if isinstance(state, dict) else None
    if isinstance(weights, dict):  # a DDP/DataParallel wrapper's keys: other tests judge that
        weights = {k.removeprefix("module."): v for k, v in weights.items()}
    model = models.build_model("cnn", num_classes=10, in_channels=1, norm=norm)
    try:
        model.load_state_dict(weights)
    except (RuntimeError, TypeError, AttributeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"{Path(path).name} holds no weights of the lesson's cnn: {first}"
        ) from None
    model.eval()
    _, test_set, _, _ = data.build_datasets("digits")
    images, labels = test_set.tensors
    return (model(images).argmax(1) == labels).float().mean().item()
