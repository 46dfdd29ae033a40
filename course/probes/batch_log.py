"""Which samples each rank trains on: the indices of every batch a DataLoader loads.

"Each rank gets its own shard, and the shards change every epoch" must be
checkable whatever sampler a student writes (DistributedSampler, their own
class, a shuffled list). So the grader watches the DataLoader instead of
asking the lesson. With `COURSE_BATCH_LOG=DIR` in the environment, every
process (course/probes/__init__.py) appends one line per batch to
DIR/rank<R>.<pid>.txt:

    <pass> <dataset length> <index>,<index>,...

A pass is one iteration over a DataLoader (an epoch, or an evaluation); the
dataset length tells the training set from the test set. The first batch of each pass
also gives DIR/shape-rank<R>.<pid>.txt a line, the shape of its first tensor (the inputs):

    <pass> <dataset length> 64x3x32x32

which is how the grader sees what `--image-size` did to a folder's images. A process
that starts with MASTER_PORT in its environment also writes it to DIR/port.<pid>.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

LOG_ENV = "COURSE_BATCH_LOG"


def install() -> None:
    from torch.utils.data import dataloader

    from course.probes.lines import append_line
    from course.probes.write_log import current_rank

    folder = Path(os.environ[LOG_ENV])
    if os.environ.get("MASTER_PORT"):  # the job's rendezvous port, as this process got it
        (folder / f"port.{os.getpid()}").write_text(os.environ["MASTER_PORT"])
    passes = itertools.count()
    cls = dataloader._BaseDataLoaderIter
    init, reset, next_index, next_batch = cls.__init__, cls._reset, cls._next_index, cls.__next__

    def new_pass(self, loader) -> None:
        self._course_shaped = False
        self._course_pass = next(passes)
        try:
            self._course_length = len(loader.dataset)
        except TypeError:  # an iterable dataset has no length
            self._course_length = -1

    def __init__(self, loader, *args, **kwargs):  # a new iterator: a new pass
        new_pass(self, loader)
        init(self, loader, *args, **kwargs)

    def _reset(self, loader, *args, **kwargs):  # persistent workers: the iterator is reused
        new_pass(self, loader)
        reset(self, loader, *args, **kwargs)

    def _next_index(self):
        index = next_index(self)
        batch = index if isinstance(index, list | tuple) else [index]
        line = f"{self._course_pass} {self._course_length} {','.join(map(str, batch))}\n"
        append_line(folder / f"rank{max(current_rank(), 0)}.{os.getpid()}.txt", line)
        return index

    def __next__(self):
        batch = next_batch(self)
        if not getattr(self, "_course_shaped", True):  # the pass's first batch
            self._course_shaped = True
            shape = _first_shape(batch)
            if shape is not None:
                line = f"{self._course_pass} {self._course_length} {'x'.join(map(str, shape))}\n"
                name = f"shape-rank{max(current_rank(), 0)}.{os.getpid()}.txt"
                append_line(folder / name, line)
        return batch

    cls.__init__, cls._reset, cls._next_index = __init__, _reset, _next_index
    cls.__next__ = __next__


def _first_shape(batch) -> tuple[int, ...] | None:
    """The shape of the first tensor in a batch: itself, an (inputs, labels) pair's
    inputs, a dict's first value; None if it holds none."""
    while isinstance(batch, list | tuple | dict) and batch:
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    shape = getattr(batch, "shape", None)
    return tuple(int(n) for n in shape) if shape is not None else None


def ports(folder: str | Path) -> set[str]:
    """The MASTER_PORTs the job's processes started with (none, if it set no variable)."""
    return {path.read_text() for path in Path(folder).glob("port.*")}


def passes(folder: str | Path, rank: int, length: int) -> list[list[int]]:
    """The indices `rank` loaded, one list per pass over a dataset of `length` samples."""
    out: dict[tuple[str, int], list[int]] = {}
    for path in sorted(Path(folder).glob(f"rank{rank}.*.txt"), key=lambda p: p.stat().st_mtime):
        for line in path.read_text().splitlines():
            number, size, indices = (line.split(" ") + ["", "", ""])[:3]
            if size == str(length) and indices:
                out.setdefault((path.name, int(number)), []).extend(map(int, indices.split(",")))
    return list(out.values())


def shapes(folder: str | Path, rank: int, length: int) -> list[tuple[int, ...]]:
    """The shape of the first batch's inputs in each of `rank`'s passes over a dataset of
    `length` samples, in the order the passes ran."""
    out = []
    for path in sorted(
        Path(folder).glob(f"shape-rank{rank}.*.txt"), key=lambda p: p.stat().st_mtime
    ):
        for line in path.read_text().splitlines():
            parts = line.split(" ")
            if len(parts) == 3 and parts[1] == str(length):
                out.append(tuple(int(n) for n in parts[2].split("x")))
    return out
