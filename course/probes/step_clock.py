"""Step timestamps recorded from inside any training script, for `python -m course bench`.

The benchmark must time the lessons' *own* code, launched the way a student
launches it (mp.spawn, torchrun, DataParallel), without the lessons carrying
any timing code. PyTorch offers the hook for that: a function registered with
`torch.optim.optimizer.register_optimizer_step_post_hook` runs after every
`optimizer.step()` of every optimizer in the process.

`course/probes/_site/sitecustomize.py` installs it (course/probes/__init__.py) in every
Python process that starts with `COURSE_STEP_LOG=DIR` in its environment and
`course/probes/_site` on its PYTHONPATH (course.launch puts it there), spawned ranks
and torchrun's workers included. Every `COURSE_STEP_EVERY` steps (a window) the hook waits for the
GPU to finish (kernels run asynchronously: the CPU's clock alone would time
the launches, not the work) and appends "<step> <seconds>" to
DIR/rank<R>.<pid>.txt. The waits are only at window edges, so the GPU runs
ahead of the CPU inside a window exactly as it does untimed.

With COURSE_STEP_WAIT=1 as well, each line gets a third number: the seconds of
the window that passed between an optimizer step's end and the next forward
call of any module (a global forward pre-hook), which is where a training loop
waits for its next batch. data_wait() turns that into the data-wait fraction.
Off by default: a hook on every module's call is a (small) cost of its own.

With COURSE_STEP_PROFILE=A:B as well, torch.profiler records the steps after step A up
to step B (a warm-up window: its time is dropped anyway), and the rank appends to
DIR/comm-rank<R>.<pid>.txt the steps, the seconds during which a collective ran (NCCL's
kernels on the GPU, gloo's operations, `gloo:...`, on the CPU, their intervals merged so
that overlapping ones count once) and the window's own wall seconds. profiled() reads it:
the share of the step spent in collectives is taken within that one window, never against
other windows' step time, which a busy machine can make shorter than the profiled one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

LOG_ENV = "COURSE_STEP_LOG"
EVERY_ENV = "COURSE_STEP_EVERY"
WAIT_ENV = "COURSE_STEP_WAIT"
PROFILE_ENV = "COURSE_STEP_PROFILE"


def install() -> None:
    """Register the hook (idempotent enough: one call per process, from sitecustomize)."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from course.probes.lines import append_line
    from course.probes.write_log import current_rank

    folder = Path(os.environ[LOG_ENV])
    every = max(1, int(os.environ.get(EVERY_ENV, "1")))
    timed_waits = os.environ.get(WAIT_ENV) == "1"
    steps, waited, step_end = 0, 0.0, None
    first, _, last = os.environ.get(PROFILE_ENV, "").partition(":")
    profiled, profiler = (int(first), int(last)) if first and last else None, None

    def before_forward(_module, _args) -> None:
        nonlocal waited, step_end
        if step_end is not None:  # the first forward since the last step: the batch is here
            waited += time.perf_counter() - step_end
            step_end = None

    if timed_waits:
        torch.nn.modules.module.register_module_forward_pre_hook(before_forward)

    def after_step(_optimizer, _args, _kwargs) -> None:
        nonlocal steps, waited, step_end, profiler
        steps += 1
        if profiled and steps == profiled[0]:
            profiler = _start_profiler()
        elif profiler is not None and steps == profiled[1]:
            seconds, wall = _stop_profiler(profiler)
            profiler = None
            name = f"comm-rank{max(current_rank(), 0)}.{os.getpid()}.txt"
            (folder / name).write_text(f"{profiled[1] - profiled[0]} {seconds:.6f} {wall:.6f}\n")
        if steps % every:
            step_end = time.perf_counter() if timed_waits else None
            return
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # this rank's current device: all its queued work
        now = time.perf_counter()
        line = f"{steps} {now:.6f}" + (f" {waited:.6f}\n" if timed_waits else "\n")
        waited, step_end = 0.0, (now if timed_waits else None)
        append_line(folder / f"rank{max(current_rank(), 0)}.{os.getpid()}.txt", line)

    register_optimizer_step_post_hook(after_step)


