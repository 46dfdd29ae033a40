"""Where a record's numbers come from: GPU, count, interconnect, torch, CUDA, NCCL, date,
and the command."""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
from datetime import datetime, timezone

from course import __version__
from course.tools.student.bench.catalogue import Settings


def _run(args: list[str]) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def interconnect(topo: str) -> str:
    """How GPU0 reaches GPU1 in `nvidia-smi topo -m` output (NV18, PIX, SYS...), or ''."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", topo)  # nvidia-smi underlines the header
    rows = [line.split() for line in plain.splitlines() if line.strip()]
    header = next((r for r in rows if r and r[0] == "GPU0" and "GPU1" in r[1:]), None)
    gpu0 = next((r for r in rows if r and r[0] == "GPU0" and r is not header), None)
    if header is None or gpu0 is None:
        return ""
    column = header.index("GPU1")  # the header has no row label: its tokens start at column 1
    return gpu0[column + 1] if column + 1 < len(gpu0) else ""


def provenance(argv: list[str], settings: Settings) -> dict:
    """Where and how the figures were measured: enough to reproduce them."""
    import torch

    info = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m course bench " + shlex.join(argv),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "device": "CPU" if settings.device == "cpu" else "",
        "gpu_count": 0,
        "interconnect": "",
        "cuda": torch.version.cuda or "",
        "nccl": "",
        "course": __version__,
    }
    if settings.device == "cuda":
        names = [
            n.strip()
            for n in _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]).splitlines()
            if n.strip()
        ]
        info["gpu_count"] = len(names) or torch.cuda.device_count()
        info["device"] = names[0] if names else "GPU"
        if settings.gpus >= 2:
            info["interconnect"] = interconnect(_run(["nvidia-smi", "topo", "-m"])) or "unknown"
        if hasattr(torch.cuda, "nccl"):
            version = torch.cuda.nccl.version()
            info["nccl"] = (
                ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
            )
    return info
