"""Lesson 02 - nn.DataParallel: one process drives every GPU of the machine.

Run it:
    python lessons/02_data_parallel/train_dp.py --device cuda --epochs 3   # every visible GPU
    python -m course bench --lessons 01 02                             # 1 GPU vs DataParallel
    python -m course grade 02                                          # grade your version
"""

import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from course import checkpoint, data, models, options

# Plain names for the checkpoint code: save is torch.save through a temporary file and a
# rename (a crash leaves the old file whole); rng_state/set_rng_state cover every generator
# a run draws from (torch's on the CPU and each GPU, NumPy's, Python's).
from course.checkpoint import rng_state, save, set_rng_state
from course.metrics import RunLog
from course.runtime import exit_with_one_line, gpu_ids, pick_device, seed_everything


def parse_args(argv=None):
    p = options.parser(__doc__, prog="train_dp.py", per="per GPU")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    p.add_argument("--gpus", type=options.positive_int, help="GPUs for DataParallel (default: all)")
    p.add_argument("--cudnn-benchmark", action="store_true", help="cuDNN autotuner (see main)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    return options.parse(p, argv)


# --8<-- [start:train_step]
def train_one_epoch(model, loader, optimizer, device, max_steps=None, progress=False, amp=False):
    """One pass over `loader` (or `max_steps` steps); returns (mean loss, images, steps).

    amp: run the forward pass and the loss under bf16 autocast."""
    model.train()  # BatchNorm uses batch statistics and updates its running ones
    total_loss = torch.zeros((), device=device)
    images_seen = steps = 0
    for images, labels in tqdm(loader, disable=not progress, leave=False, unit="batch"):
        # non_blocking: with pinned memory the copy overlaps with the GPU's work.
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        # detach, no .item(): keep the number on the device, don't wait for the GPU.
        total_loss += loss.detach() * len(labels)
        images_seen += len(labels)
        steps += 1
        if max_steps is not None and steps >= max_steps:
            break
    return (total_loss / max(images_seen, 1)).item(), images_seen, steps


# --8<-- [end:train_step]


# --8<-- [start:evaluate]
@torch.no_grad()  # no graph: evaluation needs no gradients and half the memory
def evaluate(model, loader, device) -> tuple[float, float]:
    """(mean loss, accuracy) of `model` on `loader`."""
    model.eval()  # BatchNorm uses its running statistics: results don't depend on the batch
    total_loss, correct, seen = 0.0, 0, 0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        logits = model(images)
        total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += (logits.argmax(dim=1) == labels).sum().item()
        seen += len(labels)
    return total_loss / max(seen, 1), correct / max(seen, 1)


# --8<-- [end:evaluate]


# --8<-- [start:wrap]
def wrap_model(model: nn.Module, device_ids: list[int]) -> nn.Module:
    """The model to train: DataParallel over `device_ids` when there are 2 or more."""
    # TODO: DataParallel over two or more GPUs, the model itself otherwise: over one GPU
    # it only adds the cost of scattering the batch and gathering the outputs.
    raise NotImplementedError("TODO at 02_data_parallel/train_dp.py:88 is not done yet")


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside a DataParallel wrapper (or the model itself)."""
    # TODO: the plain model inside a wrapper (a plain model as it is). The wrapper names
    # every weight "module.<name>": saved from it, a checkpoint won't load into lesson 01.
    raise NotImplementedError("TODO at 02_data_parallel/train_dp.py:95 is not done yet")


# --8<-- [end:wrap]


# --8<-- [start:checkpoint]
def checkpoint_state(model, optimizer, epoch: int, step: int) -> dict:
    """Everything a resumed run needs; the weights as a plain model's (no "module.")."""
    return {
        "model": unwrap(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": epoch,
        "step": step,
        "rng": rng_state(),
    }


def restore(state: dict, model, optimizer) -> tuple[int, int]:
    """Load a checkpoint_state() dict into model and optimizer; returns (epoch, step)."""
    unwrap(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"])
    return state["epoch"], state["step"]


# --8<-- [end:checkpoint]


# --8<-- [start:train]
def train(device: torch.device, args) -> dict:
    """The whole run on `device` and the GPUs after it; returns the metrics."""
    # cuDNN's autotuner caches its choices per *thread*, and DataParallel starts new threads
    # at every forward pass: it would tune again at every step. Off unless asked.
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    seed_everything(args.seed)
    # The data set's tensors go to the device once (course/data.py).
    train_set, test_set, classes, channels = data.build_datasets(
        args.data, args.data_dir, args.image_size, device
    )
    device_ids = gpu_ids(device, args.gpus)  # [] on the CPU
    batch = args.batch_size * max(1, len(device_ids))  # DataParallel splits it over the GPUs
    # --8<-- [start:loaders]
    # A generator reseeded every epoch (seed + epoch) decides the shuffle: a resumed run
    # shuffles epoch k as an uninterrupted one would, whatever else drew random numbers.
    shuffle = torch.Generator()
    train_loader = data.loader(
        train_set, batch, device, args.num_workers, shuffle=True, generator=shuffle
    )
    test_loader = data.loader(test_set, batch, device, args.num_workers)
    # --8<-- [end:loaders]
    model = models.build_model(args.model, classes, channels, args.norm)
    # The replicas are copied from the module on device_ids[0], so it must live there.
    model = wrap_model(model.to(device, memory_format=args.memory_format), device_ids)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)

    start_epoch = step = 0
    if args.resume:
        start_epoch, step = restore(checkpoint.load(args.checkpoint), model, optimizer)
        print(f"resumed from {args.checkpoint}: {start_epoch} epoch(s), {step} step(s) done")
    print(f"training {args.model} on {args.data} ({len(train_set)} images) on {device}")
    dp = isinstance(model, nn.DataParallel)  # say it: a learner must see whether DP is used
    no_dp = f"plain module: DataParallel needs at least 2 GPUs, here {len(device_ids)}"
    print(f"DataParallel over GPUs {device_ids}" if dp else no_dp)
    log = RunLog(args, start_epoch, device=str(device), gpus=len(device_ids), data_parallel=dp)
    log.metrics["global_batch_size"] = batch
    for epoch in range(start_epoch, args.epochs):
        shuffle.manual_seed(args.seed + epoch)
        if (left := options.steps_left(args, step)) == 0:
            break
        tic = time.perf_counter()
        train_loss, images, steps = train_one_epoch(
            model, train_loader, optimizer, device, left, args.progress,
            amp=args.amp == "bf16",
        )  # fmt: skip
        seconds = time.perf_counter() - tic  # .item() in train_one_epoch waited for the GPU
        step += steps
        test_loss, accuracy = evaluate(model, test_loader, device)
        complete = steps == len(train_loader)
        log.epoch(epoch + 1, train_loss, test_loss, accuracy, images, seconds, steps, complete)
        # Only a complete epoch is saved: a resumed run restarts at an epoch boundary.
        if args.checkpoint and complete:
            save(checkpoint_state(model, optimizer, epoch + 1, step), args.checkpoint)
    return log.finish(evaluate(model, test_loader, device)[1], step)


# --8<-- [end:train]


def main(argv=None) -> dict:
    args = parse_args(argv)
    return train(pick_device(args.device), args)


if __name__ == "__main__":
    # A wrong flag or a missing folder prints one line and exits 2; a bug still shows its traceback.
    sys.exit(exit_with_one_line(main))