def _start_profiler():
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()  # the window starts with an idle GPU, as the clock's do
        activities.append(ProfilerActivity.CUDA)
    profiler = profile(activities=activities)
    profiler.__enter__()
    profiler.course_started = time.perf_counter()  # after __enter__: what it can record
    return profiler


def _stop_profiler(profiler) -> tuple[float, float]:
    """Seconds, within the profiled steps, during which a collective ran, and the
    profiled steps' wall seconds, from the profiler's start to its stop."""
    import json
    import tempfile

    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    wall = time.perf_counter() - profiler.course_started  # before __exit__'s own cost
    profiler.__exit__(None, None, None)
    with tempfile.TemporaryDirectory(prefix="course-profile-") as scratch:
        trace = Path(scratch) / "trace.json"
        profiler.export_chrome_trace(str(trace))  # the format every torch version writes
        events = json.loads(trace.read_text()).get("traceEvents", [])
    comm = merged_seconds(
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("ph") == "X" and "dur" in e and is_collective(e)
    )
    return comm, wall


def is_collective(event: dict) -> bool:
    """An NCCL kernel on the GPU, or one of gloo's operations on the CPU."""
    name = str(event.get("name", ""))
    if event.get("cat") == "kernel":
        return "nccl" in name.lower()
    return name.startswith("gloo:")


def merged_seconds(spans) -> float:
    """The length of the union of (start, end) intervals in microseconds, in seconds."""
    total, end = 0.0, None
    for start, stop in sorted(spans):
        if end is None or start > end:
            total, end = total + (stop - start), stop
        elif stop > end:
            total, end = total + (stop - end), stop
    return total / 1e6


def profiled(folder: str | Path, rank: int = 0) -> tuple[float, float] | None:
    """(seconds per step during which `rank` ran a collective, wall seconds per step), both
    over the same profiled steps (COURSE_STEP_PROFILE); None if it profiled none."""
    for path in sorted(Path(folder).glob(f"comm-rank{rank}.*.txt")):
        steps, seconds, wall = path.read_text().split()
        return float(seconds) / int(steps), float(wall) / int(steps)
    return None


def read(folder: str | Path, rank: int = 0) -> list[tuple[int, float]]:
    """(step, seconds) pairs that `rank` recorded in `folder`, in order; [] if none."""
    points: list[tuple[int, float]] = []
    for path in sorted(Path(folder).glob(f"rank{rank}.*.txt")):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) in (2, 3):
                points.append((int(parts[0]), float(parts[1])))
    return points


def data_wait(
    folder: str | Path, rank: int = 0, skip: int = 1, per_step: bool = False
) -> float | None:
    """The share of `rank`'s time, from the end of its window `skip` on, that it spent
    between a step's end and the next forward (COURSE_STEP_WAIT=1's column), or with
    per_step those seconds per step; None without such windows."""
    rows = _wait_rows(folder, rank)[skip:]
    if len(rows) < 2 or rows[-1][1] <= rows[0][1]:
        return None
    waited = sum(wait for _, _, wait in rows[1:])
    if per_step:
        return waited / (rows[-1][0] - rows[0][0])
    return waited / (rows[-1][1] - rows[0][1])


def typical_wait(folder: str | Path, rank: int = 0, skip: int = 1) -> float | None:
    """The median, over `rank`'s windows from the end of window `skip` on, of the data
    wait per step: what the loop waits for a typical batch. Unlike data_wait's mean, one
    long wait does not move it: DataLoader's default workers (not persistent) start again
    at each epoch, and the first batches of that epoch wait for them once."""
    rows = _wait_rows(folder, rank)[skip:]
    pairs = zip(rows[:-1], rows[1:], strict=True)
    per_step = sorted(wait / (step - before) for (before, _, _), (step, _, wait) in pairs)
    if not per_step:
        return None
    middle = len(per_step) // 2
    return per_step[middle] if len(per_step) % 2 else sum(per_step[middle - 1 : middle + 1]) / 2


def _wait_rows(folder: str | Path, rank: int) -> list[tuple[int, float, float]]:
    rows = []
    for path in sorted(Path(folder).glob(f"rank{rank}.*.txt")):
        rows += [line.split() for line in path.read_text().splitlines()]
    return [(int(r[0]), float(r[1]), float(r[2])) for r in rows if len(r) == 3]
