"""Grades lesson 08: performance (lessons/08_performance/train.py).

Two launches per backend, started together and shared by every test:

  acc     2 ranks x 4 micro-batches of 8 (--accumulate 4), 20 steps, the model
          without BatchNorm (--norm none): its statistics would be those of each
          micro-batch, so accumulation gives the large-batch gradient only for
          models without batch-dependent layers; --seed 3 and --lr 0.1 (not the
          defaults), 0.01 MB buckets and --no-bucket-view
  learn   2 ranks x batch 32, the default model (BatchNorm), 2 epochs, fp16
          autocast with GradScaler (--amp fp16) and --static-graph: it must learn;
          on gloo also --compile (which on the CPU captures no graph: the page)

This process computes the reference for `acc` itself (`reference`): one process,
the lesson's model, initial weights and SGD, a batch of 64 a step, made of the 32
images each rank's DistributedSampler gives it for that step. A mistake common to
every run of the submission (an extra factor in the loss, say) cannot cancel out.
Inside the ranks, course/probes/ddp_log.py counts DDP's all-reduces with a communication
hook: `rounds` is the number of backward passes that synchronised (their last bucket
was sent), so a loop that uses no_sync shows one round per optimizer step, and one
that doesn't shows one per micro-batch, whatever the bucket size.

Equivalence tolerance and learning threshold: ACCUMULATION and LEARNED below, measured on
the reference over seeds 0-11 and 0-5 by `python -m course tolerances 08`
(docs/results/tolerances/cpu.json). The runs differ from the reference by float32 sums in
another order only; a loss not divided by k, or gradients cleared between micro-batches, is
off by far more (the mutants). LEARNED is lesson 03's threshold. A loop that steps
the optimizer itself, past GradScaler, or never calls scaler.update(), does not finish:
GradScaler raises at its next update() or step().
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from course import checkpoint, registry
from course.grader import judge
from course.grader.case_runs import run_lesson_cases
from course.grader.launches import needed
from course.grader.tolerances import seed, tolerance
from course.probes import ddp_log, weight_log, write_log
from course.probes.ddp_log import LOG_ENV as DDP_ENV
from course.probes.weight_log import LOG_ENV as REPLICA_ENV
from course.probes.write_log import WRITE_LOG_ENV

LESSON = registry.get("08")
STEPS, MICRO, K, WORLD = 20, 8, 4, 2  # `acc`: 20 steps of 4 x 8 images per rank
# `acc` runs with a --seed and an --lr that are not the defaults (0 and 0.05,
# course/options.py), so a script that ignores either ends far from the reference.
ACC_SEED, ACC_LR = seed(3), 0.1
ACCUMULATION = tolerance(
    "08.accumulation", high=1e-4,
    test="test_accumulated_micro_batches_give_the_large_batch_step "
    "test_train_one_epoch_accumulates_into_the_large_batch_step",
    what="largest weight difference of 2 ranks accumulating 4 micro-batches of 8 from one "
    "step a batch of 64 (20 steps of the script; 2 of train_one_epoch, and one on the 2 "
    "micro-batches left)",
)  # fmt: skip
LEARNED = tolerance(
    "08.learned", low=0.8, seeds=tuple(range(6)), test="test_fp16_run_learns_the_digits",
    what="test accuracy the grader evaluates after 2 epochs of 2 ranks x 32 with --amp fp16",
)  # fmt: skip
LEARN_BATCH = 32
SMALL_BUCKET_MB = 0.01

_runs: dict = {}


def launch(impl, folder, *args, backend):
    command = [sys.executable, str(LESSON.path(impl)), "--nproc", WORLD, "--backend", backend]
    command += ["--quiet", "--checkpoint", "ckpt.pt", *args]
    for sub in ("ddp", "replicas"):
        (folder / sub).mkdir()
    return dict(
        args=[str(a) for a in command],
        timeout=120,
        cwd=folder,
        log_dir=folder / "ranks",
        env={
            DDP_ENV: str(folder / "ddp"),
            REPLICA_ENV: str(folder / "replicas"),
            WRITE_LOG_ENV: str(folder / "ddp" / "writes.log"),  # how ckpt.pt is put in place
        },  # fmt: skip
    )


@pytest.fixture
def runs(impl, backend, tmp_path_factory, request, launcher):
    """{name: (RunResult, folder)} for acc and learn (those the selected tests need),
    launched once per backend."""
    if backend not in _runs:
        plans = {
            "acc": ["--norm", "none", "--batch-size", MICRO, "--accumulate", K, "--seed", ACC_SEED],
            "learn": ["--batch-size", LEARN_BATCH, "--epochs", 2, "--amp", "fp16"],
        }
        plans["learn"] += ["--seed", seed(0)]
        plans["acc"] += ["--max-steps", STEPS, "--lr", ACC_LR]
        plans["acc"] += ["--bucket-cap-mb", SMALL_BUCKET_MB, "--no-bucket-view"]
        if backend == "gloo":  # on the CPU it compiles nothing and costs ~1 s (the page)
            plans["learn"] += ["--compile"]
        plans["learn"] += ["--static-graph", "--metrics-out", "metrics.json"]
        jobs, folders = {}, {}
        for name in needed(request, tuple(plans)):
            extra = plans[name]
            folders[name] = tmp_path_factory.mktemp(f"{name}-{backend}")
            jobs[name] = launch(impl, folders[name], *extra, backend=backend)
        results = launcher.run_all(jobs)
        _runs[backend] = {name: (results[name], folders[name]) for name in jobs}
    return _runs[backend]


def reference() -> dict:
    """The weights `acc` must end with, trained here, in one process, from the course's
    own code (course.grader.judge.reference_weights): STEPS steps of one batch of WORLD x K x MICRO
    images, at step s each rank's images s*K*MICRO to (s+1)*K*MICRO of its
    DistributedSampler(ACC_SEED) order."""
    return judge.reference_weights(ACC_SEED, ACC_LR, WORLD, K * MICRO, steps=STEPS)


def finished(runs, name):
    result, folder = runs[name]
    if not result.ok:
        pytest.fail(result.failure(), pytrace=False)
    return folder


def weights(folder):
    path = folder / "ckpt.pt"
    if not path.is_file():
        pytest.fail(f"the run finished without writing --checkpoint {path.name}", pytrace=False)
    return checkpoint.load(path)["model"]


def ddp_lines(folder, rank=0):
    lines = ddp_log.read(folder / "ddp", rank)
    if not lines:
        pytest.fail(
            "no optimizer step was seen inside rank 0 (course/probes/ddp_log.py). Likely cause: "
            "the loop never calls the optimizer's step(), or the model is not wrapped in DDP",
            pytrace=False,
        )
    return lines


def learned(runs):
    """Test accuracy of `learn`'s checkpoint, evaluated by the grader (course/grader/judge.py)."""
    folder = finished(runs, "learn")
    try:
        accuracy = judge.digits_accuracy(folder / "ckpt.pt")
    except (FileNotFoundError, ValueError) as err:
        pytest.fail(f"the grader could not evaluate `learn`'s checkpoint: {err}", pytrace=False)
    LEARNED.note(accuracy)
    if accuracy < LEARNED.low:
        pytest.fail(
            f"after 2 epochs of 2 ranks x batch {LEARN_BATCH} with --amp fp16 the saved model "
            f"classifies {accuracy:.1%} of the test digits (the grader's evaluation of "
            f"ckpt.pt; expected at least {LEARNED.low:.0%}). The run finished: check its fp16 path "
            "(the loss scaled before backward, scaler.step(optimizer), scaler.update())",
            pytrace=False,
        )
    return accuracy


