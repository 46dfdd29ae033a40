"""Grades lesson 10, part 1: ShardedOptimizer, ZeRO stage 1 (lessons/10_sharding/zero.py).

The case script (tests/cases/lesson_10.py) drives the submission's ShardedOptimizer over
AdamW in two gloo ranks forked from one child: the grader's TinyLM (a tied embedding and
head, a LayerNorm, three linear layers; tests/cases/lesson_10_models.py) in two parameter
groups (the norm's parameters at their own lr, without weight decay), the first group's
lr halved before step 3 through param_groups, as a scheduler does, and the gradients
averaged by the case, as DDP would. This process trains the same model with torch's
AdamW on the full batch: the reference.

Tolerances, from a measured distribution (PyTorch 2.14.1, 2 cores, model seeds 0-8): after 6
steps the sharded parameters were 1.0e-7 to 2.4e-7 from the reference (the averaged gradient
rounds differently from the whole batch's, and Adam's division by the root of the second
moment passes that on), and state_dict()'s moments 3.0e-8 to 4.5e-8. PARAM_ATOL is 40
times the worst seen, STATE_ATOL 22 times. The mistakes are far beyond them: a rank that
never receives the others' shards keeps weights about a step (lr = 3e-3) from the
reference, and a schedule that does not reach the sharded step moves every weight of
the first group by about a step too.

Memory, counted: the bytes of every tensor reachable from each rank's optimizer, its
parameters and gradients left out. Splitting whole tensors, a rank cannot own less than
one tensor, so the bound is an even share plus the largest tensor's state, what assigning
each parameter, largest first, to the rank with the fewest bytes guarantees.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from course import lessons, procs
from course.grader.plugin import call_lesson

LESSON = lessons.get("10")
CASES = Path(__file__).with_name("cases") / "lesson_10.py"
_spec = importlib.util.spec_from_file_location(
    "lesson_10_models", CASES.with_name("lesson_10_models.py")
)
m = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(m)

PARAM_ATOL, STATE_ATOL = 1e-5, 1e-6  # see the docstring
WORLD = 2
# The script's run (2 ranks x 32, 2 epochs, the default lr 1e-2) reached 91.9-98.1 % test
# accuracy over seeds 0-5 (PyTorch 2.14.1, 2 cores); the test asks for 80 %.
LEARNED = 0.8

_calls: dict = {}
_runs: dict = {}


@pytest.fixture
def sharded(impl, tmp_path_factory):
    """(found, tensors) of the case `sharded_adamw`, run once per graded folder."""
    if str(impl) not in _calls:
        folder = tmp_path_factory.mktemp("cases")
        _calls[str(impl)] = call_lesson(impl, LESSON, CASES, folder)
    calls = _calls[str(impl)]
    return calls("sharded_adamw"), calls.tensors("sharded_adamw")


@pytest.fixture(scope="module")
def reference():
    """torch's AdamW in this process: (parameters after STEPS + 1 steps, the state_dict
    after STEPS steps)."""
    params, _ = m.reference(m.STEPS + 1)
    _, state = m.reference(m.STEPS)
    return params, state


def largest(a: dict, b: dict) -> tuple[float, str]:
    worst = max(a, key=lambda k: (a[k].float() - b[k].float()).abs().max().item())
    return (a[worst].float() - b[worst].float()).abs().max().item(), worst


def rank_params(got: dict, rank: int, kind: str) -> dict:
    prefix = f"rank{rank}/{kind}/"
    return {k.removeprefix(prefix): v for k, v in got.items() if k.startswith(prefix)}


@pytest.mark.core
@pytest.mark.points(3)
def test_sharded_adamw_trains_like_adamw_in_one_process(sharded, reference):
    """After 6 steps on 2 ranks (each its half of the batch, gradients averaged), every
    rank holds every parameter, equal to torch's AdamW trained in one process on the
    whole batch, with the same groups and the same lr schedule."""
    _, got = sharded
    want, _ = reference
    for rank in range(WORLD):
        mine = rank_params(got, rank, "continued")
        missing = sorted(set(want) - set(mine))
        assert not missing, f"rank {rank}: no values for {missing[:3]}"
        worst, where = largest(mine, want)
        assert worst <= PARAM_ATOL, (
            f"rank {rank}: after {m.STEPS + 1} steps {where} is {worst:.2e} from torch's AdamW "
            f"in one process (allowed {PARAM_ATOL:g}). Likely causes: a parameter's update "
            "does not reach the ranks that do not own it (each owner sends its shard after "
            "the step), a group's hyperparameters (lr, weight decay) lost on the way to the "
            "inner optimizer, or an lr changed in param_groups that the step never sees"
        )


@pytest.mark.core
@pytest.mark.points(2)
def test_each_rank_keeps_about_half_of_adamws_state(sharded, reference):
    """The tensors each rank's optimizer holds (parameters and gradients left out) are
    at most an even share of AdamW's whole state plus the largest tensor's, and together
    they are the whole state once, not one copy per rank."""
    found, _ = sharded
    _, state = reference
    sizes = [
        sum(v.numel() * v.element_size() for v in s.values() if torch.is_tensor(v))
        for s in state["state"].values()
    ]
    whole, bound = sum(sizes), sum(sizes) / WORLD + max(sizes)
    held = [found[str(rank)]["held_bytes"] for rank in range(WORLD)]
    print(f"optimizer bytes per rank: {held} of {whole:,} unsharded (bound {bound:,.0f})")
    over = [f"rank {r}: {b:,}" for r, b in enumerate(held) if b > bound]
    assert not over, (
        f"AdamW's state for the whole model is {whole:,} bytes; with 2 ranks each should "
        f"hold at most {bound:,.0f} (half, plus the largest tensor's state), but {over}. "
        "Likely causes: every rank builds its inner optimizer over all the parameters, or "
        "the parameters are dealt out by count, not by size, so one rank gets the big ones"
    )
    assert sum(held) >= 0.95 * whole, (
        f"the ranks hold {sum(held):,} bytes of optimizer state together, less than AdamW's "
        f"{whole:,}: some parameters have no state on any rank (no owner steps them)"
    )


@pytest.mark.core
@pytest.mark.points(2)
def test_state_dict_is_the_unsharded_optimizers(sharded, reference):
    """state_dict() after 5 steps, on every rank, holds every parameter's state (step,
    both moments) under the unsharded optimizer's numbering, with the values of torch's
    AdamW, and each group's hyperparameters, the scheduled lr included."""
    found, got = sharded
    _, state = reference
    keys = found["0"]["state_keys"]
    assert keys == sorted(int(i) for i in state["state"]), (
        f"state_dict()['state'] has entries {keys}; torch's AdamW over the same groups has "
        f"{sorted(state['state'])}. Likely cause: only this rank's shard returned, or "
        "numbered by the inner optimizer instead of by the order of param_groups"
    )
    for index, entry in state["state"].items():
        for key, value in entry.items():
            mine = got.get(f"state/{index}/{key}")
            assert mine is not None, f"state_dict()['state'][{index}] has no {key!r}"
            gap = (mine.float() - value.float()).abs().max().item()
            assert gap <= STATE_ATOL, (
                f"state_dict()['state'][{index}][{key!r}] is {gap:.2e} from torch's AdamW "
                f"(allowed {STATE_ATOL:g}): the entry belongs to another parameter"
            )
    for rank in range(WORLD):
        groups = found[str(rank)]["groups"]
        seen = [(g.get("lr"), g.get("weight_decay"), len(g.get("params", []))) for g in groups]
        want = [(g["lr"], g["weight_decay"], len(g["params"])) for g in state["param_groups"]]
        assert seen == want, (
            f"rank {rank}: state_dict()['param_groups'] gives (lr, weight_decay, parameters) "
            f"{seen}; torch's AdamW gives {want}"
        )


