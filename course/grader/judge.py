"""Numbers the grader computes itself, from the files a run left.

A submission's own report of how well it did (its metrics JSON, its printed
accuracy) can say anything. So a test that awards points for learning reads
the checkpoint the run wrote (weights only: `checkpoint.load` cannot run code)
and evaluates it here, in the grading process, with the course's own model
and data: forged numbers or untrained weights score nothing.
"""

from __future__ import annotations

import functools
import math
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
    return _scores(str(Path(path).resolve()), norm, stat.st_mtime_ns, stat.st_size)[1]


def digits_test_loss(path: str | Path, norm: str = "batch") -> float:
    """Mean cross-entropy over digits' test split of the weights at `path` (as
    digits_accuracy, which checks the file)."""
    digits_accuracy(path, norm)
    stat = Path(path).stat()
    return _scores(str(Path(path).resolve()), norm, stat.st_mtime_ns, stat.st_size)[0]


def last_epoch_misreported(metrics: dict, path: str | Path) -> str:
    """Empty when the last epoch's test_loss and test_accuracy in a run's metrics are those of
    the weights saved after it (at `path`) on the test split, as evaluated here; else what
    differs, in one sentence. The same weights on the same images differ only by the
    order of float32 sums (~1e-7 relative), far inside the bounds below."""
    epochs = metrics.get("epochs") or [{}]
    said = (epochs[-1].get("test_loss"), epochs[-1].get("test_accuracy"))
    loss, accuracy = digits_test_loss(path), digits_accuracy(path)
    if all(isinstance(x, (int, float)) for x in said) and (
        math.isclose(said[0], loss, rel_tol=1e-4) and abs(said[1] - accuracy) <= 1e-4
    ):
        return ""
    return (
        f"the last epoch's line of the metrics says (test_loss, test_accuracy) = {said}; the "
        f"grader's evaluation of the weights saved after it, on the test split, gives "
        f"({loss:.4f}, {accuracy:.4f}): the epoch reports other numbers than the test split's"
    )


def digits_test_size() -> int:
    """How many images the test split has: one image more or less right is 1/this."""
    return len(_digits_test_set()[1])


@functools.cache
def _digits_test_set():
    return data.build_datasets("digits")[1].tensors


def _weights(path) -> dict | None:
    """The model's state dict in a checkpoint, without a wrapper's `module.` prefix."""
    state = checkpoint.load(path)
    weights = state.get("model") if isinstance(state, dict) else None
    if isinstance(weights, dict):  # a DDP/DataParallel wrapper's keys: other tests judge that
        weights = {k.removeprefix("module."): v for k, v in weights.items()}
    return weights


def _load(model, weights, path) -> None:
    try:
        model.load_state_dict(weights)
    except (RuntimeError, TypeError, AttributeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"{Path(path).name} holds no weights of the lesson's cnn: {first}"
        ) from None


@functools.cache
@torch.no_grad()
def _scores(path: str, norm: str, _mtime_ns: int, _size: int) -> tuple[float, float]:
    """(mean test loss, test accuracy) of the weights at `path`."""
    model = models.build_model("cnn", num_classes=10, in_channels=1, norm=norm)
    _load(model, _weights(path), path)
    model.eval()
    images, labels = _digits_test_set()
    logits = model(images)
    loss = torch.nn.functional.cross_entropy(logits, labels).item()
    return loss, (logits.argmax(1) == labels).float().mean().item()


def not_channels_last(weights: dict) -> list[str]:
    """The 4-D weights (convolutions with more than one input channel, where the two layouts
    differ) that a model moved with memory_format=torch.channels_last would not hold in
    that layout: torch.save keeps a tensor's strides, so a checkpoint shows the layout."""
    return [
        name
        for name, w in weights.items()
        if w.dim() == 4
        and w.shape[1] > 1
        and not w.is_contiguous(memory_format=torch.channels_last)
    ]


@torch.no_grad()
def folder_accuracy(path: str | Path, tree: str | Path, image_size: int = 32) -> float:
    """Test accuracy of the `cnn` weights in the checkpoint at `path` on the test split of
    the image folder `tree` (course.data.image_folder: val/, or its fixed 20 %)."""
    _, test_set, classes, channels = data.build_datasets(str(tree), image_size=image_size)
    weights = _weights(path)
    model = models.build_model("cnn", num_classes=classes, in_channels=channels)
    _load(model, weights, path)
    model.eval()
    correct = sum(int(model(image[None]).argmax(1).item() == label) for image, label in test_set)
    return correct / len(test_set)


@functools.cache
def reference_weights(
    seed: int,
    lr: float,
    world: int,
    per_rank: int,
    epochs: int = 1,
    steps: int | None = None,
    norm: str = "none",
) -> dict:
    """The weights data-parallel training must end with, trained here in one process.

    The lessons' recipe (`cnn` on digits, without BatchNorm unless `norm` says so, SGD
    with momentum 0.9 and weight decay 5e-4, after seed_everything(seed)) on one batch of
    `world` x `per_rank` images a step: at each step, the next `per_rank` images of every
    rank's DistributedSampler(seed) order, reshuffled each epoch (set_epoch), as `world` ranks
    would see them. `steps` stops early (--max-steps). One thread, as each rank computes,
    whatever this machine has. Without BatchNorm the global batch is the same computation
    as the ranks' averaged gradients, up to the order of float32 sums. With one rank
    (world=1) the order is lesson 01's: a shuffling DataLoader whose generator is seeded
    seed + epoch (the loader draws from it too, so its order is not the sampler's alone)."""
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler

    from course.runtime import seed_everything

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seed_everything(seed)
        train_set, _, classes, channels = data.build_datasets("digits")
        model = models.build_model("cnn", classes, channels, norm)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
        samplers = [
            DistributedSampler(train_set, num_replicas=world, rank=r, seed=seed)
            for r in range(world)
        ]
        model.train()
        done = 0
        for epoch in range(epochs):
            for sampler in samplers:
                sampler.set_epoch(epoch)
            orders = [list(sampler) for sampler in samplers]
            if world == 1:  # lesson 01's own loader: shuffle=True, generator seeded seed + epoch
                shuffle = torch.Generator().manual_seed(seed + epoch)
                indices = range(len(train_set))
                batches = DataLoader(indices, per_rank, shuffle=True, generator=shuffle)
                orders = [[i for batch in batches for i in batch.tolist()]]
            for start in range(0, len(orders[0]), per_rank):
                if steps is not None and done == steps:
                    break
                chosen = [i for order in orders for i in order[start : start + per_rank]]
                images, labels = train_set[chosen]
                loss = F.cross_entropy(model(images), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                done += 1
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    finally:
        torch.set_num_threads(threads)
