"""Plumbing every training lesson shares: seeding, picking devices and one-line
errors.

None of it is the lesson; it lives here once so the lesson files can show
the training loop and the one change each lesson makes to it.
"""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed every generator a training run draws from (model init, shuffling, augmentation)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def pick_device(spec: str = "auto") -> torch.device:
    """auto | cpu | cuda | cuda:N -> a torch.device, or ValueError saying why not."""
    spec = spec.strip().lower()
    gpus = visible_gpus()
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


# --8<-- [start:gpu_ids]
def gpu_ids(device: torch.device, gpus: int | None) -> list[int]:
    """The GPUs DataParallel uses: `gpus` of them from `device` on (default: all); [] on a CPU."""
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


# --8<-- [end:gpu_ids]


def exit_with_one_line(main, argv=None, prog: str | None = None) -> int:
    """Run main(argv); turn the errors a user can fix into `prog: error: ...` and exit code 2.

    main's return value, when it is an int, is the exit code (a launcher passes on its
    child's). Bugs (any other exception) still show their traceback: that is for the author.
    """
    prog = prog or Path(sys.argv[0]).name
    try:
        code = main(argv)
    except (FileNotFoundError, ValueError, ConnectionError) as err:
        print(f"{prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # an unsolved starter's TODO, raised here or in a rank
        todo = re.search(r"TODO at (\S+?):(\d+) is not done yet", str(err))
        if type(err).__name__ not in ("NotImplementedError", "ProcessRaisedException") or not todo:
            raise
        print(f"{prog}: the TODO at {todo[1]}:{todo[2]} is not done yet (python -m course hint "
              f"{todo[1][:2]})", file=sys.stderr)  # fmt: skip
        return 1
    return code if isinstance(code, int) else 0


def visible_gpus() -> int:
    """The CUDA GPUs this process sees (0 where CUDA does not work, or CUDA_VISIBLE_DEVICES
    hides them)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
