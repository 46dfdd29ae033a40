"""Writing small files so that a reader never sees half of one.

The grader's results.json and the lessons' metrics files are read while (or
after) something else may crash: write a temporary file beside the target,
then rename it over the target, which is atomic on one file system.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json_atomic(data, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
    return path
