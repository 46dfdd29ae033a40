"""The data sets the lessons train on, behind one function: `build_datasets`.

    digits     scikit-learn's 1,797 handwritten digits (8x8, grey, 10 classes). It
               ships inside the scikit-learn wheel, so it works offline; the default.
    synthetic  random images with random labels: nothing to learn, only to measure
               throughput without an input pipeline in the way. synthetic:N
               makes N training images (default 2048), so that one epoch can
               hold a whole benchmark.
    cifar10    torchvision's CIFAR-10 (32x32 colour, 10 classes), downloaded into
               --data-dir on first use (about 170 MB; needs the network once).
    PATH       any folder of images laid out for torchvision's ImageFolder:
               PATH/train/<class>/*.png and PATH/val/<class>/*.png, or, without
               train/ and val/, one PATH/<class>/*.png tree that is split 80/20
               with a fixed seed (the same split on every run and every rank).

Every split here is fixed: the test set must not change when --seed does, or
two runs' accuracies are not comparable.

Data sets that are plain tensors (digits, synthetic) are built on the device
the model trains on, when build_datasets is given one: a GPU then never
waits for the CPU to gather, pin and copy a batch (at 77 MB per ResNet-50
batch that serial CPU work cost lesson 01 15 % of its speed on an H200).
`loader` builds the DataLoader that suits where the data lives.

Over 300 lines, on purpose: every source --data accepts, and the one loader and
sampler they share, in one place, so that a lesson sees a single function.
"""

from __future__ import annotations

import gzip
import importlib.util
import itertools
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, TensorDataset

# The split seed is a constant, not --seed: --seed varies the training run,
# never which images are held out for testing.
SPLIT_SEED = 0
TEST_FRACTION = 0.2
NAMES = ("digits", "synthetic", "cifar10")


def _split(n: int, test_fraction: float = TEST_FRACTION) -> tuple[list[int], list[int]]:
    """Indices of a fixed, seeded train/test split of n items."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(SPLIT_SEED)).tolist()
    n_test = max(1, round(n * test_fraction))
    return sorted(order[n_test:]), sorted(order[:n_test])


def _digits_csv() -> Path | None:
    """scikit-learn's own copy of the digits (datasets/data/digits.csv.gz), found
    without importing scikit-learn: that import costs ~1 s in every rank."""
    spec = importlib.util.find_spec("sklearn")
    for folder in (spec and spec.submodule_search_locations) or ():
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    return None


def digits() -> tuple[Dataset, Dataset, int, int]:
    """scikit-learn's digits as 1x8x8 float tensors scaled to [-1, 1]."""
    path = _digits_csv()
    if path is not None:  # what load_digits() reads: 64 pixels and the label per row
        import numpy as np

        with gzip.open(path, "rt") as f:
            rows = np.loadtxt(f, delimiter=",")
        pixels, target = rows[:, :-1].reshape(-1, 8, 8), rows[:, -1].astype(int)
    else:  # a scikit-learn that keeps its data elsewhere
        from sklearn.datasets import load_digits

        bunch = load_digits()
        pixels, target = bunch.images, bunch.target
    images = torch.tensor(pixels, dtype=torch.float32).unsqueeze(1)  # N,1,8,8 in 0..16
    images = images / 8.0 - 1.0  # pixel values 0..16 -> -1..1
    labels = torch.tensor(target, dtype=torch.long)
    train, test = _split(len(labels))
    return (
        TensorDataset(images[train], labels[train]),
        TensorDataset(images[test], labels[test]),
        10,
        1,
    )


def synthetic(
    image_size: int = 32,
    num_classes: int = 10,
    train_size: int = 2048,
    test_size: int = 256,
    device: torch.device | str | None = None,
) -> tuple[Dataset, Dataset, int, int]:
    """Random 3-channel images and labels from a fixed seed, generated on `device`.

    Generated where they will be used: 10k ImageNet-sized images are 6 GB,
    seconds of work for one CPU thread and milliseconds for a GPU. The values
    depend on the device type (each has its own generator), never on the run.
    """
    device = torch.device(device or "cpu")
    gen = torch.Generator(device=device).manual_seed(SPLIT_SEED)

    def make(n):
        x = torch.randn(n, 3, image_size, image_size, generator=gen, device=device)
        y = torch.randint(0, num_classes, (n,), generator=gen, device=device)
        return _tensors_on(device, x, y)

    return make(train_size), make(test_size), num_classes, 3


def _image_transforms(image_size: int, train: bool, augment: bool):
    from torchvision import transforms as T

    steps = [T.Resize((image_size, image_size))]
    if train and augment:
        steps += [T.RandomCrop(image_size, padding=image_size // 8), T.RandomHorizontalFlip()]
    steps += [T.ToTensor(), T.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))]
    return T.Compose(steps)


