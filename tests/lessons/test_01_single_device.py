"""Grades lesson 01: one device (lessons/01_single_device/train.py).

Two script runs are shared by several tests (module-scoped fixtures): the
default digits run and a run on a generated image folder. The lesson's
functions (and the resume, three calls of `main`, and the reference recipe the grader
trains too) run in one child process,
tests/lessons/cases/lesson_01.py, never in this one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from course import checkpoint, data, models, registry
from course.grader import judge
from course.grader.case_runs import run_lesson_cases
from course.grader.tolerances import seed, tolerance
from course.probes import batch_log, write_log
from course.probes.write_log import WRITE_LOG_ENV

LESSON = registry.get("01")
CASES = Path(__file__).with_name("cases") / "lesson_01.py"
CHECKPOINT_KEYS = {"model", "optimizer", "epoch", "step", "rng"}
# The reference_recipe case (tests/lessons/cases/lesson_01.py) against the grader's own training
# (course.grader.judge.reference_weights), the lesson on 2 threads with --channels-last
# kernels, the grader on one thread in the default layout: the bound is measured over
# seeds 0-11 by `python -m course tolerances 01` (docs/results/tolerances/cpu.json); what a
# flag ignored, or another known mistake, reaches is measured there too (`--mistakes`).
REF_SEED, REF_LR = seed(3), 0.1  # tests/lessons/cases/lesson_01.py's reference_recipe uses the same
REFERENCE = tolerance(
    "01.reference",
    high=1e-3,
    test="test_training_matches_the_graders_own_run",
    what="largest weight difference from the grader's own run of the recipe, after 12 steps",
)
DIGITS = tolerance(
    "01.learned", low=0.9, seeds=tuple(range(6)), test="test_default_run_learns_digits_on_cpu",
    what="test accuracy the grader evaluates after the default run, 3 epochs on the CPU",
)  # fmt: skip
FOLDER = tolerance(
    "01.folder", low=0.9, seeds=tuple(range(6)), test="test_learns_an_image_folder",
    what="val/ accuracy the grader evaluates after 3 epochs on a generated ImageFolder tree",
)  # fmt: skip
RUN_SEED = seed(0)  # the default runs' --seed (the default)


@pytest.fixture(scope="module")
def cases_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("cases01")


@pytest.fixture(scope="module")
def train(impl, cases_folder):
    """Every case of lesson 01, run once in one child process (in cases_folder)."""
    return run_lesson_cases(impl, LESSON, CASES, cases_folder)


def run_once(launcher, impl, folder, *args, timeout=90, env=None):
    """Run the lesson script in `folder`; fail every test that uses it if it fails."""
    return launcher.run(
        [sys.executable, str(LESSON.path(impl)), *map(str, args)],
        timeout=timeout, cwd=folder, env=env,
    )  # fmt: skip


def ok(result):
    if not result.ok:
        pytest.fail(result.describe(), pytrace=False)
    return result


@pytest.fixture(scope="module")
def digits_run(impl, tmp_path_factory, launcher):
    """The default run, on the CPU, with a metrics file and a checkpoint; how each file was
    put in place is logged from inside it (course/probes/write_log.py) to writes.log, kept
    out of the run's folder."""
    folder = tmp_path_factory.mktemp("digits")
    args = ["--device", "cpu", "--epochs", "3", "--quiet", "--metrics-out", "metrics.json"]
    log = {WRITE_LOG_ENV: str(folder.with_name(folder.name + ".writes.log"))}
    result = run_once(
        launcher, impl, folder, *args, "--checkpoint", "ckpt.pt", "--seed", RUN_SEED, env=log
    )
    return result, folder


def judged_accuracy(folder, name="ckpt.pt", norm="batch"):
    """Test accuracy of the run's checkpoint, evaluated by the grader (course/grader/judge.py):
    what a run reports about itself is never taken on trust."""
    try:
        return judge.digits_accuracy(folder / name, norm=norm)
    except (FileNotFoundError, ValueError) as err:
        message = f"the grader could not evaluate the run's checkpoint: {err}"
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="module")
def resume_runs(train, cases_folder):
    """2 epochs straight, and 1 epoch + a resumed 2nd (the `resume` case); both folders."""
    metrics = train("resume")
    return cases_folder / "straight", cases_folder / "split", metrics