@pytest.mark.core
@pytest.mark.points(3)
@pytest.mark.needs("acc")
def test_accumulated_micro_batches_give_the_large_batch_step(runs, backend):
    """4 micro-batches of 8 per rank and step end with the weights of one batch of 64 a
    step, trained here by the grader."""
    acc, ref = weights(finished(runs, "acc")), reference()
    missing = sorted(set(ref) - set(acc))
    assert not missing, f"`acc`'s checkpoint lacks {missing[:3]}: is it the lesson's model?"
    worst = max((acc[k].double() - ref[k].double()).abs().max().item() for k in ref)
    print(
        f"largest parameter difference from the grader's batch of {WORLD * K * MICRO}: {worst:.2e}"
    )
    ACCUMULATION.note(worst, backend)
    assert worst <= ACCUMULATION.high, (
        f"after {STEPS} steps, {WORLD} ranks accumulating {K} micro-batches of {MICRO} end "
        f"{worst:.2e} from the grader's one batch of {WORLD * K * MICRO} a step (allowed "
        f"{ACCUMULATION.high:g}). Likely causes: each micro-batch's loss is not divided by "
        f"{K} (the gradient is {K}x too large), the gradients are cleared between "
        "micro-batches, or the optimizer steps after every micro-batch"
    )


@pytest.mark.core
@pytest.mark.points(3)
@pytest.mark.needs("acc")
def test_one_all_reduce_round_per_optimizer_step(runs, backend):
    """With --accumulate k, DDP synchronises once per optimizer step, not k times."""
    lines = ddp_lines(finished(runs, "acc"))
    rounds = ddp_log.per_step(lines)
    wrong = sorted({r for r in rounds if r != 1})
    assert not wrong, (
        f"`acc` (--accumulate {K}): expected 1 synchronised backward per optimizer step, saw "
        f"{wrong[0]} in {sum(r == wrong[0] for r in rounds)} of {len(rounds)} steps. "
        + (
            "Likely cause: the last micro-batch of a step runs inside no_sync() too, so "
            "the ranks never average their gradients"
            if wrong[0] == 0
            else f"Likely cause: the first {K - 1} micro-batches' forward and backward do "
            "not both run inside model.no_sync(): DDP decides in forward() whether the "
            "next backward all-reduces"
        )
    )
    assert len(lines) == STEPS, (
        f"`acc` took {len(lines)} optimizer steps, expected --max-steps {STEPS}"
    )


