"""python -m course clock SCRIPT [ARGS...]: where a training script's time goes, step by step.

    python -m course clock lessons/09_debugging/starved.py              # its defaults
    python -m course clock --window 10 lessons/09_debugging/starved.py --workers 0

Runs `python SCRIPT ARGS...` (its output goes to the terminal as usual) with the course's
step clock armed (course/probes/step_clock.py): after every optimizer step, and at the
first forward call after it, the clock notes the time. It then prints, for rank 0 (or
the one process): the steps, the median window of steps, and the data-wait fraction,
the share of the time between a step's end and the next forward, which is where a
training loop waits for its next batch. The first window is warm-up and left out (the
loader's workers start, caches fill). Near 0: the loader keeps up. Large: the model (on
a GPU, the GPU) waits for data; more GPUs would wait as well.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from course import launch
from course.probes import step_clock


def parser() -> argparse.ArgumentParser:
    from course.options import ArgumentParser, positive_int

    p = ArgumentParser(prog="python -m course clock", description=__doc__.splitlines()[0])
    p.add_argument("--window", type=positive_int, default=5, help="steps per window (5)")
    p.add_argument("script", help="a training script (a lesson's, or your own)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def report(folder: str | Path, window: int) -> str:
    """What the clock saw in `folder`, in a few lines."""
    points = step_clock.read(folder, rank=0)
    if len(points) < 3:
        return "clock: fewer than 3 windows of steps: run more steps, or a smaller --window"
    times = [b - a for (_, a), (_, b) in zip(points[1:], points[2:], strict=False)]
    wait = step_clock.data_wait(folder, rank=0)
    lines = [
        f"clock: {points[-1][0]} steps; median window of {window} steps "
        f"{statistics.median(times) * 1000:.1f} ms ({statistics.median(times) / window * 1000:.2f}"
        " ms a step)",
    ]
    if wait is not None:
        lines.append(
            f"clock: data wait {wait:.0%} of the time (between a step and the next forward)"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    script = Path(args.script)
    if not script.is_file():
        raise FileNotFoundError(f"{script}: not found")
    with tempfile.TemporaryDirectory(prefix="course-clock-") as folder:
        env = {step_clock.LOG_ENV: folder, step_clock.EVERY_ENV: str(args.window)}
        env[step_clock.WAIT_ENV] = "1"
        code = subprocess.run(
            [sys.executable, str(script), *args.args], env=launch.child_env(env, one_thread=False)
        ).returncode
        print(report(folder, args.window))
    return code