@pytest.fixture(scope="module")
def folder_run(impl, tmp_path_factory, launcher):
    """A run on an ImageFolder tree of generated PNGs (train/ and val/)."""
    folder = tmp_path_factory.mktemp("images")
    data.make_image_folder(folder / "tree", classes=3, per_class=24, val_per_class=8, size=16)
    result = run_once(
        launcher, impl, folder, "--device", "cpu", "--data", "tree", "--epochs", "3",
        "--batch-size", "16",
        "--num-workers", "0", "--quiet", "--metrics-out", "metrics.json",
        "--checkpoint", "ckpt.pt", "--seed", RUN_SEED,
    )  # fmt: skip
    return result, folder


def metrics_of(run):
    result, folder = run
    ok(result)
    return json.loads((folder / "metrics.json").read_text())


# --- the script, end to end ----------------------------------------------------


@pytest.mark.core
@pytest.mark.points(3)
def test_default_run_learns_digits_on_cpu(digits_run):
    """The default run (3 epochs on the CPU) saves weights that classify at least 90 % of the
    test digits, as the grader evaluates them."""
    metrics = metrics_of(digits_run)
    accuracy = judged_accuracy(digits_run[1])
    losses = [e["train_loss"] for e in metrics["epochs"]]
    DIGITS.note(accuracy)
    assert accuracy >= DIGITS.low, (
        f"after 3 epochs the saved model classifies {accuracy:.1%} of the test digits "
        f"correctly (the grader's evaluation of ckpt.pt; expected at least {DIGITS.low:.0%}); "
        "train loss "
        f"per epoch {[round(x, 3) for x in losses]}. Likely cause: a broken training step"
    )
    assert losses[-1] < losses[0] * 0.5, f"the training loss barely moved: {losses}"
    assert metrics["device"] == "cpu"


@pytest.mark.core
@pytest.mark.points(2)
def test_metrics_json_shape(digits_run):
    """metrics.json has the run's keys and epochs, and reports the accuracy the grader measures
    on the saved weights, finally and after the last epoch, with the test loss the grader
    measures: each number from the split it names."""
    metrics = metrics_of(digits_run)
    assert {"device", "epochs", "final_accuracy", "steps", "images_per_second"} <= set(metrics)
    accuracy = judged_accuracy(digits_run[1])
    assert metrics["final_accuracy"] == pytest.approx(accuracy, abs=1e-4), (
        f"metrics.json says final_accuracy {metrics['final_accuracy']}, but the saved model "
        f"scores {accuracy:.4f} when the grader evaluates it: the file must report the run"
    )
    misreported = judge.last_epoch_misreported(metrics, digits_run[1] / "ckpt.pt")
    assert not misreported, misreported
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2, 3]
    for epoch in metrics["epochs"]:
        assert {"train_loss", "test_loss", "test_accuracy", "images_per_second"} <= set(epoch)
        assert 0.0 <= epoch["test_accuracy"] <= 1.0
    assert metrics["steps"] == 3 * 23  # 1438 training images in batches of 64
    assert metrics["images_per_second"] > 0


@pytest.mark.core
@pytest.mark.points(2)
def test_learns_an_image_folder(folder_run):
    """A run on an ImageFolder tree of generated images learns it: 90 % of its val/ images,
    judged by the grader."""
    metrics = metrics_of(folder_run)
    losses = [e["train_loss"] for e in metrics["epochs"]]
    assert losses[-1] < losses[0], f"the training loss did not decrease: {losses}"
    folder = folder_run[1]
    try:  # the grader's own evaluation of the saved weights, on the tree's val/ images
        accuracy = judge.folder_accuracy(folder / "ckpt.pt", folder / "tree")
    except (FileNotFoundError, ValueError) as err:
        pytest.fail(f"the grader could not evaluate the run's checkpoint: {err}", pytrace=False)
    FOLDER.note(accuracy)
    assert accuracy >= FOLDER.low, (
        f"the saved model classifies {accuracy:.1%} of the tree's val/ images when the grader "
        f"evaluates it; expected at least {FOLDER.low:.0%}"
    )
    assert metrics["final_accuracy"] == pytest.approx(accuracy, abs=1e-4), (
        f"metrics.json says final_accuracy {metrics['final_accuracy']:.4f}; the grader's "
        f"evaluation of the saved model gives {accuracy:.4f}"
    )


def load_checkpoint(path, what):
    try:
        return checkpoint.load(path)
    except FileNotFoundError:
        pytest.fail(
            f"{what}: expected a checkpoint at {path.name}, found none. Likely cause: main() "
            "does not save to --checkpoint after each epoch",
            pytrace=False,
        )


