"""Lesson 02 - nn.DataParallel: one process drives every GPU of the machine.

    python lessons/02_data_parallel/train_dp.py                       # all visible GPUs, or the CPU
    python lessons/02_data_parallel/train_dp.py --device cpu --epochs 3 --checkpoint runs/02.pt
    python -m course bench --lessons 01 02                           # one GPU vs DataParallel
    python -m course grade 02                                         # grade your version

This is lesson 01's loop with one change: the model is wrapped in
nn.DataParallel when two or more GPUs are visible. Each forward then
  1. scatters the batch: splits it along dim 0, one chunk per GPU;
  2. replicates the module: copies the weights from cuda:0 to every GPU, again
     at every step (they changed at the last optimizer step);
  3. runs the replicas in threads of this one Python process (the GIL lets only
     one thread run Python at a time, so launching kernels is serialised);
  4. gathers the outputs on cuda:0, where the loss is computed; backward sums
     every replica's gradients back onto cuda:0, and the optimizer steps there.
cuda:0 does more work and holds more memory than the others, and one process
feeds them all: DataParallel rarely scales past a few GPUs. That is why
PyTorch recommends DistributedDataParallel (lessons 03-04), even on one machine.
On the CPU or one GPU this script runs the plain module and says so.

--batch-size is per GPU: the loader's batch is batch_size x GPUs, which
DataParallel splits so that each GPU gets batch_size images.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from course import checkpoint, data, models
from course.train_utils import (
    ArgumentParser,
    add_speed_options,
    exit_with_one_line,
    memory_format,
    non_negative_int,
    pick_device,
    positive_float,
    positive_int,
    seed_everything,
    show_progress,
    write_json,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = ArgumentParser(prog="train_dp.py", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (the first GPU)")
    p.add_argument("--gpus", type=positive_int, help="GPUs for DataParallel (default: all)")
    p.add_argument("--data", default="digits", help="digits, synthetic, cifar10 or a folder")
    p.add_argument("--data-dir", default="data", help="where cifar10 is downloaded")
    p.add_argument("--image-size", type=positive_int, help="resize folder/cifar images")
    p.add_argument("--model", default="cnn", choices=models.NAMES)
    p.add_argument("--epochs", type=positive_int, default=3)
    p.add_argument("--batch-size", type=positive_int, default=64, help="per GPU")
    p.add_argument("--lr", type=positive_float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=positive_int, help="stop after this many steps in all")
    p.add_argument("--checkpoint", help="save here after every epoch (atomically)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--metrics-out", help="write per-epoch metrics here as JSON")
    p.add_argument("--num-workers", type=non_negative_int, help="DataLoader worker processes")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_speed_options(p)  # --amp bf16, --channels-last (what `python -m course bench` varies)
    p.add_argument("--cudnn-benchmark", action="store_true", help="cuDNN autotuner (see main)")
    args = p.parse_args(argv)
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint PATH")
    return args


# --8<-- [start:loaders]
def make_loaders(train_set, test_set, args, device: torch.device, batch_size: int):
    # A generator we reseed every epoch (seed + epoch) decides the shuffle, so a
    # resumed run shuffles epoch k exactly as an uninterrupted run would,
    # whatever else has drawn from the global RNG in between.
    shuffle_gen = torch.Generator()
    # batch_size is the global batch: DataParallel splits it across the GPUs.
    # data.loader: workers and pinned memory only where they help (lesson 01).
    train = data.loader(
        train_set, batch_size, device, num_workers=args.num_workers,
        shuffle=True, generator=shuffle_gen,
    )  # fmt: skip
    test = data.loader(test_set, batch_size, device, num_workers=args.num_workers)
    return train, test, shuffle_gen


# --8<-- [end:loaders]


# --8<-- [start:train_step]
def train_one_epoch(model, loader, optimizer, device, max_steps=None, progress=False, amp=False):
    """One pass over `loader` (or `max_steps` steps); returns (mean loss, images, steps).

    amp: run the forward pass and the loss under bf16 autocast (in every replica)."""
    model.train()  # BatchNorm uses batch statistics and updates its running ones
    total_loss = torch.zeros((), device=device)
    images_seen = steps = 0
    bar = tqdm(loader, disable=not progress, leave=False, unit="batch")
    start = time.perf_counter()
    for images, labels in bar:
        # non_blocking: with pinned memory the copy overlaps with the GPU's work.
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        # detach: keep the number, not the graph; no .item() here, which would
        # make the CPU wait for the GPU at every step.
        total_loss += loss.detach() * len(labels)
        images_seen += len(labels)
        steps += 1
        if progress and steps % 10 == 0:
            rate = images_seen / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{loss.item():.3f}", img_s=f"{rate:.0f}")
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
    # TODO: use DataParallel only where it can help: with two or more GPUs. Over one GPU
    # it only adds the cost of scattering the batch and gathering the outputs, so return
    # the model itself then.
    # HINT 1: DataParallel takes the model (already on the first GPU), the GPUs to use
    #   and the one that collects the outputs.
    # HINT 2: nn.DataParallel(model, device_ids=device_ids,
    #   output_device=device_ids[0]).
    # HINT 3: if len(device_ids) >= 2: return nn.DataParallel(...); otherwise return
    #   model.
    ### BEGIN SOLUTION
    if len(device_ids) >= 2:
        return nn.DataParallel(model, device_ids=device_ids, output_device=device_ids[0])
    return model
    ### END SOLUTION


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside a DataParallel wrapper (or the model itself)."""
    # TODO: return the plain model inside a wrapper (and a plain model as it is).
    # DataParallel names every weight "module.<name>", so a checkpoint saved from the
    # wrapper would not load into a plain model, as lesson 01's does.
    # HINT 1: The wrapper keeps the model it wraps in an attribute.
    # HINT 2: isinstance(model, nn.DataParallel) and model.module.
    # HINT 3: return model.module if isinstance(model, nn.DataParallel) else model.
    ### BEGIN SOLUTION
    if isinstance(model, nn.DataParallel):
        return model.module
    return model
    ### END SOLUTION


