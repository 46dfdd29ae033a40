"""course.data and course.models: the data sets, their errors, the generated tree."""

from __future__ import annotations

import pytest
import torch

from course import data, models


def test_digits_is_real_offline_data_with_a_fixed_split():
    train, test, classes, channels = data.build_datasets("digits")
    assert (len(train), len(test), classes, channels) == (1438, 359, 10, 1)
    x, y = train[0]
    assert x.shape == (1, 8, 8) and x.dtype == torch.float32 and -1 <= x.min() <= x.max() <= 1
    again, _, _, _ = data.build_datasets("digits")
    assert torch.equal(train.tensors[0], again.tensors[0])  # same split every call
    assert set(test.tensors[1].tolist()) == set(range(10))


def test_synthetic_has_fixed_shapes():
    train, test, classes, channels = data.build_datasets("synthetic", image_size=16)
    assert train[0][0].shape == (3, 16, 16) and (classes, channels) == (10, 3)


def test_generated_image_folder_with_train_and_val(tmp_path):
    root = data.make_image_folder(tmp_path / "tree", classes=3, per_class=4, val_per_class=2)
    train, test, classes, channels = data.build_datasets(str(root), image_size=16)
    assert (len(train), len(test), classes, channels) == (12, 6, 3, 3)
    assert train[0][0].shape == (3, 16, 16)


def test_one_image_tree_is_split_by_a_fixed_seed(tmp_path):
    root = data.make_image_folder(tmp_path / "tree", classes=2, per_class=10)
    first = data.build_datasets(str(root))
    second = data.build_datasets(str(root))
    assert len(first[0]) == 16 and len(first[1]) == 4
    assert first[1].indices == second[1].indices


@pytest.mark.parametrize(
    ("name", "error", "words"),
    [
        ("cifar", ValueError, "unknown"),
        ("/no/such/folder", FileNotFoundError, "no such folder"),
    ],
)
def test_bad_names_give_one_line(name, error, words):
    with pytest.raises(error, match=words) as info:
        data.build_datasets(name)
    assert "\n" not in str(info.value)


def test_empty_tree_gives_one_line(tmp_path):
    (tmp_path / "empty" / "class_0").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no images") as info:
        data.build_datasets(str(tmp_path / "empty"))
    assert "\n" not in str(info.value)


def test_cifar10_offline_fails_with_one_clear_line(tmp_path, monkeypatch):
    import urllib.error

    import torchvision.datasets

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure\nin name resolution")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", offline)
    with pytest.raises(FileNotFoundError, match="downloading it failed") as info:
        data.build_datasets("cifar10", tmp_path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("name", "size"), [("cnn", 8), ("resnet18", 32)])
def test_models_classify_small_images(name, size):
    model = models.build_model(name, num_classes=5, in_channels=1).eval()
    assert model(torch.randn(2, 1, size, size)).shape == (2, 5)
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())


def test_unknown_model():
    with pytest.raises(ValueError, match="unknown"):
        models.build_model("vgg", 10, 3)


def test_synthetic_takes_a_size_and_rejects_a_bad_one():
    train, test, _, _ = data.build_datasets("synthetic:300", image_size=8)
    assert len(train) == 300 and len(test) == 256
    assert len(data.build_datasets("synthetic", image_size=8)[0]) == 2048
    for bad in ("synthetic:0", "synthetic:many", "synthetic:-3"):
        with pytest.raises(ValueError, match="synthetic:N"):
            data.build_datasets(bad)


def test_loader_on_the_cpu_has_no_workers_and_no_pinning():
    train, _, _, _ = data.build_datasets("digits", device="cpu")
    loader = data.loader(train, 32, torch.device("cpu"), shuffle=True)
    assert loader.num_workers == 0 and not loader.pin_memory
    images, labels = next(iter(loader))
    assert images.shape == (32, 1, 8, 8) and labels.shape == (32,)


@pytest.mark.gpus(1)
def test_data_on_the_gpu_gives_the_batches_a_cpu_loader_gives():
    """DeviceTensors' one-gather batches equal the per-sample batches, in the same order."""
    cpu_train, _, _, _ = data.build_datasets("digits")
    gpu_train, _, _, _ = data.build_datasets("digits", device="cuda")
    assert isinstance(gpu_train, data.DeviceTensors)
    kwargs = dict(shuffle=True, num_workers=4)  # workers are ignored for data on the GPU
    on_gpu = data.loader(gpu_train, 50, torch.device("cuda"), **kwargs, generator=gen(1))
    on_cpu = data.loader(cpu_train, 50, torch.device("cpu"), shuffle=True, generator=gen(1))
    assert on_gpu.num_workers == 0 and not on_gpu.pin_memory
    for (x_gpu, y_gpu), (x_cpu, y_cpu) in zip(on_gpu, on_cpu, strict=True):
        assert x_gpu.is_cuda and torch.equal(x_gpu.cpu(), x_cpu) and torch.equal(y_gpu.cpu(), y_cpu)


def gen(seed):
    return torch.Generator().manual_seed(seed)
