"""Launching a row and timing its optimizer steps from the outside (course/probes/step_clock.py);
the speed-up and efficiency of each row against one device."""

from __future__ import annotations

import shlex
import statistics
import sys
import tempfile
from pathlib import Path

from course import REPO_ROOT, launch, registry
from course.probes import step_clock
from course.tools.student.bench.catalogue import Row, Settings, images_needed


def command(row: Row, impl: Path, settings: Settings, files: str | Path | None = None) -> list[str]:
    """The lesson's own command line for `row`, as its page documents it.

    files: the image folder (course.data.make_image_folder) of a row with files=True."""
    lesson = registry.get(row.lesson)
    script = lesson.path(REPO_ROOT / "lessons" if row.starter else impl)
    script = script.with_name(row.script) if row.script else script
    if not script.is_file():
        raise FileNotFoundError(f"{script}: not found (--impl {impl})")
    if row.script:  # its own flags and model (catalogue.lesson_09_rows)
        return [sys.executable, str(script), *row.extra]
    # One epoch holds every timed step: no evaluation or epoch boundary inside a window.
    data = str(files) if row.files else f"synthetic:{images_needed(row, settings)}"
    args = ["--data", data, "--image-size", str(settings.image_size)]
    args += ["--model", settings.model, "--batch-size", str(settings.batch_size)]
    args += ["--epochs", "1", "--max-steps", str(row.steps), "--quiet"]
    amp, channels_last = row.speed or (settings.amp, settings.channels_last)
    if amp != "off":  # only when asked: an older lesson without the flags still runs
        args += ["--amp", amp]
    if channels_last:
        args.append("--channels-last")
    nproc = row.world if lesson.launcher == "torchrun" else None  # spawn: --nproc in extra
    return registry.command(lesson, impl, nproc, extra=[*row.extra, *args], script=script)


def image_files(rows: list[Row], settings: Settings, scratch: Path) -> Path | None:
    """The image folder the rows with files=True read (PNG files, decoded and resized to
    --image-size by DataLoader workers, as a real data set is), or None if none does."""
    needed = max((images_needed(r, settings) for r in rows if r.files), default=0)
    if not needed:
        return None
    from course.data import make_image_folder

    classes = 10
    print(f"  writing {needed:,} PNG images for the image-file rows ...", flush=True)
    size = min(settings.image_size, 112)  # stored smaller, resized up: decoding stays real
    return make_image_folder(
        scratch / "images", classes, -(-needed // classes), size, val_per_class=1
    )


def windows_of(points: list[tuple[int, float]], row: Row, global_batch: int) -> list[float]:
    """Images per second of each timed window, from the step clock's (step, time) points."""
    rates = []
    for (s0, t0), (s1, t1) in zip(points, points[1:], strict=False):
        if s0 >= row.warmup * row.window and t1 > t0:
            rates.append((s1 - s0) * global_batch / (t1 - t0))
    return rates


def measure(
    row: Row,
    impl: Path,
    settings: Settings,
    timeout: float = 300,
    fresh_threads: bool = False,
    files: str | Path | None = None,
) -> dict:
    """Launch `row`'s lesson, time its steps, and return the row's record.

    fresh_threads: drop OMP_NUM_THREADS / MKL_NUM_THREADS from the environment,
    as in a new shell, even when the caller (the grader, say) has set them.
    """
    args = command(row, impl, settings, files)
    global_batch = row.global_batch(settings)
    record = {"key": row.key, "lesson": row.lesson, "mode": row.label, "world_size": row.world}
    if row.model:
        record["model"] = row.model
    if row.unit != "img":
        record["unit"] = row.unit
    if row.shared_batch:
        record["shared_batch"] = True  # the ranks split the model: one batch for them all
    if row.theory_bubble is not None:
        record["theory_bubble"] = row.theory_bubble
    record.update(global_batch=global_batch, window_steps=row.window, warmup_windows=row.warmup)
    if row.single != "01":
        record["single"] = row.single
    if row.versus:
        record["versus"] = row.versus
    record["command"] = " ".join(
        [*(f"{k}={v}" for k, v in row.env.items()), *(shlex.quote(_short(a)) for a in args)]
    )
    with tempfile.TemporaryDirectory(prefix="course-bench-") as folder:
        env = {
            **row.env,
            step_clock.LOG_ENV: folder,
            step_clock.EVERY_ENV: str(row.window),
        }
        if fresh_threads:
            env.update(OMP_NUM_THREADS=None, MKL_NUM_THREADS=None)
        if row.profile and row.warmup >= 2:  # the last warm-up window, dropped anyway
            first = (row.warmup - 1) * row.window
            env[step_clock.PROFILE_ENV] = f"{first}:{first + row.window}"
        result = launch.run(args, timeout=timeout, env=env, cwd=folder, one_thread=False)
        points = step_clock.read(folder, rank=0)
        window = step_clock.profiled(folder, rank=0)
    rates = windows_of(points, row, global_batch)
    record["seconds"] = round(result.seconds, 1)
    if not result.ok or len(rates) < row.windows:
        why = (
            result.describe(lines=6)
            if not result.ok
            else f"{len(rates)} of {row.windows} windows timed"
        )
        record.update(ok=False, error=why)
        return record
    median = statistics.median(rates)
    record.update(
        ok=True,
        samples_per_s=round(median, 1),
        step_ms=round(1000 * global_batch / median, 2),
        window_samples_per_s=[round(r, 1) for r in rates],
    )
    if window is not None:  # profiled: the step's share during which a collective ran
        comm, wall = window  # both from the profiled window: a share of its own steps
        record.update(
            comm_ms=round(1000 * comm, 2),
            profiled_step_ms=round(1000 * wall, 2),
            comm_share=round(comm / wall, 3),
        )
    return record


def _short(arg: str) -> str:
    """Paths relative to the repository, the interpreter as `python`: a readable command."""
    if arg == sys.executable:
        return "python"
    try:
        return str(Path(arg).resolve().relative_to(REPO_ROOT))
    except (ValueError, OSError):
        return arg


def add_ratios(rows: list[dict]) -> None:
    """Speed-up and efficiency of every row against one device (lesson 01 at the row's
    precision: its "single" key), in place; lesson 06's rows also get their step time over
    torch DDP's in the same loop, rows with a "versus" key their throughput over it, and
    lesson 11's pipelines their measured bubble, 1 - efficiency."""
    rate = {r["key"]: r["samples_per_s"] for r in rows if r["ok"]}
    ddp = next((r["step_ms"] for r in rows if r["key"] == "06-torch" and r["ok"]), None)
    for r in rows:
        base = rate.get(r.get("single", "01"))
        if base and r["ok"]:
            r["speedup"] = round(r["samples_per_s"] / base, 3)
            r["efficiency"] = round(r["samples_per_s"] / (r["world_size"] * base), 3)
        if ddp and r["ok"] and r["lesson"] == "06":
            r["step_vs_ddp"] = round(r["step_ms"] / ddp, 3)
        if r["ok"] and rate.get(r.get("versus")):
            r["vs_base"] = round(r["samples_per_s"] / rate[r["versus"]], 3)
        if "efficiency" in r and r.get("theory_bubble") is not None:
            # A pipeline of p stages runs each sample through 1/p of the model: without a
            # bubble it trains p times one device's samples. What it lacks is the bubble.
            r["bubble"] = round(1 - r["efficiency"], 3)
