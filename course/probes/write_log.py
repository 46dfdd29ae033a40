"""Which process wrote which file, recorded from inside any lesson process.

"Only rank 0 writes the checkpoint" must be checkable whatever code a
student writes the file with: course.checkpoint.save, their own torch.save
to a temporary file and os.replace, or a plain open(). So the grader does not
ask the lesson; it watches. With COURSE_WRITE_LOG=PATH in a process's
environment (and course/probes/_site on its PYTHONPATH, which course.launch always
arranges), that process appends one line "<rank> <how> <path>" to PATH for:

- every file it opens for writing (Python's audit event "open"),
- every rename or replace, with the new name (audit event "os.rename"),
- every removal of a file (audit event "os.remove"),
- every torch.save to a path (PyTorch writes those in C++, out of the
  audit hook's sight, so torch.save itself is wrapped).

<how> says what became of the file that had that name, seen just before the
operation: "new" (there was none), "over" (it was opened for writing: a
crash now leaves it cut short), "onto" (a finished file was renamed onto it,
the one step a crash cannot split) or "removed". A checkpoint that is ever
"over" or "removed" is not written atomically.

The rank is the process group's, once it exists, else $RANK, else -1.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

WRITE_LOG_ENV = "COURSE_WRITE_LOG"
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def current_rank() -> int:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "-1"))


def opened_for_writing(args) -> str | None:
    """The path of an audit "open" event that writes, else None."""
    path, mode, flags = (list(args) + [None, None, None])[:3]
    if isinstance(path, int) or path is None:
        return None
    writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
        isinstance(flags, int) and flags & _WRITING
    )
    return os.fsdecode(path) if writes else None


def install(log: str) -> None:
    log = os.path.abspath(log)
    busy = False

    def note(path, how: str = "") -> None:
        nonlocal busy
        path = os.path.abspath(os.fsdecode(path))
        if busy or path == log:
            return
        how = how or ("over" if os.path.exists(path) else "new")
        busy = True  # os.open below raises "open" again: don't log the log
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:  # one short O_APPEND write: lines from concurrent ranks never interleave
                os.write(fd, f"{current_rank()} {how} {path}\n".encode())
            finally:
                os.close(fd)
        finally:
            busy = False

    def hook(event: str, args) -> None:
        if event == "open":
            path = opened_for_writing(args)
            if path is not None:
                note(path)
        elif event == "os.rename":
            note(args[1], "onto")
        elif event == "os.remove" and os.path.isfile(os.fsdecode(args[0])):
            note(args[0], "removed")

    sys.addaudithook(hook)

    import torch

    save = torch.save

    def logged_save(obj, f, *a, **kw):
        if isinstance(f, (str, bytes, os.PathLike)):
            note(f)
        return save(obj, f, *a, **kw)

    torch.save = logged_save


def placements(log: str | Path, folder: str | Path) -> list[tuple[str, str, str]]:
    """(rank, how, file name) of every write, rename or removal in `folder` (not its
    subfolders), in order; `how` as the module says."""
    folder = os.path.abspath(folder)
    if not Path(log).is_file():
        return []
    seen = []
    for line in Path(log).read_text().splitlines():
        rank, how, path = line.split(" ", 2)
        if os.path.dirname(path) == folder:
            seen.append((rank, how, os.path.basename(path)))
    return seen


def events(log: str | Path, folder: str | Path) -> list[tuple[str, str]]:
    """(rank, file name) of every write or rename into `folder` (not its subfolders), in order."""
    return [(rank, name) for rank, how, name in placements(log, folder) if how != "removed"]


def writers(log: str | Path, folder: str | Path) -> dict[str, set[str]]:
    """{file name in `folder`: the ranks that wrote it or renamed a file onto it}."""
    seen: dict[str, set[str]] = {}
    for rank, name in events(log, folder):
        seen.setdefault(name, set()).add(rank)
    return seen


def not_replaced_atomically(log: str | Path, folder: str | Path, name: str, times: int) -> str:
    """Empty when `name` in `folder` was put in place `times` times, each created or renamed
    onto (a finished file replacing the old in one step), never opened for writing while
    it existed nor removed; else what was seen, in one sentence."""
    placed = [how for _, how, n in placements(log, folder) if n == name]
    if placed.count("onto") + placed.count("new") == times and not {"over", "removed"} & set(
        placed
    ):
        return ""
    return (
        f"{name} was put in place as {placed} (new: created, onto: a finished file renamed "
        "onto it, over: opened for writing while it held the last one, removed: deleted); "
        f"expected {times} times, never over nor removed. A crash while it is open or gone "
        "loses it: write a temporary file in the same folder, then os.replace it onto the "
        "name (course.checkpoint.save does)"
    )
