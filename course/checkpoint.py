"""Checkpoints that survive a crash, and the random state a resumed run needs.

`save` never leaves a half-written file where a checkpoint should be: it
writes a temporary file in the same folder, flushes it to disk (fsync) and
renames it over the old one with os.replace, which is atomic on POSIX and
Windows. A crash at any moment leaves either the old checkpoint or the new one.

`rng_state` / `set_rng_state` capture every random generator a training loop
may draw from (torch CPU, each CUDA device, NumPy, Python's `random`), so a
resumed run draws the same numbers an uninterrupted one would have.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import numpy as np
import torch


def save(obj, path: str | Path) -> Path:
    """torch.save `obj` to `path` atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Same folder: os.replace is only atomic within one file system.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)  # and so is the rename itself
    return path


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows, where folders cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
