"""Plumbing every training lesson shares: seeding, picking a device, one-line
command-line errors and writing metrics files.

None of it is the lesson; it lives here once so the lesson files can show
the training loop and the one change each lesson makes to it.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import numpy as np
import torch

from course.files import write_json_atomic


def seed_everything(seed: int) -> None:
    """Seed every generator a training run draws from (model init, shuffling, augmentation)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def pick_device(spec: str = "auto") -> torch.device:
    """auto | cpu | cuda | cuda:N -> a torch.device, or ValueError saying why not."""
    spec = spec.strip().lower()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if spec == "auto":
        return torch.device("cuda", 0) if gpus else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        index = spec.partition(":")[2] or "0"
        if not index.isdigit():
            raise ValueError(f"--device {spec}: expected cuda:N with N a GPU number")
        if gpus == 0:
            raise ValueError(
                f"--device {spec}: CUDA is not available here (torch.cuda.is_available() is "
                f"False, torch {torch.__version__}); use --device cpu"
            )
        if int(index) >= gpus:
            raise ValueError(
                f"--device {spec}: only {gpus} GPU(s) visible (cuda:0..cuda:{gpus - 1})"
            )
        return torch.device("cuda", int(index))
    raise ValueError(f"--device {spec}: unknown; use auto, cpu, cuda or cuda:N")


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


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def exit_with_one_line(main, argv=None, prog: str | None = None) -> int:
    """Run main(argv); turn the errors a user can fix into `prog: error: ...` and exit code 2.

    Bugs (any other exception) still show their traceback: that is for the author.
    """
    prog = prog or Path(sys.argv[0]).name
    try:
        main(argv)
    except (FileNotFoundError, ValueError) as err:
        print(f"{prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return 0


def write_json(data, path: str | Path) -> Path:
    """Write `data` as JSON, atomically (a reader never sees half a file)."""
    return write_json_atomic(data, path)


def show_progress(quiet: bool) -> bool:
    """A progress bar only for a person watching: not with --quiet, not into a log file."""
    return not quiet and sys.stderr.isatty()


def add_speed_options(parser: argparse.ArgumentParser) -> None:
    """--amp and --channels-last, the two switches `python -m course bench` compares.

    Both change speed, not what is computed in any way that matters for
    training: bf16 autocast runs matrix products and convolutions on Tensor
    Cores in bfloat16 (weights and the optimizer stay fp32), and channels-last
    (NHWC) is the layout those convolution kernels read fastest.
    """
    parser.add_argument("--amp", choices=("off", "bf16"), default="off", help="bf16 autocast")
    parser.add_argument("--channels-last", action="store_true", help="NHWC memory layout")


def memory_format(args) -> torch.memory_format:
    """The layout --channels-last asks for, for `model.to(memory_format=...)`."""
    return torch.channels_last if args.channels_last else torch.preserve_format
