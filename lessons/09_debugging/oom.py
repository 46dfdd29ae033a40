"""Lesson 09, exercise 1 - out of memory: the same global batch in less memory.

Run it:
    python lessons/09_debugging/oom.py                 # the batch does not fit: out of memory
    python lessons/09_debugging/oom.py --budget-mb 64  # a budget the whole batch fits in
    python -m course grade 09 -k oom                   # grade your fix

The budget counts what autograd saves for backward (course/memory.py), on any
device: on a GPU the same activations are what runs out first. On a GPU each step
also prints torch.cuda.max_memory_allocated: all that the allocator held at once
(weights, gradients, momentum and the activations).
"""

import sys

import torch
import torch.nn.functional as F

from course import data, memory, models, options
from course.runtime import exit_with_one_line, pick_device, seed_everything


def parse_args(argv=None):
    p = options.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=options.positive_int, default=1024, help="global batch")
    p.add_argument("--micro-batch", type=options.positive_int, default=128, help="per backward")
    p.add_argument("--budget-mb", type=options.positive_float, default=8.0, help="activation MiB")
    p.add_argument("--steps", type=options.positive_int, default=5)
    p.add_argument("--lr", type=options.positive_float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    return p.parse_args(argv)


def train_step(model, optimizer, images, labels, micro_batch: int) -> float:
    """One optimizer step on the whole batch (`images`, `labels`); returns its mean loss.

    At most `micro_batch` images go through forward and backward at a time."""
    optimizer.zero_grad(set_to_none=True)
    # TODO: the whole batch at once keeps every image's activations until backward. Keep
    # the step (the same gradient, one optimizer step) but run forward and backward on
    # `micro_batch` images at a time.
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


def main(argv=None):
    args = parse_args(argv)
    seed_everything(args.seed)
    device = pick_device(args.device)
    train, _, classes, channels = data.digits()
    images, labels = (t[: args.batch_size].to(device) for t in train.tensors)
    if len(labels) < args.batch_size:
        raise ValueError(f"--batch-size {args.batch_size}: the digits have {len(labels)} images")
    # Without BatchNorm: its statistics are per forward pass, so micro-batches would
    # normalise differently from the whole batch (and accumulation would not be exact).
    model = models.build_model("cnn", classes, channels, norm="none").to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    budget = int(args.budget_mb * memory.MIB)
    print(f"global batch {args.batch_size}, micro-batch {args.micro_batch}, "
          f"activation budget {args.budget_mb:g} MiB")  # fmt: skip
    for step in range(1, args.steps + 1):
        if device.type == "cuda":  # the allocator's peak of this step alone
            torch.cuda.reset_peak_memory_stats(device)
        with memory.SavedTensors(model, budget=budget) as meter:
            try:
                loss = train_step(model, optimizer, images, labels, args.micro_batch)
            except torch.OutOfMemoryError as err:
                print(f"oom.py: error at step {step}: {err}", file=sys.stderr)
                return 1
        peak = meter.peak / memory.MIB
        held = ""
        if device.type == "cuda":
            allocated = torch.cuda.max_memory_allocated(device) / memory.MIB
            held = f", allocated at most {allocated:.1f} MiB"
        print(f"step {step}: loss {loss:.4f}, activations at most {peak:.1f} MiB{held}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_with_one_line(main))
