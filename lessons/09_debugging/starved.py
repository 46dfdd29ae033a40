"""Lesson 09, exercise 5 - more GPUs, no faster: the input pipeline starves each of them.

Every rank has a loader of its own, so one rank shows what each one waits for.
Run it:
    python -m course clock lessons/09_debugging/starved.py       # the data-wait fraction
    python -m course clock lessons/09_debugging/starved.py --workers 0
    python -m course grade 09 -k starved                         # grade your fix
"""

import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, RandomSampler

from course import data, models, options
from course.runtime import exit_with_one_line, seed_everything


def parse_args(argv=None):
    p = options.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--epochs", type=options.positive_int, default=2)
    p.add_argument("--batch-size", type=options.positive_int, default=32, help="per rank")
    p.add_argument("--workers", type=options.non_negative_int, default=4, help="loaders per rank")
    p.add_argument("--read-ms", type=options.non_negative_float, default=0.5, help="ms per image")
    return p.parse_args(argv)


class StoredDigits(Dataset):
    """Lesson 01's digits, as if each image were read from network storage and decoded:
    `read_ms` of latency per image (a sleep: what storage costs is waiting, and the
    lesson's figures should not depend on how busy your CPU is), then bytes to floats."""

    def __init__(self, read_ms: float):
        images, self.labels = data.digits()[0].tensors
        self.raw = ((images + 1) * 8).round().to(torch.uint8)  # as stored: 0..16, one byte
        self.read_s = read_ms / 1000

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        time.sleep(self.read_s)  # the read
        return self.raw[i].float() / 8 - 1, self.labels[i]  # the decode


def make_loader(dataset, batch_size: int, sampler, device, workers: int) -> DataLoader:
    """The loader of one rank: batches of its shard, in the sampler's order."""
    # TODO: every batch is read and decoded by the training process itself, between two
    # steps, while the model (on a GPU: the GPU) waits. Let `workers` processes prepare
    # the next batches while the current one trains.
    return DataLoader(dataset, batch_size, sampler=sampler)


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    seed_everything(0)
    model = models.SmallCNN().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dataset = StoredDigits(args.read_ms)
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(0))
    loader = make_loader(dataset, args.batch_size, sampler, device, args.workers)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        for images, labels in loader:
            images, labels = images.to(device, non_blocking=True), labels.to(device)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        seconds = time.perf_counter() - start
        print(f"epoch {epoch + 1}: loss {loss.item():.4f} ({seconds:.1f} s training)")


if __name__ == "__main__":
    sys.exit(exit_with_one_line(main))
