"""How the probes write their logs: one line at a time, safely shared."""

from __future__ import annotations

import os


def append_line(path, line: str) -> None:
    """Append one line to `path` in one O_APPEND write: the ranks and processes that share
    a file never interleave their lines, and a reader never sees half of one."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