@pytest.mark.core
@pytest.mark.points(2)
def test_checkpoint_is_complete_and_written_atomically(resume_runs, digits_run):
    """The checkpoint holds model, optimizer, epoch, step and RNG state, loads into a fresh
    model, and leaves no temporary file; in the default run (3 epochs), each epoch's
    checkpoint replaces the last in one step (a finished file renamed onto it): the file is
    never opened for writing while it holds the previous epoch, nor removed."""
    straight, _, _ = resume_runs
    state = load_checkpoint(straight / "last.pt", "after `--epochs 2 --checkpoint last.pt`")
    files = sorted(p.name for p in straight.iterdir())
    assert files == ["last.pt"], f"temporary files left next to the checkpoint: {files}"
    ok(digits_run[0])
    folder = digits_run[1]
    log = folder.with_name(folder.name + ".writes.log")
    problem = write_log.not_replaced_atomically(log, folder, "ckpt.pt", times=3)
    assert not problem, f"`--epochs 3 --checkpoint ckpt.pt`: {problem}"
    missing = CHECKPOINT_KEYS - set(state)
    assert not missing, f"the checkpoint lacks {sorted(missing)}; checkpoint_state() makes it"
    assert (state["epoch"], state["step"]) == (2, 24), (
        f"after 2 epochs of 12 steps (1438 images, batch 128) the checkpoint should say epoch 2, "
        f"step 24; it says epoch {state['epoch']}, step {state['step']}. Likely cause: the epoch "
        "saved is the one in progress (epoch), not the number completed (epoch + 1)"
    )
    model = models.build_model("cnn", 10, 1)
    model.load_state_dict(state["model"])  # loads into a fresh model, strict
    assert state["optimizer"]["state"], "the optimizer state (momentum) is empty"


@pytest.mark.core
@pytest.mark.points(4)
def test_resume_is_bit_exact(resume_runs):
    """2 epochs straight == 1 epoch, stop, resume for 1 more: the same bits, on the CPU."""
    straight, split, metrics = resume_runs
    assert metrics["start_epoch"] == 1, (
        f"resuming from a 1-epoch checkpoint should start at epoch 1, started at "
        f"{metrics['start_epoch']!r}. Likely cause: restore() returns the wrong epoch"
    )
    a = load_checkpoint(straight / "last.pt", "2 epochs straight")
    b = load_checkpoint(split / "last.pt", "1 epoch, then resumed for a 2nd")
    assert (a["epoch"], a["step"]) == (b["epoch"], b["step"]) == (2, 24), (
        f"straight: epoch {a['epoch']} step {a['step']}; resumed: epoch {b['epoch']} "
        f"step {b['step']}; both should be epoch 2, step 24"
    )
    differ = [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]
    assert not differ, (
        f"resumed weights differ from the uninterrupted run's: {differ[:5]}. Likely cause: "
        "something the run depends on is not saved or not restored: the optimizer's momentum, "
        "or the random generators (rng_state() / set_rng_state())"
    )
    for key, buf in a["optimizer"]["state"].items():
        assert torch.equal(buf["momentum_buffer"], b["optimizer"]["state"][key]["momentum_buffer"])


@pytest.mark.points(2)
def test_training_matches_the_graders_own_run(train, cases_folder):
    """--epochs 2 --max-steps 12 (one epoch of batch 128) at --norm none --seed 3 --lr 0.1
    --channels-last, no flag at its default, keeps its conv weights channels-last and ends
    where the grader's own training of that recipe ends (course.grader.judge.reference_weights)."""
    train("reference_recipe")
    state = load_checkpoint(cases_folder / "ref" / "last.pt", "--epochs 2 --max-steps 12")
    assert state["step"] == 12, (
        f"--max-steps 12 should stop the run after 12 steps; its checkpoint says {state['step']}"
    )
    got = state["model"]
    dense = judge.not_channels_last(got)
    assert not dense, (
        f"with --channels-last the saved conv weights should be channels-last (NHWC), but "
        f"{dense[:3]} are not. Likely cause: the model is not moved with "
        "memory_format=args.memory_format"
    )
    want = judge.reference_weights(REF_SEED, REF_LR, 1, 128, epochs=1, norm="none")
    missing = [k for k in want if k not in got]
    assert not missing, f"the checkpoint lacks the model's {missing[:3]}"
    worst = max((got[k].float() - want[k]).abs().max().item() for k in want)
    print(f"largest difference from the grader's run: {worst:.2e}")
    REFERENCE.note(worst)
    assert worst <= REFERENCE.high, (
        f"after 12 steps at --norm none --seed {REF_SEED} --lr {REF_LR} the weights are "
        f"{worst:.2e} from the grader's own run of that recipe (allowed {REFERENCE.high:g}). "
        "Likely cause: --norm, --seed or --lr is not used, or the training step differs "
        "from lesson 01's (one SGD step per batch)"
    )