@pytest.mark.core
@pytest.mark.points(1)
@pytest.mark.needs("acc", "learn")
def test_replicas_stay_identical_while_accumulating(runs, backend):
    """Both ranks hold the same weights after every optimizer step, accumulating or not."""
    for name in ("acc", "learn"):
        differs = weight_log.first_difference(finished(runs, name) / "replicas")
        assert differs is None, (
            f"`{name}`: {differs}. Likely cause: the step's last micro-batch ran inside "
            "no_sync(), so each rank stepped with its own gradient"
        )


@pytest.mark.core
@pytest.mark.points(1)
@pytest.mark.needs("learn")
def test_fp16_run_learns_the_digits(runs, backend):
    """2 ranks x batch 32, 2 epochs of the default model in fp16 with GradScaler: 80 %;
    metrics.json reports the test split's numbers the grader measures on the saved
    weights, finally and after the last epoch; and each epoch's checkpoint replaced the
    last in one step, never written over it."""
    accuracy = learned(runs)
    folder = finished(runs, "learn")
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["final_accuracy"] == pytest.approx(accuracy, abs=1e-4), (
        f"metrics.json says final_accuracy {metrics['final_accuracy']:.4f}; the grader's "
        f"evaluation of the saved checkpoint gives {accuracy:.4f}"
    )
    misreported = judge.last_epoch_misreported(metrics, folder / "ckpt.pt")
    assert not misreported, misreported
    problem = write_log.not_replaced_atomically(
        folder / "ddp" / "writes.log", folder, "ckpt.pt", times=2
    )
    assert not problem, f"`--epochs 2 --checkpoint ckpt.pt`: {problem}"
    batch = WORLD * LEARN_BATCH
    assert metrics["global_batch_size"] == batch, (
        f"the global batch is ranks x micro-batches x batch = {batch}; metrics.json says "
        f"{metrics['global_batch_size']}"
    )


def built_with(runs, name: str, flags: str, cap: float, view: bool, static: bool) -> dict:
    """The last ddp_log line of `name`, after checking the options DDP was built with."""
    line = ddp_lines(finished(runs, name))[-1]
    got = (line["bucket_cap_mb"], line["gradient_as_bucket_view"], line["static_graph"])
    same = abs(got[0] - cap) <= 1e-3 * cap and got[1:] == (view, static)
    assert same, (
        f"with {flags} DDP was built with bucket_cap_mb={got[0]:g}, "
        f"gradient_as_bucket_view={got[1]}, static_graph={got[2]}; expected "
        f"{cap:g}, {view}, {static}. Likely cause: an option is not passed to "
        "DistributedDataParallel(...)"
    )
    return line


