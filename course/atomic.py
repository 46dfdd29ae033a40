"""Writing a file so that no reader, and no crash, ever sees half of it.

The one atomic writer of the course; checkpoints, metrics files, the
grader's results.json and the tools' records all go through `write`:

- the bytes go to a temporary file in the target's folder (os.replace is
  atomic only within one file system);
- they are flushed to disk (fsync) before the name points at them;
- os.replace puts the file in place: a reader sees the old file or the new
  one, never a mix;
- the folder is synced, so the rename itself survives a power cut.

A crash at any moment leaves the previous version in place, and no
temporary file behind, except after a kill -9, which the next write of the
same target does not mind.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write(path: str | Path, fill: Callable[[BinaryIO], object]) -> Path:
    """Write `path` atomically: `fill(f)` writes the contents into the binary file `f`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # as open() would make it: mkstemp's is 0600
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)  # and so is the rename itself
    return path


def write_json(data, path: str | Path, indent: int = 2) -> Path:
    """`data` as JSON (a final newline), written atomically."""
    text = json.dumps(data, indent=indent) + "\n"
    return write(path, lambda f: f.write(text.encode()))


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it: once, when the module loads
    os.umask(mask)
    return mask


_UMASK = _umask()


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