# --- the functions, in a child process --------------------------------------------


@pytest.mark.core
@pytest.mark.points(2)
def test_train_one_epoch_takes_optimizer_steps(train):
    """train_one_epoch returns (loss, images, steps) and lowers the loss on an easy problem."""
    got = train("train_one_epoch")
    losses = got["losses"]
    assert got["counts"][0] == [64, 4], (
        f"one epoch of 64 examples in batches of 16 should return (loss, 64, 4), returned "
        f"images, steps = {got['counts'][0]}"
    )
    assert losses[-1] < losses[0] * 0.7, (
        f"6 epochs on an easy problem should cut the loss by 30 %; epoch losses: "
        f"{[round(x, 4) for x in losses]}. Likely cause: no optimizer.step(), or gradients "
        "never cleared (optimizer.zero_grad())"
    )
    assert got["max_steps_2"] == [32, 2], (
        f"with max_steps=2 the epoch should stop after 2 steps (32 images), returned "
        f"images, steps = {got['max_steps_2']}"
    )


@pytest.mark.core
@pytest.mark.points(2)
def test_evaluate_counts_accuracy_and_loss(train):
    """evaluate returns the mean loss over examples and the accuracy, on a case with a known
    answer."""
    got = train("evaluate")
    x = torch.tensor([[-1.0], [-1.0], [1.0], [1.0]])
    y = torch.tensor([0, 1, 1, 1])
    logits = torch.zeros(4, 2)
    logits[:, 0] = (x[:, 0] < 0).float() * 2.0
    logits[:, 1] = (x[:, 0] > 0).float() * 2.0
    expected = nn.functional.cross_entropy(logits, y).item()
    assert got["accuracy"] == pytest.approx(0.75), (
        f"3 of 4 predictions are right, in batches of 3 and 1: the accuracy should be 0.75, "
        f"was {got['accuracy']}"
    )
    assert got["loss"] == pytest.approx(expected, rel=1e-5), (
        f"the mean loss over the 4 examples should be {expected:.4f}, was {got['loss']:.4f}. "
        "Likely cause: batch means averaged over batches of different sizes; sum the loss "
        "(reduction='sum') and divide by the number of examples"
    )
    assert got["train_mode_model_accuracy"] == pytest.approx(0.75), (
        "a model handed over in training mode was evaluated in training mode. Likely cause: "
        "model.eval() is missing (BatchNorm and dropout then behave as in training)"
    )


@pytest.mark.core
@pytest.mark.points(2)
def test_checkpoint_state_round_trip(train):
    """checkpoint_state and restore bring back the weights, the momentum, the epoch, the step
    and the random generators."""
    got = train("checkpoint_round_trip")
    tensors = train.tensors("checkpoint_round_trip")
    assert got["returned"] == [3, 42], (
        f"restore() should return (epoch, step) = (3, 42) as saved, returned {got['returned']}"
    )
    assert torch.equal(tensors["draw"], tensors["expected_draw"]), (
        "after restore() the random generators draw different numbers than after the save. "
        "Likely cause: the RNG state is not saved (rng_state()) or not restored (set_rng_state)"
    )
    saved = [k.removeprefix("saved/") for k in tensors if k.startswith("saved/")]
    wrong = [k for k in saved if not torch.equal(tensors[f"saved/{k}"], tensors[f"restored/{k}"])]
    assert not wrong, f"restore() did not load these weights: {wrong[:5]}"
    assert got["momentum_restored"], "the optimizer's momentum was not restored"


# --- errors a user makes ---------------------------------------------------------


@pytest.mark.points(1)
@pytest.mark.parametrize(
    "case", ["epochs-0", "batch-size-text", "negative-lr", "resume-without-checkpoint", "model"]
)
def test_bad_flags_give_one_line(train, case):
    """Bad flags (0 epochs, a word for the batch size, a negative lr, --resume alone, an unknown
    model) stop with argparse's one line."""
    got = train(f"bad_flags_{case}")
    assert got is not None, f"parse_args accepted the bad flag(s) of case {case}"
    err = got["stderr"].strip()
    assert got["exit"] == 2, f"expected argparse's exit code 2, got {got['exit']}"
    assert len(err.splitlines()) == 1 and "error" in err, (
        f"expected one line saying what is wrong, got:\n{err}"
    )


