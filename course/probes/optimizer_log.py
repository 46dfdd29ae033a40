"""Which optimizers step, by class, from inside any training script: a flag that picks the
optimizer (lesson 10's `--optimizer torch`) is seen doing so, or being ignored.

With COURSE_OPTIMIZER_LOG=DIR, a hook registered with
`torch.optim.optimizer.register_optimizer_step_post_hook` appends each class the first
time one of its optimizers steps, "module.QualName", to DIR/rank<R>.<pid>.txt. A wrapper
that steps an inner optimizer shows both (ZeroRedundancyOptimizer and its AdamW).
read(DIR) gives {rank: [class, ...]}.
"""

from __future__ import annotations

import os
from pathlib import Path

LOG_ENV = "COURSE_OPTIMIZER_LOG"


def install() -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from course.probes.lines import append_line
    from course.probes.write_log import current_rank

    folder, seen = Path(os.environ[LOG_ENV]), set()

    def after_step(optimizer, _args, _kwargs) -> None:
        kind = type(optimizer)
        name = f"{kind.__module__}.{kind.__qualname__}"
        if name not in seen:
            seen.add(name)
            path = folder / f"rank{max(current_rank(), 0)}.{os.getpid()}.txt"
            append_line(path, name + "\n")

    register_optimizer_step_post_hook(after_step)


def read(folder: Path | str) -> dict[int, list[str]]:
    """{rank: the optimizer classes that stepped there, in order}."""
    found: dict[int, list[str]] = {}
    for path in sorted(Path(folder).glob("rank*.txt")):
        rank = int(path.name.removeprefix("rank").split(".")[0])
        found.setdefault(rank, []).extend(path.read_text().split())
    return found
