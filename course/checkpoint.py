"""Checkpoints that survive a crash, and the random state a resumed run needs.

`save` never leaves a half-written file where a checkpoint should be: it
writes through course.atomic, the course's one atomic writer (a temporary file
in the same folder, fsync, os.replace over the old one, fsync of the folder).
A crash at any moment leaves either the old checkpoint or the new one.

`rng_state` / `set_rng_state` capture every random generator a training loop
may draw from (torch CPU, each CUDA device, NumPy, Python's `random`), so a
resumed run draws the same numbers an uninterrupted one would have.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from course import atomic


def save(obj, path: str | Path) -> Path:
    """torch.save `obj` to `path` atomically (course.atomic.write); returns the path."""
    return atomic.write(path, lambda f: torch.save(obj, f))


def load(path: str | Path, map_location="cpu"):
    """Load a checkpoint written by `save` (tensors, numbers, strings, lists, dicts only)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path}: no such file")
    # weights_only: unpickling arbitrary objects from a file can run arbitrary code.
    return torch.load(path, map_location=map_location, weights_only=True)


def rng_state() -> dict:
    """The state of every random generator, in a form `load` accepts."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    # .cpu(): generator states are CPU byte tensors, even in a checkpoint loaded onto a GPU.
    torch.set_rng_state(state["torch"].cpu())
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    cuda = state.get("cuda")
    # A checkpoint from a GPU run can resume on a CPU (or on fewer GPUs): restore what exists.
    if cuda is not None and torch.cuda.is_available():
        for index, cuda_state in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state.cpu(), index)