@pytest.mark.points(1)
def test_missing_data_folder_gives_one_line(impl, run_script, tmp_path):
    """`--data` naming a folder that does not exist prints one line, not a traceback."""
    result = run_script(LESSON.path(impl), "--data", tmp_path / "missing", check=False)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.returncode not in (0, None), result.describe()
    assert len(lines) == 1, f"expected one line, got:\n{result.output}"
    assert lines[0].startswith("train.py: error:") and "no such folder" in lines[0]


@pytest.mark.points(1)
def test_image_size_resizes_a_folders_images(impl, run_script, tmp_path):
    """`--data tree --image-size 12` on a tree of 16x16 PNGs trains on 12x12 images (the
    default would be 32x32). Seen inside the run: the first batch of each pass over the
    training set, recorded by course/probes/batch_log.py."""
    data.make_image_folder(tmp_path / "tree", classes=2, per_class=8, val_per_class=4, size=16)
    logs = tmp_path / "batches"
    logs.mkdir()
    args = ["--data", "tree", "--image-size", "12", "--epochs", "1", "--batch-size", "4"]
    args += ["--num-workers", "0", "--quiet"]
    run_script(LESSON.path(impl), *args, env={batch_log.LOG_ENV: str(logs)})
    seen = batch_log.shapes(logs, rank=0, length=16)
    assert seen and all(shape[-2:] == (12, 12) for shape in seen), (
        f"{' '.join(args)}: the training batches' inputs were {seen or 'not seen'}; expected "
        "[..., 12, 12]. Likely cause: --image-size is not passed to data.build_datasets"
    )


@pytest.mark.points(1)
def test_the_model_flag_trains_the_model_it_names(impl, run_script, tmp_path):
    """`--model resnet18 --batch-size 256 --epochs 1` saves a ResNet-18's weights (the
    course's variant for small images, built here by course.models), not the CNN's."""
    args = ["--model", "resnet18", "--batch-size", "256", "--epochs", "1", "--quiet"]
    run_script(LESSON.path(impl), *args, "--checkpoint", "r.pt", timeout=120)
    try:
        saved = checkpoint.load(tmp_path / "r.pt")["model"]
    except (OSError, KeyError, RuntimeError) as err:
        pytest.fail(f"{' '.join(args)}: the grader could not read r.pt's model: {err!r}",
                    pytrace=False)  # fmt: skip
    want = {
        k: tuple(v.shape) for k, v in models.build_model("resnet18", 10, 1).state_dict().items()
    }
    got = {k: tuple(v.shape) for k, v in saved.items()}
    assert got == want, (
        f"{' '.join(args)}: r.pt holds {len(got)} tensors (first {list(got)[:2]}); a ResNet-18 "
        f"has {len(want)} (first {list(want)[:2]}). Likely cause: --model is not passed to "
        "models.build_model"
    )


@pytest.mark.points(1)
def test_cuda_requested_without_cuda_is_a_clear_error(train):
    """`--device cuda` on a machine without CUDA raises a ValueError saying so."""
    got = train("cuda_without_cuda")
    assert got["raised"] == "ValueError" and "CUDA is not available" in got["message"], (
        f"`--device cuda` without CUDA should raise ValueError('... CUDA is not available ...'); "
        f"got {got}"
    )


# --- on a GPU machine --------------------------------------------------------------


@pytest.mark.gpus(1)
@pytest.mark.points(2)
def test_trains_and_resumes_on_cuda(impl, run_script, tmp_path):
    """2 epochs on cuda:0, then resumed to 3 from the checkpoint (exact bits are CPU-only)."""
    path = LESSON.path(impl)
    args = ["--device", "cuda", "--quiet", "--checkpoint", "gpu.pt"]
    run_script(path, *args, "--epochs", "2", timeout=120)
    run_script(path, *args, "--epochs", "3", "--resume", "--metrics-out", "gpu.json", timeout=120)
    metrics = json.loads((tmp_path / "gpu.json").read_text())
    assert metrics["device"] == "cuda:0" and metrics["start_epoch"] == 2
    accuracy = judged_accuracy(tmp_path, "gpu.pt")
    # Within one test image: the run evaluated on the GPU, the grader on the CPU.
    close = abs(metrics["final_accuracy"] - accuracy) <= 1.01 / judge.digits_test_size()
    assert accuracy >= 0.9 and close, (
        f"the grader's evaluation of gpu.pt: {accuracy:.4f} (at least 0.9 expected); "
        f"metrics.json: {metrics['final_accuracy']:.4f} (the same within one test image)"
    )
    state = checkpoint.load(tmp_path / "gpu.pt")  # map_location="cpu": loads anywhere
    assert state["epoch"] == 3
    models.build_model("cnn", 10, 1).load_state_dict(state["model"])