@pytest.mark.core
@pytest.mark.points(1)
def test_a_reloaded_state_dict_continues_the_same_training(sharded):
    """A second ShardedOptimizer over a copy of the model, given the first one's
    state_dict(), takes the next step to the same bits as the first one."""
    _, got = sharded
    for rank in range(WORLD):
        continued, reloaded = (
            rank_params(got, rank, "continued"),
            rank_params(got, rank, "reloaded"),
        )
        different = [k for k in continued if not torch.equal(continued[k], reloaded[k])]
        assert not different, (
            f"rank {rank}: after load_state_dict(state_dict()) the next step gives other "
            f"values for {different[:3]}. Likely cause: load_state_dict keeps the wrong "
            "entries for this rank's shard, or drops the step counts or the hyperparameters"
        )


def launch(impl, folder: Path, *args):
    command = [sys.executable, str(LESSON.path(impl)), "--nproc", WORLD, "--backend", "gloo"]
    command += ["--epochs", 2, "--batch-size", 32, "--seed", 1, "--quiet"]
    command += ["--metrics-out", "metrics.json", *args]
    return dict(args=[str(a) for a in command], timeout=120, cwd=folder, log_dir=folder / "ranks")


@pytest.fixture
def runs(impl, tmp_path_factory):
    """The script on 2 gloo ranks, with ShardedOptimizer and with --optimizer plain, at once."""
    if str(impl) not in _runs:
        folders = {name: tmp_path_factory.mktemp(name) for name in ("sharded", "plain")}
        jobs = {"sharded": launch(impl, folders["sharded"])}
        jobs["plain"] = launch(impl, folders["plain"], "--optimizer", "plain")
        results = procs.run_all(jobs)
        _runs[str(impl)] = {name: (results[name], folders[name]) for name in jobs}
    return _runs[str(impl)]


