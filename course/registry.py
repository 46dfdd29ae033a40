"""The lesson registry: one entry per lesson folder, in course order.

The CLI, the grader's table and the site read titles and launch styles from
here, so a lesson is declared once. It also owns the facts about a lesson that more than
one part of the course needs:

    tests(lesson)            which test files grade it
    command(lesson, impl, ...)  the command that starts its script (course run, course bench,
                             the recordings, the site's "Run it", lesson 04's tests)
    impl_folder(impl)        what --impl names, resolved once, where it is parsed

Over 300 lines, on purpose: the table of every lesson, one entry each, in course order.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from course import REPO_ROOT

# How a lesson's script is started:
#   python    - a plain script, one process
#   spawn     - one script that starts its own ranks with mp.spawn (--nproc, --backend)
#   torchrun  - started by torchrun, which starts the ranks (--nproc_per_node)
LAUNCHERS = ("python", "spawn", "torchrun")


@dataclass(frozen=True)
class Lesson:
    number: str
    slug: str
    title: str
    level: str
    script: str
    launcher: str
    summary: str
    # The lesson whose script this one extends: its page shows the diff against it.
    builds_on: str | None = None
    # A lesson of several small scripts (09): all of them, `script` first.
    exercises: tuple[str, ...] = ()
    # Exercises started another way than `script` ({"ring.py": "spawn"} in lesson 12).
    launchers: tuple[tuple[str, str], ...] = ()

    @property
    def distributed(self) -> bool:
        return self.launcher != "python"

    def launcher_of(self, script: str) -> str:
        """How exercise `script` (a file name) is started."""
        return dict(self.launchers).get(script, self.launcher)

    def path(self, impl_dir: Path) -> Path:
        return Path(impl_dir) / self.slug / self.script

    def exercise(self, name: str) -> str | None:
        """The script of exercise `name` ("hang" or "hang.py"), or None."""
        wanted = name.removesuffix(".py") + ".py"
        return wanted if wanted in self.exercises else None


LESSONS: tuple[Lesson, ...] = (
    Lesson(
        number="00",
        slug="00_environment",
        title="Environment check",
        level="foundations",
        script="env_check.py",
        launcher="python",
        summary="How many GPUs does this machine see, and which backend should each rank use?",
    ),
    Lesson(
        number="01",
        slug="01_single_device",
        title="One device: the baseline",
        level="foundations",
        script="train.py",
        launcher="python",
        summary="A training loop, evaluation and bit-exact resumable checkpoints on one device.",
    ),
    Lesson(
        number="02",
        slug="02_data_parallel",
        title="nn.DataParallel",
        level="foundations",
        script="train_dp.py",
        launcher="python",
        summary="One process drives every GPU: scatter, replicate, gather; why it stops scaling.",
        builds_on="01",
    ),
    Lesson(
        number="03",
        slug="03_ddp_spawn",
        title="DDP with mp.spawn",
        level="core",
        script="train.py",
        launcher="spawn",
        summary="One process per device: DistributedSampler, gradient all-reduce, rank 0 saves.",
        builds_on="01",
    ),
    Lesson(
        number="04",
        slug="04_torchrun",
        title="torchrun, fault tolerance",
        level="core",
        script="train.py",
        launcher="torchrun",
        summary="torchrun starts the ranks; snapshots let a killed job restart where it stopped.",
        builds_on="03",
    ),
    Lesson(
        number="05",
        slug="05_collectives",
        title="Collectives and the ring",
        level="core",
        script="collectives.py",
        launcher="spawn",
        summary="What broadcast, all_reduce, all_gather, reduce_scatter do; an all-reduce by hand.",
    ),
    Lesson(
        number="06",
        slug="06_ddp_from_scratch",
        title="DDP from scratch",
        level="core",
        script="mini_ddp.py",
        launcher="spawn",
        summary="MiniDDP: one broadcast, then hooks that all-reduce buckets during backward.",
    ),
    Lesson(
        number="07",
        slug="07_multinode",
        title="More than one machine",
        level="advanced",
        script="launch.py",
        launcher="python",
        summary="One launcher per node, a c10d rendezvous at node 0, and a fast, clear failure.",
    ),
    Lesson(
        number="08",
        slug="08_performance",
        title="Performance",
        level="advanced",
        script="train.py",
        launcher="spawn",
        summary="no_sync accumulation, mixed precision, DDP's options and data loading, measured.",
        builds_on="03",
    ),
    Lesson(
        number="09",
        slug="09_debugging",
        title="Debugging",
        level="advanced",
        script="oom.py",
        launcher="python",
        summary="Broken scripts to diagnose and fix: out of memory, unused parameters, a hang, "
        "a job that cannot start, a starved input pipeline, "
        "silent wrong results.",
        exercises=("oom.py", "unused.py", "hang.py", "rendezvous.py", "starved.py", "silent.py"),
    ),
    Lesson(
        number="10",
        slug="10_sharding",
        title="Sharding: ZeRO and FSDP by hand",
        level="advanced",
        script="zero.py",
        launcher="spawn",
        summary="ShardedOptimizer (ZeRO stage 1) keeps 1/N of Adam's state on each rank; "
        "MiniFSDP (ZeRO stage 3) keeps 1/N of every weight, gathered layer by layer; "
        "then PyTorch's FSDP2, and checkpoints that resume on any number of ranks.",
        exercises=("zero.py", "fsdp.py", "fsdp2.py"),
    ),
    Lesson(
        number="11",
        slug="11_model_parallel",
        title="Model parallelism: pipelines and tensors",
        level="advanced",
        script="pipeline.py",
        launcher="spawn",
        summary="The model cut into stages, one per rank, scheduled as GPipe and 1F1B, the "
        "bubble measured against theory; each MLP split across ranks, Megatron-style; by "
        "hand, then with torch.distributed.pipelining and DTensor.",
        exercises=("pipeline.py", "tensor.py"),
    ),
    Lesson(
        number="12",
        slug="12_long_sequences",
        title="Long sequences: checkpointing and ring attention",
        level="advanced",
        script="checkpoint.py",
        launcher="python",
        summary="Activations grow with the sequence: keep fewer of them and compute them "
        "again in backward (activation checkpointing, by hand, full and selective); then "
        "split the sequence across ranks, keys and values passed around a ring (context "
        "parallelism, by hand, zig-zag balanced).",
        exercises=("checkpoint.py", "ring.py"),
        launchers=(("ring.py", "spawn"),),
    ),
    Lesson(
        number="13",
        slug="13_experts",
        title="Mixture of experts: routing and expert parallelism",
        level="advanced",
        script="moe.py",
        launcher="python",
        summary="A router sends each token to 2 of 8 experts, as many as each has room for, "
        "and a balancing loss keeps them evenly loaded; then the experts split over the "
        "ranks, tokens sent to them and back by all-to-all with uneven splits, by hand.",
        exercises=("moe.py", "experts.py"),
        launchers=(("experts.py", "spawn"),),
    ),
    Lesson(
        number="14",
        slug="14_composing",
        title="Composing the axes: pipeline, FSDP and tensor parallel on one mesh",
        level="advanced",
        script="compose.py",
        launcher="spawn",
        summary="Eight ranks as a (pp 2, dp 2, tp 2) device mesh: each block split by "
        "DTensor, then sharded by FSDP2, the model cut into two pipeline stages; checked "
        "against a 1-D FSDP control, and a checkpoint of one shape resumed on another.",
    ),
    Lesson(
        number="15",
        slug="15_planning",
        title="Planning a run: memory, communication and time at scale",
        level="advanced",
        script="plan.py",
        launcher="python",
        summary="A cost model of lesson 14's composition for one rank of any mesh: bytes "
        "held, bytes moved on each axis, and the step's time by the α-β model; checked "
        "against the program itself at 64 to 1024 simulated ranks, then against this "
        "machine's clock.",
    ),
)


class UnknownLesson(LookupError):
    pass


def get(number: str | int) -> Lesson:
    key = f"{int(number):02d}" if str(number).isdigit() else str(number)
    for lesson in LESSONS:
        if key in (lesson.number, lesson.slug):
            return lesson
    known = ", ".join(lesson.number for lesson in LESSONS)
    raise UnknownLesson(f"no lesson {number!r}; the lessons are {known} (python -m course list)")


def tests(lesson: Lesson | str | None = None, root: str | Path = REPO_ROOT) -> list[Path]:
    """The test files that grade `lesson` (a Lesson or its number), or every lesson's (None),
    under `root`'s tests/lessons/: the one answer to "which tests grade lesson NN"."""
    if lesson is None:
        pattern = "[0-9][0-9]"
    elif isinstance(lesson, str):  # a number: a lesson of `root`, registered here or not
        pattern = lesson if lesson.isdigit() and len(lesson) == 2 else get(lesson).number
    else:
        pattern = lesson.number
    return sorted((Path(root) / "tests" / "lessons").glob(f"test_{pattern}_*.py"))