# --8<-- [end:wrap]


# --8<-- [start:checkpoint]
def checkpoint_state(model, optimizer, epoch: int, step: int) -> dict:
    """Everything a resumed run needs; the weights as a plain model's (no "module.")."""
    return {
        "model": unwrap(model).state_dict(),
        "optimizer": optimizer.state_dict(),  # keyed by parameter index: the same either way
        "epoch": epoch,
        "step": step,
        "rng": checkpoint.rng_state(),
    }


def restore(state: dict, model, optimizer) -> tuple[int, int]:
    unwrap(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    checkpoint.set_rng_state(state["rng"])
    return state["epoch"], state["step"]


# --8<-- [end:checkpoint]


# --8<-- [start:devices]
def device_ids_for(device: torch.device, gpus: int | None) -> list[int]:
    """The GPUs DataParallel uses: `gpus` of them from `device` on; [] on the CPU."""
    if device.type != "cuda":
        if gpus is not None and gpus > 1:
            raise ValueError(
                f"--gpus {gpus}: DataParallel needs CUDA GPUs; this run is on {device}"
            )
        return []
    first, visible = device.index or 0, torch.cuda.device_count()
    count = visible - first if gpus is None else gpus
    if first + count > visible:
        raise ValueError(f"--gpus {gpus} from cuda:{first}: only {visible} GPU(s) are visible")
    return list(range(first, first + count))


def describe(device_ids: list[int], device: torch.device) -> str:
    if len(device_ids) >= 2:
        return (
            f"DataParallel over {len(device_ids)} GPUs {device_ids}, outputs gathered on {device}"
        )
    # Say it: a learner who expects DataParallel must see that it is not in use.
    return f"plain module on {device}: DataParallel needs at least 2 GPUs, here {len(device_ids)}"


# --8<-- [end:devices]


# --8<-- [start:main]
def main(argv=None) -> dict:
    args = parse_args(argv)
    device = pick_device(args.device)
    # cuDNN's autotuner times every convolution algorithm for each new shape
    # and keeps the fastest, in a cache that is per *thread*. One GPU trains in
    # one thread and pays once; DataParallel runs each replica in a new thread
    # at every forward pass, so with the autotuner on it tunes again at every
    # step (see the page for what that cost on 2x H200). Off unless asked.
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    seed_everything(args.seed)
    train_set, test_set, num_classes, channels = data.build_datasets(
        args.data,
        args.data_dir,
        args.image_size,
        device,  # tensors go to cuda:0 once
    )
    device_ids = device_ids_for(device, args.gpus)
    global_batch = args.batch_size * max(1, len(device_ids))
    train_loader, test_loader, shuffle_gen = make_loaders(
        train_set, test_set, args, device, global_batch
    )
    # The replicas are copied from the module on device_ids[0], so it must live there.
    model = models.build_model(args.model, num_classes, channels)
    model = wrap_model(model.to(device, memory_format=memory_format(args)), device_ids)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)

    start_epoch = step = 0
    if args.resume:
        start_epoch, step = restore(checkpoint.load(args.checkpoint), model, optimizer)
        print(f"resumed from {args.checkpoint}: {start_epoch} epoch(s), {step} step(s) done")
    print(f"training {args.model} on {args.data} ({len(train_set)} images)")
    print(f"{describe(device_ids, device)}; global batch {global_batch}")

    metrics = {"device": str(device), "data": args.data, "model": args.model, "epochs": []}
    metrics.update(start_epoch=start_epoch, gpus=len(device_ids), global_batch_size=global_batch)
    metrics["data_parallel"] = isinstance(model, nn.DataParallel)
    images_total, train_seconds, accuracy = 0, 0.0, None
    for epoch in range(start_epoch, args.epochs):
        shuffle_gen.manual_seed(args.seed + epoch)
        left = None if args.max_steps is None else args.max_steps - step
        if left is not None and left <= 0:
            break
        tic = time.perf_counter()
        train_loss, images, steps = train_one_epoch(
            model, train_loader, optimizer, device, left, show_progress(args.quiet),
            amp=args.amp == "bf16",
        )  # fmt: skip
        seconds = time.perf_counter() - tic  # .item() in train_one_epoch waited for the GPU
        step += steps
        images_total += images
        train_seconds += seconds
        test_loss, accuracy = evaluate(model, test_loader, device)
        complete = steps == len(train_loader)
        metrics["epochs"].append(
            {
                "epoch": epoch + 1,
                "train_loss": train_loss,
                "test_loss": test_loss,
                "test_accuracy": accuracy,
                "images_per_second": images / seconds,
                "steps": steps,
                "complete": complete,
            }
        )
        print(
            f"epoch {epoch + 1}/{args.epochs}: train loss {train_loss:.4f}, test loss "
            f"{test_loss:.4f}, test accuracy {accuracy:.2%}, {images / seconds:,.0f} img/s"
        )
        # Only a complete epoch is saved: a resumed run restarts at an epoch boundary.
        if args.checkpoint and complete:
            checkpoint.save(checkpoint_state(model, optimizer, epoch + 1, step), args.checkpoint)

    if accuracy is None:  # resumed a run that was already finished
        _, accuracy = evaluate(model, test_loader, device)
    metrics.update(
        final_accuracy=accuracy,
        steps=step,
        images_per_second=images_total / train_seconds if train_seconds else 0.0,
        train_seconds=train_seconds,
    )
    print(f"final test accuracy {accuracy:.2%} after {step} steps ({train_seconds:.1f} s training)")
    if args.metrics_out:
        write_json(metrics, args.metrics_out)
    return metrics


# --8<-- [end:main]


if __name__ == "__main__":
    # A wrong flag or a missing folder prints one line and exits 2; a bug still shows its traceback.
    sys.exit(exit_with_one_line(main, prog="train_dp.py"))
