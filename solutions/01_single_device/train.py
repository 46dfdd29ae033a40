"""Lesson 01 - one device: the training loop that every later lesson parallelises.

    python lessons/01_single_device/train.py                          # digits, --device auto
    python lessons/01_single_device/train.py --device cpu --epochs 3 --metrics-out runs/01.json
    python lessons/01_single_device/train.py --epochs 1 --checkpoint runs/01/ckpt.pt
    python lessons/01_single_device/train.py --epochs 3 --checkpoint runs/01/ckpt.pt --resume
    python lessons/01_single_device/train.py --device cuda --data cifar10 --model resnet18
    python -m course grade 01                                         # grade your version

The default run (scikit-learn's 8x8 digits, a small CNN, 3 epochs) reaches
96.7% test accuracy after under 1 s of training on two CPU cores with
OMP_NUM_THREADS=1 (about 6 s in all, most of it importing PyTorch).

A training step is five calls: forward, loss, zero_grad, backward, step. The
rest of this file is what makes a run trustworthy: a fixed test set, an
evaluation in eval mode, and checkpoints that let an interrupted run continue
to bit-identical weights. Lessons 03 and 04 copy this file and change only
how the work is spread over GPUs, so it is split into small functions.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F
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
    p = ArgumentParser(prog="train.py", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    p.add_argument("--data", default="digits", help="digits, synthetic, cifar10 or a folder")
    p.add_argument("--data-dir", default="data", help="where cifar10 is downloaded")
    p.add_argument("--image-size", type=positive_int, help="resize folder/cifar images")
    p.add_argument("--model", default="cnn", choices=models.NAMES)
    p.add_argument("--epochs", type=positive_int, default=3)
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--lr", type=positive_float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=positive_int, help="stop after this many steps in all")
    p.add_argument("--checkpoint", help="save here after every epoch (atomically)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--metrics-out", help="write per-epoch metrics here as JSON")
    p.add_argument("--num-workers", type=non_negative_int, help="DataLoader worker processes")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_speed_options(p)  # --amp bf16, --channels-last (what `python -m course bench` varies)
    args = p.parse_args(argv)
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint PATH")
    return args


# --8<-- [start:loaders]
def make_loaders(train_set, test_set, args, device: torch.device):
    # A generator we reseed every epoch (seed + epoch) decides the shuffle, so a
    # resumed run shuffles epoch k exactly as an uninterrupted run would,
    # whatever else has drawn from the global RNG in between.
    shuffle_gen = torch.Generator()
    # data.loader picks workers and pinned memory for where the data lives (see
    # course/data.py): tensors already on the GPU need neither.
    train = data.loader(
        train_set, args.batch_size, device, num_workers=args.num_workers,
        shuffle=True, generator=shuffle_gen,
    )  # fmt: skip
    test = data.loader(test_set, args.batch_size, device, num_workers=args.num_workers)
    return train, test, shuffle_gen


# --8<-- [end:loaders]


# --8<-- [start:train_step]
def train_one_epoch(model, loader, optimizer, device, max_steps=None, progress=False, amp=False):
    """One pass over `loader` (or `max_steps` steps); returns (mean loss, images, steps).

    amp: run the forward pass and the loss under bf16 autocast."""
    model.train()  # BatchNorm uses batch statistics and updates its running ones
    total_loss = torch.zeros((), device=device)
    images_seen = steps = 0
    bar = tqdm(loader, disable=not progress, leave=False, unit="batch")
    start = time.perf_counter()
    for images, labels in bar:
        # non_blocking: with pinned memory the copy overlaps with the GPU's work.
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        # TODO: one optimizer step on this batch: the heart of every later lesson, which
        # only changes where the batch comes from and how gradients are combined. Keep the
        # batch's loss in a variable named `loss` (the code below logs it).
        # HINT 1: A step has four parts: forward, loss, clear the old gradients,
        #   backward, update. Gradients accumulate in .grad until cleared, so clearing
        #   belongs in every step.
        # HINT 2: F.cross_entropy(logits, labels);
        #   optimizer.zero_grad(set_to_none=True); loss.backward(); optimizer.step(). Run
        #   the forward and loss under torch.autocast(device.type, dtype=torch.bfloat16,
        #   enabled=amp) so that --amp bf16 works.
        # HINT 3: with torch.autocast(...): logits = model(images); loss =
        #   F.cross_entropy(logits, labels) then zero_grad, backward, step.
        ### BEGIN SOLUTION
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        ### END SOLUTION
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
        # TODO: add this batch's loss and its number of right answers to the running
        # totals. The mean must be over examples, not over batches: the last batch is
        # usually smaller, and averaging batch means would weigh its examples more.
        # HINT 1: Sum the per-example losses of the batch (then the function divides by
        #   `seen`), and count the predictions that equal the labels.
        # HINT 2: F.cross_entropy(..., reduction="sum"); the prediction is
        #   logits.argmax(dim=1); .item() turns a one-element tensor into a number.
        # HINT 3: logits = model(images); total_loss += F.cross_entropy(logits, labels,
        #   reduction="sum").item(); correct += (logits.argmax(dim=1) ==
        #   labels).sum().item().
        ### BEGIN SOLUTION
        logits = model(images)
        total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += (logits.argmax(dim=1) == labels).sum().item()
        ### END SOLUTION
        seen += len(labels)
    return total_loss / max(seen, 1), correct / max(seen, 1)


# --8<-- [end:evaluate]


# --8<-- [start:checkpoint]
def checkpoint_state(model, optimizer, epoch: int, step: int) -> dict:
    """Everything a resumed run needs; `epoch` counts the epochs completed."""
    # TODO: return everything a resumed run needs to continue exactly where this one
    # stopped, as a dict with the keys "model", "optimizer", "epoch", "step" and "rng".
    # Whatever is missing makes the resumed run differ from an uninterrupted one.
    # HINT 1: Three kinds of state change during training: the weights, the optimizer's
    #   own buffers (SGD's momentum) and the random generators (shuffling, augmentation).
    # HINT 2: model.state_dict(), optimizer.state_dict() and checkpoint.rng_state().
    # HINT 3: return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
    #   "epoch": epoch, "step": step, "rng": checkpoint.rng_state()}.
    ### BEGIN SOLUTION
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": epoch,
        "step": step,
        "rng": checkpoint.rng_state(),
    }
    ### END SOLUTION


def restore(state: dict, model, optimizer) -> tuple[int, int]:
    """Load a checkpoint_state() dict into model and optimizer; returns (epoch, step)."""
    # TODO: put a checkpoint_state() dict back: after this, training continues as if it
    # had never stopped. Return (epoch, step).
    # HINT 1: Undo checkpoint_state() key by key.
    # HINT 2: model.load_state_dict, optimizer.load_state_dict and
    #   checkpoint.set_rng_state.
    # HINT 3: load the two state dicts, checkpoint.set_rng_state(state["rng"]), return
    #   state["epoch"], state["step"].
    ### BEGIN SOLUTION
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    checkpoint.set_rng_state(state["rng"])
    return state["epoch"], state["step"]
    ### END SOLUTION


# --8<-- [end:checkpoint]


# --8<-- [start:main]
def main(argv=None) -> dict:
    args = parse_args(argv)
    device = pick_device(args.device)
    seed_everything(args.seed)
    train_set, test_set, num_classes, channels = data.build_datasets(
        args.data,
        args.data_dir,
        args.image_size,
        device,  # tensors go to the device once
    )
    train_loader, test_loader, shuffle_gen = make_loaders(train_set, test_set, args, device)
    model = models.build_model(args.model, num_classes, channels)
    model = model.to(device, memory_format=memory_format(args))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)

    start_epoch = step = 0
    if args.resume:
        start_epoch, step = restore(checkpoint.load(args.checkpoint), model, optimizer)
        print(f"resumed from {args.checkpoint}: {start_epoch} epoch(s), {step} step(s) done")
    print(f"training {args.model} on {args.data} ({len(train_set)} images) on {device}")

    metrics = {"device": str(device), "data": args.data, "model": args.model, "epochs": []}
    metrics["start_epoch"] = start_epoch
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
    sys.exit(exit_with_one_line(main, prog="train.py"))