def impl_folder(impl: str | Path) -> Path:
    """--impl (lessons, solutions or a folder shaped like lessons/) as a folder: the type of
    every --impl option (the CLI's verbs, the grader's pytest option), so that it is
    resolved once, where it is parsed."""
    if str(impl) in ("lessons", "solutions"):
        return REPO_ROOT / str(impl)
    path = Path(impl).expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"--impl {impl}: no such folder")
    return path


def impl_name(folder: Path) -> str:
    """How a record names an --impl folder: lessons or solutions, else the folder's path."""
    inside = Path(folder).parent == REPO_ROOT and Path(folder).name in ("lessons", "solutions")
    return Path(folder).name if inside else str(folder)


def impl_argument(impl: str) -> Path:
    """impl_folder for argparse's `type=`: a missing folder is a one-line usage error."""
    try:
        return impl_folder(impl)
    except FileNotFoundError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix(f"--impl {impl}: ")) from None


def torchrun(script: str | Path, *options: str) -> list[str]:
    """torchrun with `options` (its own, before the script) on `script`."""
    return [sys.executable, "-m", "torch.distributed.run", *options, str(script)]


def command(
    lesson: Lesson,
    impl: str | Path,
    nproc: int | None = None,
    backend: str | None = None,
    extra=(),
    max_restarts: int | None = None,
    rendezvous=None,
    script: str | Path | None = None,
) -> list[str]:
    """The command that launches `lesson` from the folder `impl`, as its page shows: the one
    owner of it (python -m course run, course bench, the recordings and the site ask here).
    A lesson of several exercises takes the exercise's name first in `extra` (course run 09
    hang ...), or `script`, a path. For torchrun lessons, `rendezvous` replaces
    --standalone with torchrun's multi-node options (--nnodes, --rdzv_backend, ...)."""
    script = Path(script) if script is not None else lesson.path(impl)
    if lesson.exercises and extra and lesson.exercise(extra[0]):
        script, extra = script.with_name(lesson.exercise(extra[0])), list(extra[1:])
    if not script.is_file():
        raise FileNotFoundError(f"{script}: not found")
    launcher = lesson.launcher_of(script.name)
    if launcher == "python" and (nproc or backend):
        raise ValueError(
            f"{lesson.number}/{script.name} runs one process; --nproc/--backend don't apply"
        )
    if nproc is not None and nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {nproc}")
    if max_restarts is not None and (launcher != "torchrun" or max_restarts < 0):
        raise ValueError("--max-restarts takes a number >= 0, for torchrun lessons only")
    options = [*(["--backend", backend] if backend else [])]
    if launcher == "torchrun":
        agent = list(rendezvous) if rendezvous else ["--standalone"]
        if max_restarts is not None:
            agent.append(f"--max-restarts={max_restarts}")
        return [*torchrun(script, *agent, f"--nproc_per_node={nproc or 1}"), *options, *extra]
    if launcher == "spawn" and nproc:
        options += ["--nproc", str(nproc)]
    return [sys.executable, str(script), *options, *extra]
