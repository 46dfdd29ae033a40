"""Lesson 02 - nn.DataParallel: one process drives every GPU of the machine.

    python lessons/02_data_parallel/train_dp.py                       # all visible GPUs, or the CPU
    python lessons/02_data_parallel/train_dp.py --device cpu --epochs 3 --checkpoint runs/02.pt
    python lessons/02_data_parallel/train_dp.py --benchmark --metrics-out runs/02-bench.json
    python lessons/02_data_parallel/train_dp.py --benchmark --model resnet50 --batch-size 128 \
        --amp bf16 --channels-last --steps 30 --warmup 10 --metrics-out runs/02-bench.json  # GPUs
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
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

from course import checkpoint, data, models
from course.train_utils import (
    ArgumentParser,
    exit_with_one_line,
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
    bench = p.add_argument_group("benchmark: single GPU vs DataParallel, on synthetic data")
    bench.add_argument("--benchmark", action="store_true", help="measure instead of training")
    bench.add_argument("--steps", type=positive_int, default=20, help="timed steps per mode")
    bench.add_argument("--warmup", type=non_negative_int, default=5, help="untimed steps first")
    bench.add_argument("--amp", choices=("off", "bf16"), default="off", help="bf16 autocast")
    bench.add_argument("--channels-last", action="store_true", help="NHWC memory format")
    args = p.parse_args(argv)
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint PATH")
    return args


# --8<-- [start:loaders]
def make_loaders(train_set, test_set, args, device: torch.device, batch_size: int):
    # Worker processes decode images in parallel with training. They are a loss
    # when the data is already tensors in memory (digits, synthetic) or when the
    # model trains on the same CPU cores the workers would take.
    workers = args.num_workers
    if workers is None:
        in_memory = isinstance(train_set, TensorDataset)
        workers = 0 if in_memory or device.type == "cpu" else 4
    # A generator we reseed every epoch (seed + epoch) decides the shuffle, so a
    # resumed run shuffles epoch k exactly as an uninterrupted run would,
    # whatever else has drawn from the global RNG in between.
    shuffle_gen = torch.Generator()
    common = dict(
        batch_size=batch_size,  # the global batch: DataParallel splits it across the GPUs
        num_workers=workers,
        pin_memory=device.type == "cuda",  # page-locked memory: faster, async copies to a GPU
    )
    train = DataLoader(train_set, shuffle=True, generator=shuffle_gen, **common)
    test = DataLoader(test_set, shuffle=False, **common)
    return train, test, shuffle_gen


# --8<-- [end:loaders]


# --8<-- [start:train_step]
def train_one_epoch(model, loader, optimizer, device, max_steps=None, progress=False):
    """One pass over `loader` (or `max_steps` steps); returns (mean loss, images, steps)."""
    model.train()  # BatchNorm uses batch statistics and updates its running ones
    total_loss = torch.zeros((), device=device)
    images_seen = steps = 0
    bar = tqdm(loader, disable=not progress, leave=False, unit="batch")
    start = time.perf_counter()
    for images, labels in bar:
        # non_blocking: with pinned memory the copy overlaps with the GPU's work.
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
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
    # TODO: with two or more device ids, return nn.DataParallel(model,
    # device_ids=device_ids, output_device=device_ids[0]) (the model must
    # already be on cuda:<device_ids[0]>); otherwise return `model` itself:
    # DataParallel over one GPU only adds the cost of the scatter and gather.
    ### BEGIN SOLUTION
    if len(device_ids) >= 2:
        return nn.DataParallel(model, device_ids=device_ids, output_device=device_ids[0])
    return model
    ### END SOLUTION


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside a DataParallel wrapper (or the model itself)."""
    # TODO: DataParallel keeps the real model in `.module`, and its
    # state_dict() names every weight "module.<name>": a checkpoint saved
    # from it would not load into a plain model. Return model.module for a
    # DataParallel (isinstance(model, nn.DataParallel)), else the model.
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
    if args.benchmark:
        return benchmark(args, device)
    seed_everything(args.seed)
    train_set, test_set, num_classes, channels = data.build_datasets(
        args.data, args.data_dir, args.image_size
    )
    device_ids = device_ids_for(device, args.gpus)
    global_batch = args.batch_size * max(1, len(device_ids))
    train_loader, test_loader, shuffle_gen = make_loaders(
        train_set, test_set, args, device, global_batch
    )
    # The replicas are copied from the module on device_ids[0], so it must live there.
    model = wrap_model(models.build_model(args.model, num_classes, channels).to(device), device_ids)
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
            model, train_loader, optimizer, device, left, show_progress(args.quiet)
        )
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


