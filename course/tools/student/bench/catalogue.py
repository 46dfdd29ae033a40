"""The benchmark's catalogue: each lesson's rows, declared once (the table of
course/tools/student/bench/__init__.py says what each row runs)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class Row:
    """One way of training, and how long to time it."""

    key: str
    lesson: str
    label: str
    world: int  # GPUs (or CPU ranks) that share the work
    extra: list[str] = field(default_factory=list)
    window: int = 10  # steps per timed window
    warmup: int = 2  # windows dropped at the start
    windows: int = 5  # windows timed
    accumulate: int = 1  # micro-batches per optimizer step (lesson 08's --accumulate)
    speed: tuple[str, bool] | None = None  # (amp, channels_last) instead of the run's
    files: bool = False  # images decoded from files instead of tensors on the GPU
    env: dict[str, str] = field(default_factory=dict)  # extra environment variables
    single: str = "01"  # the one-device row its efficiency divides by ("": none)
    versus: str | None = None  # the row its "x" ratio divides by
    # A script with flags of its own (lesson 09's exercises), not the training flags the
    # other rows share: `extra` is its whole command line, and it brings its own model.
    script: str = ""  # one of the lesson's `scripts`
    starter: bool = False  # the handed-out script of lessons/, not --impl's
    batch: int = 0  # its per-rank batch (0: the run's --batch-size)
    model: str = ""  # what it trains, for the record
    # Model parallel (lesson 11): the ranks split one model and share one batch, `batch`.
    shared_batch: bool = False
    theory_bubble: float | None = None  # a pipeline's (p - 1) / (m + p - 1)
    unit: str = "img"  # what a sample is, for the table's throughput column
    # Profile the last warm-up window for the share of a step during which a collective
    # runs (course/probes/step_clock.py); needs 2 warm-up windows.
    profile: bool = False

    def global_batch(self, settings: Settings) -> int:
        """Samples a step trains, over every rank."""
        batch = self.batch or settings.batch_size
        return batch if self.shared_batch else batch * self.world * self.accumulate

    @property
    def steps(self) -> int:
        return (self.warmup + self.windows) * self.window


@dataclass
class Settings:
    device: str  # "cuda" or "cpu"
    gpus: int  # world size of the parallel rows
    model: str
    image_size: int
    batch_size: int  # per GPU (per rank)
    amp: str
    channels_last: bool

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"


def plan(
    settings: Settings, chosen: list[str], window: int, warmup: int, windows: int
) -> list[Row]:
    """The rows to measure, in table order."""
    n, rows = settings.gpus, []
    timing = dict(window=window, warmup=warmup, windows=windows)
    if "01" in chosen:
        rows.append(Row("01", "01", "one device", 1, ["--device", settings.device], **timing))
    if "02" in chosen and settings.device == "cuda" and n >= 2:
        dp = ["--device", "cuda", "--gpus", str(n)]
        rows.append(Row("02", "02", "DataParallel", n, dp, **timing))
        # With the autotuner, DataParallel re-tunes at every step (lesson 02): a
        # step takes seconds, so a few short windows say all there is to say.
        slow = dict(window=2, warmup=1, windows=3)
        rows.append(
            Row(
                "02-tuned",
                "02",
                "DataParallel, cuDNN autotuner on",
                n,
                [*dp, "--cudnn-benchmark"],
                **slow,
            )
        )
    if "03" in chosen:
        spawn = ["--nproc", str(n), "--backend", settings.backend]
        rows.append(Row("03", "03", "DDP, mp.spawn", n, spawn, **timing))
    if "04" in chosen:
        rows.append(Row("04", "04", "DDP, torchrun", n, ["--backend", settings.backend], **timing))
    if "06" in chosen:  # one training loop, three wrappers: only the gradient sync differs
        spawn = ["--nproc", str(n), "--backend", settings.backend]
        for key, label, extra in (
            ("06-torch", "torch DDP, 06's loop", ["--wrapper", "torch"]),
            ("06-mini", "MiniDDP, 25 MB buckets", ["--wrapper", "mini"]),
            (
                "06-mini-each",
                "MiniDDP, one per tensor",
                ["--wrapper", "mini", "--bucket-cap-mb", "0"],
            ),
        ):
            rows.append(Row(key, "06", label, n, [*spawn, *extra], **timing))
    if "08" in chosen:
        rows += lesson_08_rows(settings, timing)
    if "09" in chosen:
        rows += lesson_09_rows(settings, timing)
    if "11" in chosen:
        rows += lesson_11_rows(settings, timing)
    return rows


# Lesson 11's models on GPUs: wide enough that a stage's matmuls, and a tensor-parallel
# rank's slices, keep an H200 busy (fp32, about 0.1 s a step on one GPU); on the CPU the
# scripts' own defaults. dim, blocks, batch (rows of 16 tokens, the whole job's).
PIPELINE_GPU, PIPELINE_CPU = (2048, 8, 256), (64, 4, 32)
TENSOR_GPU, TENSOR_CPU = (8192, 2, 32), (64, 2, 32)  # tensor.py's batch is its fixed 32
MICRO_BATCHES = (1, 2, 4, 8)


def lesson_11_rows(settings: Settings, timing: dict) -> list[Row]:
    """Pipeline.py's whole model on one device (with 1 and with 8 micro-batches), then in
    stages over the GPUs with 1F1B and 1, 2, 4, 8 micro-batches, and PyTorch's 1F1B with 8:
    each stage's throughput over (stages x one device's) is 1 - the measured bubble. Then
    tensor.py's blocks whole on one device, and split over the GPUs by hand and with
    DTensor. One batch for the whole job: the ranks split the model, not the data."""
    n, steps = settings.gpus, (timing["warmup"] + timing["windows"]) * timing["window"]
    gpu = settings.device == "cuda"
    rows = []

    def add(key, script, label, world, extra, single="", **options):
        dim, depth, batch = {"pipeline.py": PIPELINE_GPU if gpu else PIPELINE_CPU,
                             "tensor.py": TENSOR_GPU if gpu else TENSOR_CPU}[script]  # fmt: skip
        sizes = ["--dim", str(dim), "--depth", str(depth)]
        if script == "pipeline.py":  # tensor.py trains its fixed batch
            sizes += ["--batch-size", str(batch)]
        extra = ["--nproc", str(world), *extra, "--backend", settings.backend, *sizes]
        model = f"{script}'s blocks, width {dim}, {depth} blocks"
        rows.append(Row(key, "11", label, world, [*extra, "--steps", str(steps)], script=script,
                        batch=batch, shared_batch=True, unit="seq", model=model,
                        single=single, **timing, **options))  # fmt: skip

    most = MICRO_BATCHES[-1]
    add("11-pipe1", "pipeline.py", "pipeline.py, whole on one device", 1, ["--micro-batches", "1"])
    # Smaller micro-batches cost something of their own (less work per kernel launch): the
    # pipeline's most micro-batches on one device, where there is no bubble.
    add("11-pipe1-m8", "pipeline.py", f"whole on one device, {most} micro-batches", 1,
        ["--schedule", "1f1b", "--micro-batches", str(most)], versus="11-pipe1")  # fmt: skip
    for schedule, m in [("1f1b", m) for m in MICRO_BATCHES] + [("torch-1f1b", most)]:
        if n < 2:
            break
        name = "1F1B" if schedule == "1f1b" else "torch's Schedule1F1B"
        label = f"{n} stages, {name}, {m} micro-batch{'es' if m > 1 else ''}"
        add(f"11-{schedule}-m{m}", "pipeline.py", label, n,
            ["--schedule", schedule, "--micro-batches", str(m)], single="11-pipe1",
            theory_bubble=round((n - 1) / (m + n - 1), 3))  # fmt: skip
    add("11-tp1", "tensor.py", "tensor.py, whole on one device", 1, ["--split", "none"])
    for split, label in (("hand", "split by hand"), ("dtensor", "split with DTensor")):
        if n >= 2:
            add(f"11-tp-{split}", "tensor.py", f"{n} ranks, {label}", n, ["--split", split],
                single="11-tp1", profile=True)  # fmt: skip
    return rows


# starved.py's data: lesson 01's digits (1,438 training images), read with 0.5 ms of
# storage latency each; its own batch of 32.
STARVED_BATCH, STARVED_TRAIN_IMAGES = 32, 1438


def lesson_09_rows(settings: Settings, timing: dict) -> list[Row]:
    """Exercise 5: the starved input pipeline as handed out, and fixed. One process: every
    rank has a loader of its own, so one shows what each waits for, whatever the GPUs."""
    steps = (timing["warmup"] + timing["windows"]) * timing["window"]
    epochs = -(-steps * STARVED_BATCH // STARVED_TRAIN_IMAGES)  # every timed step inside
    own = ["--device", settings.device, "--epochs", str(epochs)]
    own += ["--batch-size", str(STARVED_BATCH)]
    mine = dict(script="starved.py", batch=STARVED_BATCH, model="SmallCNN, 8x8 digits",
                single="", **timing)  # fmt: skip  # one process: no scaling to report
    rows = [Row("09-starved", "09", "starved.py as handed out", 1, own, starter=True, **mine)]
    # The fix with its default 4 workers; on a GPU, whose step is shorter than 4 workers'
    # reading of a batch (the page's sum), also with 8.
    for n in ("4", "8") if settings.device == "cuda" else ("4",):
        label, extra = f"starved.py fixed, {n} loader workers", [*own, "--workers", n]
        rows.append(Row(f"09-fed{n}", "09", label, 1, extra, versus="09-starved", **mine))
    return rows


def lesson_08_rows(settings: Settings, timing: dict) -> list[Row]:
    """Lesson 08's script as it stands, then one change at a time against it."""
    n, spawn = settings.gpus, ["--nproc", str(settings.gpus), "--backend", settings.backend]
    fp32 = ("off", False)
    # Decoding is slow: shorter windows; two dropped, for the workers' start (seconds each).
    files = dict(window=5, warmup=2, windows=4)
    variants = [  # key, label, extra flags, Row options
        ("08", "DDP as lesson 03 builds it", [], {}),
        ("08-copy", "gradients copied to buckets", ["--no-bucket-view"], {}),
        ("08-b5", "5 MB buckets", ["--bucket-cap-mb", "5"], {}),
        ("08-b100", "100 MB buckets", ["--bucket-cap-mb", "100"], {}),
        ("08-static", "static_graph", ["--static-graph"], {}),
        ("08-acc2", "no_sync, 2 micro-batches a step", ["--accumulate", "2"], {"accumulate": 2}),
    ]
    rows = []
    if (settings.amp, settings.channels_last) != fp32:  # precision: against fp32 on one device
        one = ["--device", settings.device]
        rows.append(Row("01-fp32", "01", "one device, fp32", 1, one, speed=fp32, **timing))
        variants.append(("08-fp32", "fp32, NCHW", [], {"speed": fp32, "single": "01-fp32"}))
    if settings.device == "cuda":  # the CPU version checks code paths, and has no spare cores
        nccl = {"env": {"NCCL_MAX_NCHANNELS": "4"}}  # fewer SMs busy with communication
        variants.append(("08-ch4", "NCCL_MAX_NCHANNELS=4", [], nccl))
        workers = str(max(1, min(6, (os.cpu_count() or 2) // (2 * n))))
        for key, label, extra in (
            ("08-files0", "image files, 0 workers", ["--num-workers", "0"]),
            ("08-files-pageable", f"image files, {workers} workers, not pinned",
             ["--num-workers", workers, "--no-pin-memory"]),
            ("08-files", f"image files, {workers} workers, pinned", ["--num-workers", workers]),
        ):  # fmt: skip
            variants.append((key, label, extra, {"files": True, **files}))
        variants.append(("08-compile", "torch.compile", ["--compile"], {}))
    for key, label, extra, options in variants:
        row_timing = {**timing, **{k: v for k, v in options.items() if k in timing}}
        other = {k: v for k, v in options.items() if k not in timing}
        rows.append(Row(key, "08", label, n, [*spawn, *extra], **row_timing, **other))
        rows[-1].versus = None if key == "08" else "08"
    return rows


def images_needed(row: Row, settings: Settings) -> int:
    """Training images for one epoch that holds every timed step."""
    return row.steps * settings.batch_size * row.world * row.accumulate