BYTES = re.compile(r"rank (\d): optimizer state ([\d,]+) bytes of ([\d,]+)")


@pytest.mark.points(2)
def test_the_script_learns_and_shards_its_optimizer(runs):
    """zero.py on 2 gloo ranks (2 x 32, 2 epochs of the digits) reaches 80 % test accuracy
    with ShardedOptimizer; --optimizer plain prints the same losses, with the whole state on
    both ranks; sharded, the ranks' states add up to one copy."""
    for name, (result, _) in runs.items():
        if not result.ok:
            pytest.fail(f"--optimizer {name}: {result.failure()}", pytrace=False)
    metrics = {n: json.loads((f / "metrics.json").read_text()) for n, (_, f) in runs.items()}
    accuracy = metrics["sharded"]["final_accuracy"]
    assert accuracy >= LEARNED, (
        f"after 2 epochs on 2 ranks the sharded run classifies {accuracy:.1%} of the test "
        f"digits (expected at least {LEARNED:.0%}): the training does not work"
    )
    losses = {n: [e["train_loss"] for e in d["epochs"]] for n, d in metrics.items()}
    assert losses["sharded"] == pytest.approx(losses["plain"], rel=1e-4), (
        f"train losses per epoch: sharded {losses['sharded']}, plain {losses['plain']}: "
        "the same training should give the same losses"
    )
    printed = {n: BYTES.findall("\n".join(r.rank_logs.values())) for n, (r, _) in runs.items()}
    assert all(len(rows) == WORLD for rows in printed.values()), (
        f"expected one 'rank R: optimizer state N bytes of M' line per rank, got {printed}"
    )
    plain = {int(r): int(b.replace(",", "")) for r, b, _ in printed["plain"]}
    sharded = {int(r): int(b.replace(",", "")) for r, b, _ in printed["sharded"]}
    assert len(set(plain.values())) == 1, f"plain AdamW: every rank holds it all, {plain}"
    assert sum(sharded.values()) == plain[0], (
        f"sharded, the ranks hold {sharded} bytes: together they should be one copy, "
        f"{plain[0]:,} bytes"
    )