@pytest.mark.points(1)
@pytest.mark.needs("acc")
def test_bucket_options_from_the_command_line_reach_ddp(runs, backend):
    """--bucket-cap-mb 0.01 and --no-bucket-view change the DDP that trains `acc`."""
    flags = f"--bucket-cap-mb {SMALL_BUCKET_MB} --no-bucket-view"
    built_with(runs, "acc", flags, SMALL_BUCKET_MB, False, False)
    lines = ddp_lines(finished(runs, "acc"))
    sent = ddp_log.per_step(lines, "allreduces")[-1] / max(ddp_log.per_step(lines)[-1], 1)
    assert sent > 1, (
        f"{SMALL_BUCKET_MB} MB buckets should split the gradients into several all-reduces; "
        f"saw {sent:g} per synchronised backward"
    )


@pytest.mark.points(1)
@pytest.mark.needs("learn")
def test_static_graph_from_the_command_line_reaches_ddp(runs, backend):
    """--static-graph changes the DDP that trains `learn`; its other options stay DDP's
    defaults (25 MB buckets, gradients in the buckets, as in lesson 03)."""
    built_with(runs, "learn", "--static-graph", 25.0, True, True)


COMPILED = "torch.compile: "  # course.metrics.compile_summary, after the final line: what
# dynamo made of the model, printed only where it traced something


def rank0(runs, name: str) -> str:
    """What rank 0 of `name` printed (each rank's output goes to its own log)."""
    finished(runs, name)
    return runs[name][0].rank_logs.get("rank0", "")


@pytest.mark.points(1)
@pytest.mark.needs("acc", "learn")
def test_compile_flag_compiles_the_wrapped_model(runs, backend):
    """--compile (in `learn`, on gloo) hands the model to torch.compile (the page compiles
    the DDP-wrapped one; compiling the module DDP wraps counts too), and rank 0 prints what
    dynamo made of it; the run without it (`acc`) traces nothing, and prints no such line."""
    if backend != "gloo":
        pytest.skip("--compile is graded on gloo; a GPU compile would take most of the run")
    said = [ln for ln in rank0(runs, "learn").splitlines() if "torch.compile" in ln]
    assert len(said) == 1 and said[0].startswith(COMPILED), (
        f"with --compile rank 0 should print one line starting {COMPILED!r} "
        f"(course.metrics.compile_summary: dynamo traced the model); saw {said or 'none'}. "
        "Likely cause: --compile is parsed but torch.compile is never applied to the model"
    )
    unasked = [ln for ln in rank0(runs, "acc").splitlines() if "torch.compile" in ln]
    assert not unasked, (
        f"the run without --compile printed {unasked}: dynamo traced its model anyway. "
        "Likely cause: torch.compile is called whatever args.compile says"
    )


@pytest.mark.points(1)
def test_compile_with_small_buckets_is_refused_in_one_line(impl, tmp_path, launcher):
    """`--compile --bucket-cap-mb 0.5` is refused in one line: torch.compile's DDPOptimizer
    (torch 2.8 and 2.14.1) asserts that DDP's first bucket, 1 MiB, is no larger than the
    others, and every rank would die of that assertion in its first step."""
    args = ("--compile", "--bucket-cap-mb", "0.5", "--max-steps", "1")
    result = launcher.python(LESSON.path(impl), *args, timeout=60, cwd=tmp_path)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "--bucket-cap-mb" in lines[0], (
        "expected argparse's one-line error (exit code 2) naming --bucket-cap-mb\n"
        + result.describe()
    )


# --- train_one_epoch alone, in two forked ranks (tests/lessons/cases/lesson_08.py) ---------------

CASES = Path(__file__).with_name("cases") / "lesson_08.py"
CASE_STEPS, CASE_K, CASE_MICRO, CASE_LR = 2, 4, 8, 0.1  # as in the case script
CASE_EXTRA = 2  # micro-batches after the last full group: the epoch ends mid-group
_cases: dict = {}


@pytest.fixture
def accumulate_cases(impl, tmp_path_factory):
    if str(impl) not in _cases:
        folder = tmp_path_factory.mktemp("cases")
        _cases[str(impl)] = run_lesson_cases(impl, LESSON, CASES, folder, only=["accumulate"])
    return _cases[str(impl)]