def cifar10(data_dir: str | Path, image_size: int = 32) -> tuple[Dataset, Dataset, int, int]:
    from torchvision.datasets import CIFAR10

    root = Path(data_dir)
    try:
        train = CIFAR10(
            root, train=True, download=True, transform=_image_transforms(image_size, True, True)
        )
        test = CIFAR10(
            root, train=False, download=True, transform=_image_transforms(image_size, False, False)
        )
    except (OSError, RuntimeError) as err:  # URLError is an OSError
        reason = " ".join(str(err).split()) or type(err).__name__
        raise FileNotFoundError(
            f"cifar10 is not in {root} and downloading it failed ({reason}); download it once "
            f"on a machine with network access into --data-dir, or use --data digits"
        ) from None
    return train, test, 10, 3


def image_folder(path: str | Path, image_size: int = 32) -> tuple[Dataset, Dataset, int, int]:
    """An ImageFolder tree: PATH/train + PATH/val, or one PATH/<class> tree split 80/20."""
    from torchvision.datasets import ImageFolder

    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(
            f"--data {path}: no such folder (and not one of {', '.join(NAMES)})"
        )

    def load(folder: Path, train: bool) -> ImageFolder:
        try:
            return ImageFolder(
                folder, transform=_image_transforms(image_size, train, augment=False)
            )
        except FileNotFoundError:
            raise FileNotFoundError(
                f"--data {path}: no images in {folder} (expected {folder}/<class>/<image>.png)"
            ) from None

    if (root / "train").is_dir() and (root / "val").is_dir():
        train, test = load(root / "train", True), load(root / "val", False)
        if train.classes != test.classes:
            raise ValueError(
                f"--data {path}: train/ has classes {train.classes} but val/ has {test.classes}"
            )
        return train, test, len(train.classes), 3
    # One tree: two views of it (the same transforms here, no augmentation), split by index.
    full = load(root, True)
    if len(full) < 2:
        raise ValueError(
            f"--data {path}: {len(full)} image(s); a train/test split needs at least 2"
        )
    train_idx, test_idx = _split(len(full))
    return Subset(full, train_idx), Subset(full, test_idx), len(full.classes), 3


def _synthetic_size(name: str) -> int:
    """synthetic -> 2048, synthetic:N -> N training images."""
    _, _, count = name.partition(":")
    if not count:
        return 2048
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"--data {name}: expected synthetic or synthetic:N with N >= 1 images")
    return int(count)


# --8<-- [start:device-data]
class DeviceTensors(TensorDataset):
    """A TensorDataset whose tensors live on a GPU, and which hands out whole batches.

    DataLoader asks for a batch through `__getitems__` when a data set has
    one: here that is one gather per tensor, instead of B single-sample
    lookups and a stack. At 30 ms per training step (ResNet-50, bf16, on an
    H200) the per-sample way costs a few ms of Python per step, and a GPU fed
    by a busy CPU waits.
    """

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        # Pinned + non_blocking: the 1 kB of indices is copied in stream order,
        # without making the CPU wait for the GPU (a plain copy would).
        index = torch.as_tensor(indices).pin_memory()
        index = index.to(self.tensors[0].device, non_blocking=True)
        return tuple(t[index] for t in self.tensors)


def _batch_as_is(batch):
    """collate_fn for DeviceTensors: __getitems__ already returns the batch."""
    return batch


# --8<-- [end:device-data]


def _on(device, train: TensorDataset, test: TensorDataset, *rest):
    """Move two tensor data sets to `device` once (None: leave them where they are)."""
    if device is None:
        return (train, test, *rest)
    return tuple(_tensors_on(device, *ds.tensors) for ds in (train, test)) + rest


def _tensors_on(device, *tensors: torch.Tensor) -> TensorDataset:
    tensors = tuple(t.to(device) for t in tensors)
    return TensorDataset(*tensors) if tensors[0].device.type == "cpu" else DeviceTensors(*tensors)


def build_datasets(
    name: str,
    data_dir: str | Path = "data",
    image_size: int | None = None,
    device: torch.device | str | None = None,
) -> tuple[Dataset, Dataset, int, int]:
    """(train set, test set, number of classes, input channels) for --data `name`.

    With `device`, tensor data sets (digits, synthetic) are put on it; image
    folders stay on disk and are decoded by DataLoader workers.
    Raises FileNotFoundError or ValueError with a one-line message that names
    the problem, for a missing folder, an empty tree or an unknown name.
    """
    check(name, image_size)
    if name == "digits":
        return _on(device, *digits())
    if name == "synthetic" or name.startswith("synthetic:"):
        return synthetic(image_size or 32, train_size=_synthetic_size(name), device=device)
    if name == "cifar10":
        return cifar10(data_dir, image_size or 32)
    return image_folder(name, image_size or 32)


