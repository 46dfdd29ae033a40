"""How many all-reduces did DDP send, and how was it configured? Counted from inside.

DDP reduces gradients in C++, bucket by bucket, so patching
`torch.distributed.all_reduce` sees nothing. What DDP does offer is a
*communication hook*: a function it calls with each bucket that is ready, in
place of its own all-reduce. With `COURSE_DDP_LOG=DIR` in the environment,
every process (course/probes/__init__.py) wraps `DistributedDataParallel.__init__` so
that each wrapper gets a counting hook that then all-reduces exactly as DDP
would (torch's `allreduce_hook`: divide by the world size, sum). After every
`optimizer.step()` it appends one JSON line to DIR/rank<R>.<pid>.jsonl:

    {"steps": 3, "allreduces": 12, "rounds": 3, "bucket_cap_mb": 25.0,
     "gradient_as_bucket_view": true, "static_graph": false}

Both counts run from the start: `allreduces` counts buckets sent, `rounds`
counts backward passes that synchronised (their last bucket was sent), so a
loop that accumulates k micro-batches with no_sync shows one round a step,
and one without it shows k, whatever the bucket size. A lesson that registers a hook of its
own (bf16 compression, say) still runs it: the counter calls it.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

LOG_ENV = "COURSE_DDP_LOG"


def install() -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from course.probes.lines import append_line
    from course.probes.write_log import current_rank

    folder = Path(os.environ[LOG_ENV])
    counts = {"allreduces": 0, "rounds": 0, "steps": 0}
    wrappers: list = []
    original_init, original_register = DDP.__init__, DDP.register_comm_hook

    @functools.wraps(original_init)  # keeps DDP's signature for whoever inspects it
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self._course_inner = (self.process_group, default_hooks.allreduce_hook)

        def counting(_state, bucket):
            counts["allreduces"] += 1
            counts["rounds"] += bool(bucket.is_last())
            state, hook = self._course_inner
            return hook(state, bucket)

        original_register(self, None, counting)
        wrappers.append(self)

    def register_comm_hook(self, state, hook):
        self._course_inner = (state, hook)  # the lesson's own hook, behind the counter

    def after_step(_optimizer, _args, _kwargs) -> None:
        counts["steps"] += 1
        line = {k: counts[k] for k in ("steps", "allreduces", "rounds")}
        if wrappers:
            ddp = wrappers[-1]
            line.update(
                bucket_cap_mb=round(ddp.bucket_bytes_cap / 2**20, 6),
                gradient_as_bucket_view=bool(ddp.gradient_as_bucket_view),
                static_graph=bool(ddp.static_graph),
            )
        name = f"rank{max(current_rank(), 0)}.{os.getpid()}.jsonl"
        append_line(folder / name, json.dumps(line) + "\n")

    DDP.__init__ = __init__
    DDP.register_comm_hook = register_comm_hook
    register_optimizer_step_post_hook(after_step)


def read(folder: str | Path, rank: int = 0) -> list[dict]:
    """The lines `rank` wrote, over all its processes, in order; [] if none."""
    lines = []
    for path in sorted(Path(folder).glob(f"rank{rank}.*.jsonl"), key=lambda p: p.stat().st_mtime):
        for text in path.read_text().splitlines():
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError:
                continue  # a line cut by a killed process
    return lines


def per_step(lines: list[dict], key: str = "rounds") -> list[int]:
    """`key` (rounds or allreduces) for each optimizer step: the running count's differences."""
    counts = [line[key] for line in lines]
    return [b - a for a, b in zip([0, *counts], counts, strict=False)]