def case_reference(short_group_mean: bool) -> dict:
    """One process, the case's model and data: each step one batch of both ranks' 4
    micro-batches together (64 images), one SGD step on its mean loss; then one step on
    the 2 micro-batches left of each rank (32 images), on their mean loss
    (short_group_mean) or on that mean times 2/4 (each micro-batch's loss divided by
    accumulate, as in a full group): both are honest ends of an epoch."""
    import torch
    import torch.nn.functional as F

    from course import models

    batches = []
    for rank in range(2):
        gen = torch.Generator().manual_seed(100 + rank)
        batches.append([
            (torch.randn(CASE_MICRO, 1, 8, 8, generator=gen),
             torch.randint(0, 10, (CASE_MICRO,), generator=gen))
            for _ in range(CASE_STEPS * CASE_K + CASE_EXTRA)
        ])  # fmt: skip
    torch.manual_seed(seed(0))  # tests/lessons/cases/lesson_08.py's MODEL_SEED
    model = models.SmallCNN(norm="none")
    optimizer = torch.optim.SGD(model.parameters(), lr=CASE_LR)
    for step in range(CASE_STEPS + 1):
        part = slice(step * CASE_K, (step + 1) * CASE_K)
        images = torch.cat([x for rank in batches for x, _ in rank[part]])
        labels = torch.cat([y for rank in batches for _, y in rank[part]])
        scale = 1.0 if step < CASE_STEPS or short_group_mean else CASE_EXTRA / CASE_K
        optimizer.zero_grad()
        (F.cross_entropy(model(images), labels) * scale).backward()
        optimizer.step()
    return model.state_dict()


@pytest.mark.core
@pytest.mark.points(1)
def test_train_one_epoch_accumulates_into_the_large_batch_step(accumulate_cases):
    """train_one_epoch with accumulate=4, on 2 ranks of 10 micro-batches of 8, ends with the
    weights of one step a batch of 64 (computed here) for each group of 4, and one step on
    the 2 micro-batches left at the epoch's end (their mean loss, or that times 2/4), on
    both ranks."""
    got = accumulate_cases.tensors("accumulate")
    wants = {mean: case_reference(mean) for mean in (True, False)}
    for rank in range(2):
        mine = {k.split("/", 1)[1]: v for k, v in got.items() if k.startswith(f"{rank}/")}
        worst = min(
            max((mine[k].double() - want[k].double()).abs().max().item() for k in want)
            for want in wants.values()
        )
        ACCUMULATION.note(worst)
        assert worst <= ACCUMULATION.high, (
            f"rank {rank} ends {worst:.2e} from {CASE_STEPS} steps of a batch of 64 and one "
            f"of the 32 images left (allowed {ACCUMULATION.high:g}). "
            "Likely causes: each micro-batch's loss is not divided by accumulate, the "
            "gradients are cleared between micro-batches, the optimizer steps after every "
            f"one, or the {CASE_EXTRA} micro-batches after the last group of {CASE_K} never "
            "step"
        )
    counts = accumulate_cases("accumulate")["ranks"]
    want_steps = CASE_STEPS + 1
    assert [c["steps"] for c in counts] == [want_steps] * 2, (
        f"steps returned by rank: {[c['steps'] for c in counts]}; expected {want_steps}: "
        f"{CASE_STEPS} groups of {CASE_K} and the {CASE_EXTRA} micro-batches left"
    )


@pytest.mark.core
@pytest.mark.points(1)
def test_train_one_epoch_all_reduces_once_per_step(accumulate_cases):
    """Over 2 steps of 4 micro-batches and one of the 2 left, DDP sends its one bucket 3
    times per rank (counted by a communication hook): once per optimizer step, never per
    micro-batch."""
    sent = [c["all_reduces"] for c in accumulate_cases("accumulate")["ranks"]]
    assert sent == [CASE_STEPS + 1] * 2, (
        f"DDP all-reduced {sent} times on ranks 0 and 1 over {CASE_STEPS} steps of {CASE_K} "
        f"micro-batches and one of {CASE_EXTRA}; expected {CASE_STEPS + 1}. "
        + ("Likely cause: the last micro-batch runs inside no_sync() too"
           if min(sent) == 0 else
           "Likely cause: forward and backward of the first micro-batches do not both run "
           "inside model.no_sync()")
    )  # fmt: skip
