"""Grades lesson 04: torchrun, snapshots, elastic restarts (lessons/04_torchrun/train.py).

Every launch is `torchrun --standalone --nproc_per_node=2` (as `python -m
course run 04` builds it) training 2 epochs of 23 steps (per-rank batch 32),
with a snapshot every 4 steps. Faults are injected through course.probes.chaos's
environment variables, from inside the processes (course/probes/__init__.py), whatever
code the lesson uses. Three launches start at once and are shared by the
tests (cached per backend):

  ref    no fault, launched as two nodes (two torchrun agents with one
         process each, c10d rendezvous on loopback): the result every
         other run must reproduce, bit for bit; each rank's weights are
         fingerprinted after every step (course/probes/weight_log.py)
  kill   snapshots every 3 steps; rank 1 SIGKILLs itself after step 5 (the
         group resumes from step 3, mid-epoch), and again 4 steps into the
         second attempt, at step 7: the step-6 snapshot, taken inside the
         resumed epoch, must say "epoch 1 done", or the third attempt trains
         part of epoch 1 twice; --max-restarts 2
  crash  rank 0 SIGKILLs itself as it puts the 2nd snapshot in place
         (step 8); --max-restarts 0, so the job fails

and a fourth, `resume`, runs the same command again without a fault on a
copy of the crash's folder, as soon as the crash has ended; a fifth,
`one_rank`, starts 1 process on a copy of ref's folder once ref has ended:
a snapshot written by 2 ranks must be refused with a clear error.
The mutants of setup() and of the resume in train() are caught more cheaply by the case
`resumed_twice` (tests/lessons/cases/lesson_04.py): the same functions called in two gloo ranks
forked from one child, without torchrun, stopped twice with --max-steps and resumed, and
compared with their own uninterrupted run and with the grader's reference.
The restart overhead (the kill's timestamp to the first step after the
restart) is printed by test_restart_overhead_is_measured; it is a figure to
read, never asserted against a time.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from course import checkpoint, registry
from course.grader import judge
from course.grader.case_runs import run_lesson_cases
from course.grader.launches import needed
from course.grader.tolerances import seed, tolerance
from course.probes import weight_log, write_log
from course.probes.chaos import KILL_AT_STEP, KILL_IN_SAVE, KILL_RANK
from course.probes.weight_log import LOG_ENV as REPLICA_ENV
from course.probes.write_log import WRITE_LOG_ENV
from course.ranks import free_port

LESSON = registry.get("04")
CASES = Path(__file__).with_name("cases") / "lesson_04.py"
STEPS, EVERY = 46, 4  # 2 epochs of ceil(1438 / (2 x 32)) steps
KILL_EVERY, KILL_STEPS = 3, (5, 4)  # the kill run: snapshot period, kills per attempt
ARGS = ["--epochs", "2", "--batch-size", "32", "--seed", str(seed(0)), "--quiet"]
LEARNED = tolerance(  # lesson 03's threshold for the same model, batch and epochs
    "04.learned", low=0.8, seeds=tuple(range(6)), test="test_two_nodes_learn_the_digits",
    what="test accuracy the grader evaluates after 2 epochs on 2 torchrun ranks x 32",
)  # fmt: skip
ARGS += ["--snapshot", "snapshot.pt", "--snapshot-every", str(EVERY), "--checkpoint", "final.pt"]

# The resume case's seed and learning rate (tests/lessons/cases/lesson_04.py uses the same), and its
# bound from the grader's reference: train() on 2 forked ranks (2 x 32, no BatchNorm, 2
# epochs, --lr 0.1), measured over seeds 0-11 by `python -m course tolerances 04` (float32
# sums in another order, amplified on some seeds). DataParallel instead of DDP (each rank
# trains alone) ends 0.12 away at seed 2.
RESUME_SEED, RESUME_LR = seed(2), 0.1
RESUME = tolerance(
    "04.resume", high=1e-2, test="test_train_function_resumed_twice_equals_the_graders_run",
    what="largest weight difference of train() on 2 ranks, resumed twice, from one process "
    "on the global batch, after 46 steps",
)  # fmt: skip
NAMES = ("ref", "kill", "crash", "resume", "one_rank")
_runs: dict = {}


def torchrun(launcher, impl, backend, folder, restarts, env=None, every=EVERY, nproc=2):
    """One torchrun launch of the lesson in `folder` (an empty folder)."""
    args = [*ARGS[:-4], "--snapshot-every", str(every), *ARGS[-2:]]
    command = registry.command(LESSON, impl, nproc, backend, args, max_restarts=restarts)

    def fresh():  # before a second launch: the folder as the first one found it
        for path in folder.iterdir():
            shutil.rmtree(path) if path.is_dir() else path.unlink()

    return launcher.run_torchrun(
        fresh=fresh,
        args=command,
        timeout=150,
        cwd=folder,
        log_dir=folder / "ranks",
        env={WRITE_LOG_ENV: str(folder / "writes.log"), **(env or {})},
    )


def two_nodes(launcher, impl, backend, folder):
    """The lesson as a 2-node job on this machine: two torchrun agents, one process each,
    meeting at a c10d rendezvous on loopback, as `torchrun --nnodes 2` on two hosts would."""
    rendezvous = ["--nnodes=2", "--rdzv_backend=c10d", "--rdzv_id=ref"]
    rendezvous.append(f"--rdzv_endpoint=127.0.0.1:{free_port()}")
    command = registry.command(LESSON, impl, 1, backend, ARGS, rendezvous=rendezvous)
    env = {WRITE_LOG_ENV: str(folder / "writes.log"), REPLICA_ENV: str(folder / "replicas")}
    (folder / "replicas").mkdir()
    jobs = {}
    for node in (0, 1):
        # Each "node" sees one GPU of its own, as two machines would: LOCAL_RANK is 0 on both.
        gpu = {"CUDA_VISIBLE_DEVICES": str(node)} if backend == "nccl" else {}
        jobs[f"node{node}"] = dict(
            args=command, timeout=150, cwd=folder, log_dir=folder / "ranks", env={**env, **gpu}
        )
    agents = launcher.run_all(jobs, fail_fast=True)
    a, b = agents["node0"], agents["node1"]
    failed = [r.returncode for r in (a, b) if r.returncode]
    return dataclasses.replace(
        a,
        returncode=failed[0] if failed else a.returncode,
        timed_out=a.timed_out or b.timed_out,
        output=f"--- node 0 ---\n{a.output}\n--- node 1 ---\n{b.output}",
        rank_logs={**a.rank_logs, **b.rank_logs},
    )


@pytest.fixture
def runs(impl, backend, tmp_path_factory, request, launcher):
    """{name: (RunResult, folder)} for ref, kill, crash and resume, launched once per backend.

    ref, kill and crash start together; resume starts when crash ends, on a
    copy of its folder (the crash's own folder stays as the crash left it)."""
    if backend not in _runs:
        folders = {name: tmp_path_factory.mktemp(f"{name}-{backend}") for name in NAMES}

        def launch(name, restarts, env=None):
            return torchrun(launcher, impl, backend, folders[name], restarts, env)

        def crash_then_resume():
            crash = launch("crash", 0, {KILL_IN_SAVE: "snapshot.pt:2"})
            shutil.copytree(folders["crash"], folders["resume"], dirs_exist_ok=True)
            shutil.rmtree(folders["resume"] / "ranks", ignore_errors=True)
            return crash, launch("resume", 0)

        def kill():
            env = {KILL_RANK: "1", KILL_AT_STEP: ",".join(map(str, KILL_STEPS))}
            return torchrun(launcher, impl, backend, folders["kill"], 2, env, KILL_EVERY)

        def ref_then_one_rank():
            ref = two_nodes(launcher, impl, backend, folders["ref"])
            if not (folders["ref"] / "snapshot.pt").exists():
                return ref, ref  # nothing to resume: the tests report ref's failure
            shutil.copy2(folders["ref"] / "snapshot.pt", folders["one_rank"] / "snapshot.pt")
            return ref, torchrun(launcher, impl, backend, folders["one_rank"], 0, nproc=1)

        want = set(needed(request, NAMES))  # a grade of one test launches what it reads

        def ref_only():
            return two_nodes(launcher, impl, backend, folders["ref"]), None

        first_job = ref_then_one_rank if "one_rank" in want else ref_only
        with ThreadPoolExecutor(max_workers=3) as pool:
            first = pool.submit(first_job) if want & {"ref", "one_rank"} else None
            killed = pool.submit(kill) if "kill" in want else None
            both = pool.submit(crash_then_resume) if want & {"crash", "resume"} else None
            results = {}
            if first is not None:
                results["ref"], results["one_rank"] = first.result()
            if killed is not None:
                results["kill"] = killed.result()
            if both is not None:
                results["crash"], results["resume"] = both.result()
        _runs[backend] = {
            name: (result, folders[name]) for name, result in results.items() if result is not None
        }
    return _runs[backend]


def finished(runs, name):
    result, folder = runs[name]
    if not result.ok:
        pytest.fail(result.failure(), pytrace=False)
    return result, folder


def assert_same_weights(folder, ref_folder):
    for path in (folder / "final.pt", ref_folder / "final.pt"):
        if not path.is_file():
            pytest.fail(
                f"{path.parent.name}: the run wrote no --checkpoint final.pt", pytrace=False
            )
    got = checkpoint.load(folder / "final.pt")
    want = checkpoint.load(ref_folder / "final.pt")
    assert want["step"] == STEPS, f"the uninterrupted run took {want['step']} steps, not {STEPS}"
    assert got["step"] == STEPS, (
        f"the restarted run took {got['step']} steps instead of {STEPS}: it repeated or skipped "
        "batches after the restart. Likely cause: the sampler skips the wrong amount "
        "(sampler.skip counts indices: batches x batch size) or the snapshot's batch count is off"
    )
    different = [k for k in want["model"] if not torch.equal(got["model"][k], want["model"][k])]
    # CPU and GPU alike (the lesson asks cuDNN for deterministic algorithms):
    # the same operations in the same order give the same bits.
    assert not different, (
        f"{folder.name} is not bit-identical to the uninterrupted run (ref): {different[:3]} "
        "differ. The weights alone do not say which run is wrong: ref is 2 nodes of 1 process "
        "(LOCAL_RANK is 0 on both, RANK is 0 and 1), the restarted run 1 node of 2 processes "
        "(LOCAL_RANK equals RANK). If only ref is wrong, the rank comes from LOCAL_RANK; "
        "otherwise the resumed run repeats or skips work"
    )


def rank_log(result, rank):
    return result.rank_logs.get(f"rank{rank}", "")


@pytest.mark.core
@pytest.mark.points(4)
@pytest.mark.needs("kill", "ref")
def test_killed_rank_is_restarted_and_the_result_is_bit_exact(runs, backend):
    """Rank 1 is SIGKILLed after step 5; the restarted group resumes from the
    step-3 snapshot and ends bit-identical to an uninterrupted run."""
    result, folder = finished(runs, "kill")
    _, ref_folder = finished(runs, "ref")
    assert "rank 1 killed after step 5" in rank_log(result, 1), (
        "the fault was not injected: rank 1 never finished optimizer step 5"
    )
    assert re.search(r"resumed from .* at step 3\b", rank_log(result, 0)), (
        f"the restarted group should resume from the step-3 snapshot\n{result.describe()}"
    )
    assert_same_weights(folder, ref_folder)


@pytest.mark.core
@pytest.mark.points(2)
@pytest.mark.needs("kill", "ref")
def test_a_second_crash_inside_a_resumed_epoch_loses_and_repeats_nothing(runs, backend):
    """Killed after step 5 and again after step 7: the step-6 snapshot, taken in the
    resumed epoch, counts the batches before the restart too, and the run ends bit-exact."""
    result, folder = finished(runs, "kill")
    _, ref_folder = finished(runs, "ref")
    kills = [line for line in rank_log(result, 1).splitlines() if line.startswith("chaos: rank 1")]
    assert len(kills) == 2, f"expected two kills of rank 1, saw {kills}\n{result.describe()}"
    steps = checkpoint.load(folder / "final.pt")["step"]
    assert steps == STEPS, (
        f"the run took {steps} steps instead of {STEPS}: after the second restart it resumed "
        "at the wrong batch. Likely cause: the snapshot taken in the resumed epoch counts only "
        "the batches since the restart; count the ones before it too (done_before)"
    )
    assert_same_weights(folder, ref_folder)


@pytest.mark.core
@pytest.mark.points(2)
@pytest.mark.needs("crash")
def test_without_restarts_the_failure_names_the_rank_and_signal(runs, backend):
    """With --max-restarts 0 torchrun fails; its report names rank 0, exit code -9, SIGKILL."""
    result, _ = runs["crash"]
    assert not result.timed_out, result.describe()
    assert result.returncode != 0, "torchrun should fail when a rank dies and no restart is left"
    summary = result.output
    assert re.search(r"rank\s*:\s*0 \(local_rank: 0\)", summary), summary[-3000:]
    assert re.search(r"exitcode\s*:\s*-9", summary) and "SIGKILL" in summary, summary[-3000:]


@pytest.mark.core
@pytest.mark.points(3)
@pytest.mark.needs("crash", "resume", "ref")
def test_kill_during_snapshot_write_keeps_the_previous_snapshot(runs, backend):
    """A kill as a snapshot is put in place (after its temporary file is written, before
    the rename) leaves the previous snapshot loadable, and resuming from it ends
    bit-identical."""
    crashed, folder = runs["crash"]
    _, ref_folder = finished(runs, "ref")
    assert "chaos: killed" in rank_log(crashed, 0), (
        "the fault was not injected: rank 0 never put snapshot.pt in place a second time "
        f"(a snapshot every {EVERY} steps, written by rank 0)\n{crashed.describe()}"
    )
    try:  # the crash hit the step-8 write: the step-4 snapshot must still be there, whole
        snapshot = checkpoint.load(folder / "snapshot.pt")
    except Exception as err:  # noqa: BLE001 - any load error means the file was damaged
        pytest.fail(
            f"after a crash during the step-8 snapshot, snapshot.pt no longer loads ({err}). "
            "Likely cause: the snapshot is written in place. Write a temporary file in the "
            "same folder, then os.replace it onto the name (course.checkpoint.save does).",
            pytrace=False,
        )
    assert snapshot["step"] == EVERY, "the snapshot should still be the one from step 4"
    result, resumed = finished(runs, "resume")  # the same command again, without the fault
    assert re.search(r"resumed from .* at step 4\b", rank_log(result, 0)), result.describe()
    assert_same_weights(resumed, ref_folder)


@pytest.mark.core
@pytest.mark.points(1)
@pytest.mark.needs("ref")
def test_only_rank_0_writes_files(runs, backend):
    """Rank 0 alone writes the snapshot and the checkpoint, of the plain model."""
    _, folder = finished(runs, "ref")
    others = {
        n: r for n, r in write_log.writers(folder / "writes.log", folder).items() if r != {"0"}
    }
    assert not others, f"expected rank 0 alone to write files, but {others} (file: ranks) did"
    assert sorted(p.name for p in folder.glob("*.pt")) == ["final.pt", "snapshot.pt"]
    state = checkpoint.load(folder / "snapshot.pt")
    last = STEPS - STEPS % EVERY  # the last step that wrote a snapshot
    assert state["step"] == last, f"the last snapshot should be step {last}'s: {state['step']}"
    assert not any(k.startswith("module.") for k in state["model"]), "save model.module's weights"


@pytest.mark.points(1)
@pytest.mark.needs("kill")
def test_restart_overhead_is_measured(runs, backend):
    """Prints the time from the kill to the first step after the restart (never asserted)."""
    result, _ = finished(runs, "kill")
    killed = re.search(r"SIGKILL at t=([\d.]+)", rank_log(result, 1))
    resumed = re.search(r"first step after the restart done at t=([\d.]+)", rank_log(result, 0))
    assert killed and resumed, "expected the kill's and the first resumed step's timestamps"
    overhead = float(resumed.group(1)) - float(killed.group(1))
    print(f"restart overhead: {overhead:.2f} s from the kill to the first step after the restart")
    assert overhead > 0


@pytest.mark.core
@pytest.mark.points(2)
@pytest.mark.needs("ref")
def test_two_nodes_keep_identical_replicas(runs, backend):
    """Launched as 2 nodes x 1 process, every rank holds the same weights after every
    optimizer step: DDP syncs across the two launchers."""
    _, folder = finished(runs, "ref")
    differs = weight_log.first_difference(folder / "replicas")
    assert differs is None, (
        f"{differs}. DDP keeps every replica identical; likely cause: the model is not "
        "wrapped in DistributedDataParallel"
    )


@pytest.mark.core
@pytest.mark.points(1)
@pytest.mark.needs("ref")
def test_two_nodes_learn_the_digits(runs, backend):
    """The 2-node run's final model, evaluated by the grader, classifies at least 80 % of
    the test digits (2 ranks x 32 images, 2 epochs, as lesson 03's learning check)."""
    _, folder = finished(runs, "ref")
    try:
        accuracy = judge.digits_accuracy(folder / "final.pt")
    except (FileNotFoundError, ValueError) as err:
        pytest.fail(f"the grader could not evaluate final.pt: {err}", pytrace=False)
    LEARNED.note(accuracy, backend)
    assert accuracy >= LEARNED.low, (
        f"after 2 epochs the saved model classifies {accuracy:.1%} of the test digits "
        f"correctly (the grader's evaluation of final.pt; expected at least {LEARNED.low:.0%}). "
        "Likely cause: a broken training step, or a resume that loses state"
    )


@pytest.mark.points(1)
@pytest.mark.needs("ref", "one_rank")
def test_a_snapshot_from_another_number_of_ranks_is_refused(runs, backend):
    """Resuming ref's 2-rank snapshot with 1 process stops at once with a one-line error
    (its shards and batch positions would not line up); with 2 it resumes (the kill test)."""
    finished(runs, "ref")  # the snapshot comes from ref
    result, folder = runs["one_rank"]
    assert not result.timed_out, result.describe()
    assert result.returncode != 0 and not (folder / "final.pt").exists(), (
        "a snapshot written by 2 ranks was resumed by 1 without complaint; compare the "
        f"snapshot's world size with this job's and raise ValueError\n{result.describe()}"
    )
    log = rank_log(result, 0)
    errors = [line for line in log.splitlines() if "error" in line.lower()]
    assert errors and "Traceback" not in log, (
        f"expected a one-line error naming the two world sizes, got:\n{log[-2000:]}"
    )
    assert re.search(r"\b2\b", errors[-1]) and re.search(r"\b1\b", errors[-1]), errors[-1]


_cases: dict = {}


@pytest.fixture
def snapshot_cases(impl, tmp_path_factory):
    """The case script's snapshot cases, in one child, once per graded folder."""
    if str(impl) not in _cases:
        folder = tmp_path_factory.mktemp("cases")
        only = ["snapshot_round_trip", "snapshot_other_world"]
        _cases[str(impl)] = run_lesson_cases(impl, LESSON, CASES, folder, only=only)
    return _cases[str(impl)]


@pytest.mark.core
@pytest.mark.points(1)
def test_a_snapshot_restores_weights_optimizer_and_generator(snapshot_cases):
    """save_snapshot, then load_snapshot into another model and optimizer (one rank, no
    torchrun): the weights, SGD's momentum and the random generator come back as saved,
    and load_snapshot returns (epoch, batches done, step) as given to save_snapshot."""
    got = snapshot_cases.tensors("snapshot_round_trip")
    found = snapshot_cases("snapshot_round_trip")
    assert found["returned"] == [1, 3, 7], (
        f"save_snapshot(..., epoch=1, batches_done=3, step=7), then load_snapshot returned "
        f"{found['returned']}"
    )
    for part, cause in (
        ("", "the model's weights are not restored"),
        ("_momentum", "the optimizer's state is not restored (load its state_dict)"),
    ):
        saved = {k.split("/", 1)[1]: v for k, v in got.items() if k.startswith(f"saved{part}/")}
        loaded = {k.split("/", 1)[1]: v for k, v in got.items() if k.startswith(f"loaded{part}/")}
        different = [k for k in saved if k not in loaded or not torch.equal(saved[k], loaded[k])]
        assert saved and not different, f"after load_snapshot {different[:3]} differ: {cause}"
    after_save, after_load = got["rng"]
    assert torch.equal(after_save, after_load), (
        "after load_snapshot the random generator draws other numbers than it did right "
        "after save_snapshot: restore this rank's generator states"
    )


@pytest.mark.core
@pytest.mark.points(1)
def test_a_snapshot_is_put_in_place_by_a_rename(snapshot_cases):
    """Replacing snapshot.pt writes a temporary file and renames it onto the name, never
    opening snapshot.pt itself for writing: a crash mid-write leaves the old one whole."""
    writes = snapshot_cases("snapshot_round_trip")["writes"]
    assert writes == ["renamed onto"], (
        f"replacing snapshot.pt: {writes or 'not written at all'}. Expected one rename of a "
        "finished temporary file onto it (course.checkpoint.save does that); a write in "
        "place leaves half a file when the process dies mid-write"
    )


@pytest.mark.core
@pytest.mark.points(1)
def test_load_snapshot_refuses_another_world_size(snapshot_cases):
    """A snapshot saved by 2 ranks (save_snapshot in a group of 2), loaded in a group of 1:
    load_snapshot raises ValueError naming both world sizes."""
    found = snapshot_cases("snapshot_other_world")
    assert found["raised"] == "ValueError", (
        f"load_snapshot of a 2-rank snapshot in a 1-rank group raised {found['raised']}"
        f"{': ' + found.get('message', '') if found['raised'] else ''}; expected ValueError: "
        "its shards and batch positions would not line up. Compare the snapshot's world "
        "size with dist.get_world_size()"
    )
    message = found["message"]
    assert re.search(r"\b2\b", message) and re.search(r"\b1\b", message), (
        f"name both world sizes, 2 and 1: {message}"
    )


@pytest.fixture
def resume_cases(impl, tmp_path_factory):
    """The case script's `resumed_twice` (tests/lessons/cases/lesson_04.py), once per graded folder:
    setup() and train() in two gloo ranks forked from one child, without torchrun."""
    key = f"resume:{impl}"
    if key not in _cases:
        folder = tmp_path_factory.mktemp("resume")
        _cases[key] = run_lesson_cases(impl, LESSON, CASES, folder, only=["resumed_twice"])
    return _cases[key]


@pytest.mark.core
@pytest.mark.points(1)
def test_setup_takes_the_global_rank_from_torchruns_environment(resume_cases):
    """setup("gloo") with 2 nodes' environment (RANK 0 and 1, LOCAL_RANK 0 on both) returns
    each process's global rank and the world size, and joins the group as that rank."""
    joined = [
        (j["rank"], j["world"], j["group_rank"]) for j in resume_cases("resumed_twice")["joined"]
    ]
    assert joined == [(0, 2, 0), (1, 2, 1)], (
        f"with RANK=0 and RANK=1 (LOCAL_RANK=0 on both, as on two nodes) setup returned "
        f"(rank, world size, group rank) {joined}. Likely cause: the rank read from "
        "LOCAL_RANK, which numbers the processes of one machine only"
    )


@pytest.mark.core
@pytest.mark.points(2)
def test_train_function_resumed_twice_equals_the_graders_run(resume_cases):
    """train() on two ranks (2 x 32, no BatchNorm, --seed 2 --lr 0.1), stopped after step 10
    and after step 14 and resumed from its snapshot each time, ends with the weights of its
    own uninterrupted run, bit for bit, after 46 steps; that run is the grader's one-process
    training on the global batch (course.grader.judge.reference_weights), and the replicas
    of the last call are equal after every step."""
    found, got = resume_cases("resumed_twice"), resume_cases.tensors("resumed_twice")
    for name in ("whole", "resumed"):
        assert found[f"{name}_step"] is not None, (
            f"train() ({name} run) wrote no --checkpoint: the save after each complete epoch "
            "is missing, or not on rank 0"
        )
    assert found["whole_step"] == STEPS, f"train() took {found['whole_step']} steps, not {STEPS}"
    assert found["resumed_step"] == STEPS, (
        f"stopped after steps 10 and 14 and resumed twice, train() took {found['resumed_step']} "
        f"steps instead of {STEPS}: it repeated or skipped batches. Likely cause: the sampler "
        "skips the wrong amount (sampler.skip counts indices: batches x batch size), or the "
        "snapshot taken in the resumed epoch counts only the batches since the restart"
    )
    whole = {k.split("/", 1)[1]: v for k, v in got.items() if k.startswith("whole/")}
    resumed = {k.split("/", 1)[1]: v for k, v in got.items() if k.startswith("resumed/")}
    different = [k for k in whole if k not in resumed or not torch.equal(whole[k], resumed[k])]
    assert not different, (
        f"resumed twice, train() ends with other weights than its uninterrupted run: "
        f"{different[:3]} differ. Likely cause: the snapshot misses some state (weights, "
        "momentum, random generators) or the resumed epoch trains other batches"
    )
    ref = judge.reference_weights(RESUME_SEED, RESUME_LR, 2, 32, epochs=2)
    worst = max((whole[k] - ref[k]).abs().max().item() for k in ref)
    print(f"largest parameter difference from the grader's one-process run: {worst:.2e}")
    RESUME.note(worst)
    assert worst <= RESUME.high, (
        f"train() on 2 ranks ends {worst:.2e} from the grader's one-process training on the "
        f"global batch (allowed {RESUME.high:g}). Likely cause: the gradients are not averaged "
        "over the ranks (the model not wrapped in DDP)"
    )
    differs = weight_log.first_difference(Path(found["folder"]) / "replicas")
    assert differs is None, f"{differs}. Likely cause: the model is not wrapped in DDP"


@pytest.mark.points(1)
def test_refuses_to_run_without_torchrun(impl, tmp_path):
    """Started without torchrun (no LOCAL_RANK), the script says how to start it."""
    got = run_lesson_cases(impl, LESSON, CASES, tmp_path)("main_without_torchrun")
    assert got["raised"] == "ValueError" and "torchrun" in got["message"], (
        f"main() without LOCAL_RANK in the environment should raise ValueError saying to "
        f"start it with torchrun, got {got}"
    )