def check(name: str, image_size: int | None = None) -> None:
    """build_datasets' checks that need no data loaded: an unknown name, a folder that is
    not there, --image-size with the digits. The launching process calls it (through
    course.options.parse), so that the mistake is one line before any rank starts."""
    if name == "digits":
        if image_size not in (None, 8):
            raise ValueError("--data digits is 8x8; --image-size does not apply")
    elif name == "synthetic" or name.startswith("synthetic:"):
        _synthetic_size(name)
    elif name != "cifar10":
        looks_like_path = any(sep in name for sep in ("/", "\\", ".")) or Path(name).exists()
        if not looks_like_path:
            raise ValueError(
                f"--data {name}: unknown; use one of {', '.join(NAMES)} or a folder path"
            )
        if not Path(name).is_dir():
            raise FileNotFoundError(
                f"--data {name}: no such folder (and not one of {', '.join(NAMES)})"
            )


# --8<-- [start:loader]
def loader(
    dataset: Dataset,
    batch_size: int,
    device: torch.device,
    num_workers: int | None = None,
    pin_memory: bool | None = None,
    **options,
) -> DataLoader:
    """A DataLoader that keeps `device` fed; `options` go to DataLoader (shuffle, sampler...).

    - Data already on a GPU (DeviceTensors): no workers (a worker process
      cannot touch CUDA memory, and there is nothing left to do), no pinning,
      one gather per batch.
    - Other tensors in memory, or a CPU run: no workers; indexing is cheap,
      and on a CPU the workers would take the cores the model trains on.
    - Images decoded from files for a GPU: 4 worker processes (or
      --num-workers) that stay alive across epochs and each keep 4 batches
      ready, so decoding overlaps training; pinned (page-locked) batches, so
      that `.to(device, non_blocking=True)` copies while the GPU computes.
      pin_memory=False turns the pinning off (lesson 08 measures what it buys).
    """
    tensors = isinstance(dataset, TensorDataset)
    on_device = tensors and dataset.tensors[0].device.type != "cpu"
    if on_device:
        num_workers = 0
        if isinstance(dataset, DeviceTensors):
            options["collate_fn"] = _batch_as_is
    elif num_workers is None:
        num_workers = 0 if tensors or device.type == "cpu" else 4
    if num_workers:
        options.update(persistent_workers=True, prefetch_factor=4)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        pin_memory=device.type == "cuda" and not on_device and pin_memory is not False,
        **options,
    )


# --8<-- [end:loader]


# --8<-- [start:resumable]
class ResumableSampler(DistributedSampler):
    """A DistributedSampler that can start an epoch part-way (lesson 04): it skips
    the first `skip` indices of this rank's shard, the batches already trained on.

    The shard of an epoch depends only on (seed, epoch, rank), so a restarted
    process rebuilds exactly the order the crashed one had, and skipping
    `batches done x batch size` indices lands on the next batch to train.
    """

    skip = 0

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return max(self.num_samples - self.skip, 0)


# --8<-- [end:resumable]


# --- a small image tree for tests and exercises -----------------------------

# One colour and one stripe direction per class: easy to learn, not trivial
# once noise is added, and different enough in every channel.
_COLOURS = [(220, 60, 60), (60, 200, 80), (70, 90, 230), (230, 200, 50), (180, 70, 200)]


def make_image_folder(
    path: str | Path,
    classes: int = 3,
    per_class: int = 20,
    size: int = 16,
    seed: int = 0,
    val_per_class: int = 0,
) -> Path:
    """Write a learnable ImageFolder tree of PNGs and return its root.

    With val_per_class > 0 it writes path/train/<class>/ and path/val/<class>/,
    otherwise one path/<class>/ tree. Class k has colour k (cycling) and
    stripes of period 2 + k, plus noise, so a small CNN learns it in a few steps.
    """
    import numpy as np
    from PIL import Image

    root = Path(path)
    rng = np.random.default_rng(seed)
    splits = {"train": per_class, "val": val_per_class} if val_per_class > 0 else {"": per_class}
    yy, xx = np.mgrid[0:size, 0:size]
    for split, count in splits.items():
        for k in range(classes):
            folder = root / split / f"class_{k}"
            folder.mkdir(parents=True, exist_ok=True)
            colour = np.array(_COLOURS[k % len(_COLOURS)], dtype=np.float32)
            stripes = ((xx if k % 2 else yy) // (2 + k // 2)) % 2  # class-specific pattern
            for i in range(count):
                shift = rng.integers(0, size)
                pattern = np.roll(stripes, shift, axis=k % 2)[..., None]
                image = colour * (0.55 + 0.45 * pattern) + rng.normal(0, 25, (size, size, 3))
                image = np.clip(image, 0, 255).astype(np.uint8)
                Image.fromarray(image).save(folder / f"{i:04d}.png")
    return root


def lookup_tokens(step: int, rank: int, size: int, vocab: int, length: int = 16):
    """Lesson 10's toy language: rank `rank`'s `size` sequences of random tokens for `step`,
    and the answer for each token, a fixed permutation of the vocabulary (5t + 3 mod vocab,
    vocab even): a lookup table an MLP learns in a few dozen steps."""
    gen = torch.Generator().manual_seed(step * 1000 + rank)
    tokens = torch.randint(0, vocab, (size, length), generator=gen)
    return tokens, (tokens * 5 + 3) % vocab
