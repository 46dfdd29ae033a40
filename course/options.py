"""The training lessons' command line: the flags they share, checked once.

Each lesson script calls `options.parser(__doc__)` and adds only the flags of
its own idea (--gpus for DataParallel, --nproc and --backend for DDP,
--snapshot for torchrun). Bad values give one line, not a usage dump:

    train.py: error: argument --epochs: must be at least 1, got 0 (see --help)
"""

from __future__ import annotations

import argparse
import sys

import torch

from course import data, models


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error instead of the usage dump."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def add_speed_options(parser: argparse.ArgumentParser, precisions=("off", "bf16")) -> None:
    """--amp and --channels-last, the two switches `python -m course bench` compares.

    Both change speed, not what is computed in any way that matters for
    training: bf16 autocast runs matrix products and convolutions on Tensor
    Cores in bfloat16 (weights and the optimizer stay fp32), and channels-last
    (NHWC) is the layout those convolution kernels read fastest. Lesson 08 adds
    fp16, which needs a GradScaler.
    """
    help = " or ".join(p for p in precisions if p != "off") + " autocast"
    parser.add_argument("--amp", choices=precisions, default="off", help=help)
    parser.add_argument("--channels-last", action="store_true", help="NHWC memory layout")


def parser(
    doc: str | None, prog: str = "train.py", per: str = "", precisions=("off", "bf16")
) -> ArgumentParser:
    """A parser with the flags every training lesson has; `per` says what a batch is per,
    `precisions` which --amp values the lesson handles."""
    p = ArgumentParser(prog=prog, description=(doc or "").strip().splitlines()[0])
    p.add_argument("--data", default="digits", help="digits, synthetic, cifar10 or a folder")
    p.add_argument("--data-dir", default="data", help="where cifar10 is downloaded")
    p.add_argument("--image-size", type=positive_int, help="resize folder/cifar images")
    p.add_argument("--model", default="cnn", choices=models.NAMES)
    p.add_argument("--norm", default="batch", choices=models.NORMS, help="cnn: batch or none")
    p.add_argument("--epochs", type=positive_int, default=3)
    p.add_argument("--batch-size", type=positive_int, default=64, help=per or None)
    p.add_argument("--lr", type=positive_float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=positive_int, help="stop after this many steps in all")
    p.add_argument("--checkpoint", help="save here after every epoch (atomically)")
    p.add_argument("--metrics-out", help="write per-epoch metrics here as JSON")
    p.add_argument("--num-workers", type=non_negative_int, help="DataLoader worker processes")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_speed_options(p, precisions)
    return p


class Options(argparse.Namespace):
    """What `parse` returns: the parsed flags, and two attributes they imply.

    The flags are the parser's (`--batch-size` is `args.batch_size`); these two are not
    flags but set by `parse` from them, declared here so that a reader (and an editor)
    finds where `args.progress` and `args.memory_format` come from.
    """

    progress: bool
    """Show a progress bar: only for a person watching, so not with --quiet and not
    when stderr goes into a log file."""
    memory_format: torch.memory_format
    """The layout --channels-last asks for (torch.channels_last, else
    torch.preserve_format), for `model.to(device, memory_format=...)`."""


def parse(p: argparse.ArgumentParser, argv=None) -> Options:
    """Parse, refuse the combinations that cannot work, and add what the flags imply
    (`Options.progress` and `Options.memory_format`)."""
    args = p.parse_args(argv, namespace=Options())
    if isinstance(getattr(args, "data", None), str):  # a missing folder: one line, no rank
        try:
            data.check(args.data, getattr(args, "image_size", None))
        except (FileNotFoundError, ValueError) as err:
            p.error(str(err))
    if getattr(args, "resume", False) and not args.checkpoint:
        p.error("--resume needs --checkpoint PATH")
    if getattr(args, "compile", False) and getattr(args, "bucket_cap_mb", 25.0) < 1:
        # torch.compile splits a DDP model's graph at its buckets (DDPOptimizer), with a first
        # bucket of DDP's default 1 MiB whatever the cap, and asserts (torch 2.8 and 2.14.1)
        # that it is no larger than the others: every rank would die of it at its first step.
        p.error(f"--compile needs --bucket-cap-mb 1 or more, not {args.bucket_cap_mb:g}: "
                "torch.compile's DDPOptimizer starts with a 1 MiB bucket")  # fmt: skip
    args.progress = not args.quiet and sys.stderr.isatty()
    args.memory_format = torch.channels_last if args.channels_last else torch.preserve_format
    return args


def steps_left(args, step: int) -> int | None:
    """How many steps --max-steps still allows (None: no limit)."""
    return None if args.max_steps is None else max(args.max_steps - step, 0)