# --8<-- [start:benchmark]
def time_training(model, batch_size, args, device, device_ids) -> dict:
    """Images/s and per-GPU peak memory of `args.steps` training steps on one fixed batch."""
    size = args.image_size or (224 if args.model == "resnet50" else 32)
    x = torch.randn(batch_size, 3, size, size, device=device)
    y = torch.randint(0, 10, (batch_size,), device=device)
    if args.channels_last:  # NHWC: the layout Tensor Core convolutions read fastest
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp == "bf16")

    def step():
        with amp:
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    gpus = device_ids or ([device.index or 0] if device.type == "cuda" else [])
    for _ in range(args.warmup):  # cuDNN autotuning, allocator growth, lazy init
        step()
    for i in gpus:
        torch.cuda.synchronize(i)
        torch.cuda.reset_peak_memory_stats(i)
    tic = time.perf_counter()
    for _ in range(args.steps):
        step()
    for i in gpus:  # kernels run asynchronously: wait for them before reading the clock
        torch.cuda.synchronize(i)
    seconds = time.perf_counter() - tic
    memory = {f"cuda:{i}": torch.cuda.max_memory_allocated(i) / 2**30 for i in device_ids or gpus}
    return {
        "gpus": max(1, len(device_ids)),
        "global_batch": batch_size,
        "images_per_second": batch_size * args.steps / seconds,
        "step_ms": 1000 * seconds / args.steps,
        "peak_memory_gib": memory,
    }


def benchmark(args, device: torch.device) -> dict:
    """Single device vs DataParallel on synthetic data; prints a table, writes --metrics-out."""
    all_ids = device_ids_for(device, args.gpus)
    torch.backends.cudnn.benchmark = True  # fixed shapes: let cuDNN time its algorithms once
    first = all_ids[:1]  # the single-GPU baseline runs on the first of them
    modes = [("single", first)]
    if len(all_ids) >= 2:
        modes.append(("DataParallel", all_ids))
    else:
        print(f"{describe(all_ids, device)}: measuring the single-device baseline only")
    rows = []
    for name, ids in modes:
        torch.manual_seed(args.seed)  # the same initial weights in every mode
        model = wrap_model(models.build_model(args.model, 10, 3).to(device), ids)
        row = time_training(model, args.batch_size * max(1, len(ids)), args, device, all_ids)
        rows.append({"mode": name, **row})
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    base = rows[0]["images_per_second"]
    print(f"{'mode':<14}{'GPUs':>5}{'batch':>7}{'img/s':>10}{'step ms':>9}{'speedup':>9}  peak GiB")
    for r in rows:
        r["speedup"] = r["images_per_second"] / base
        memory = " ".join(f"{v:.2f}" for v in r["peak_memory_gib"].values()) or "-"
        print(
            f"{r['mode']:<14}{r['gpus']:>5}{r['global_batch']:>7}{r['images_per_second']:>10,.0f}"
            f"{r['step_ms']:>9.1f}{r['speedup']:>9.2f}  {memory}"
        )
    result = {
        "benchmark": rows,
        "model": args.model,
        "per_gpu_batch": args.batch_size,
        "amp": args.amp,
        "channels_last": args.channels_last,
        "device": str(device),
        "gpu_names": [torch.cuda.get_device_name(i) for i in all_ids],
        "torch": torch.__version__,
    }
    if args.metrics_out:
        write_json(result, args.metrics_out)
    return result


# --8<-- [end:benchmark]


if __name__ == "__main__":
    # A wrong flag or a missing folder prints one line and exits 2; a bug still shows its traceback.
    sys.exit(exit_with_one_line(main, prog="train_dp.py"))
