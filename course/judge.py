"""Numbers the grader computes itself, from the files a run left.

A submission's own report of how well it did (its metrics JSON, its printed
accuracy) can say anything. So a test that awards points for learning reads
the checkpoint the run wrote (weights only: `checkpoint.load` cannot run code)
and evaluates it here, in the grading process, with the course's own model
and data: forged numbers or untrained weights score nothing.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from course import checkpoint, data, models


def digits_accuracy(path: str | Path, norm: str = "batch") -> float:
    """Test accuracy of the `cnn` weights in the checkpoint at `path`, on digits' test split.

    Raises ValueError (one line) when the file holds no loadable cnn weights.
    Several tests judge the same file: it is evaluated once per version of it."""
    stat = Path(path).stat() if Path(path).is_file() else None
    if stat is None:
        checkpoint.load(path)  # raises the one-line FileNotFoundError
    return _accuracy(str(Path(path).resolve()), norm, stat.st_mtime_ns, stat.st_size)


def digits_test_size() -> int:
    """How many images the test split has: one image more or less right is 1/this."""
    return len(_digits_test_set()[1])


@functools.cache
def _digits_test_set():
    return data.build_datasets("digits")[1].tensors


@functools.cache
@torch.no_grad()
def _accuracy(path: str, norm: str, _mtime_ns: int, _size: int) -> float:
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
    images, labels = _digits_test_set()
    return (model(images).argmax(1) == labels).float().mean().item()
