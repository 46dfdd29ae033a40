"""Grades lesson 13: a mixture-of-experts layer (lessons/13_experts/moe.py) and expert
parallelism (lessons/13_experts/experts.py).

Part 1. The case script (tests/lessons/cases/lesson_13.py) calls route, kept and
balance_loss on router outputs skewed towards two experts (capacity then drops choices),
and runs the submission's MoE with the grader's router and experts on the grader's
tokens. This process computes the same with the grader's own layer
(tests/lessons/cases/lesson_13_models.py), one token at a time in float64.

Part 2. The case script (tests/lessons/cases/lesson_13_ep.py) splits the same 8 experts over
2 or 4 forked gloo ranks (drawn from the grading seed) with the submission's
ExpertParallel, each rank routing its own tokens; then over 4 ranks as 2 x 2, experts by
data, with average_gradients. This process runs each rank's tokens through its own layer,
whole, and compares; the grading kit's recorder sees every collective.

EXACT is measured over seeds 0-11 by `python -m course tolerances 13`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from course import registry
from course.grader.case_runs import run_lesson_cases
from course.grader.tolerances import seed, tolerance
from course.measure import tripwires
from course.measure.draws import draw

LESSON = registry.get("13")
CASES = Path(__file__).with_name("cases") / "lesson_13.py"
EP_CASES = CASES.with_name("lesson_13_ep.py")
sys.path.insert(0, str(CASES.parent))
import lesson_13_models as m  # noqa: E402

sys.path.remove(str(CASES.parent))

SEED, EP_SEED, EP_FACTOR = seed(4), seed(6), 1.25  # the case scripts'
EXACT = tolerance(
    "13.exact", high=1e-5,
    test="test_the_layer_computes_what_the_graders_computes "
    "test_expert_parallel_computes_what_one_process_computes "
    "test_experts_by_data_average_over_the_right_groups",
    what="largest difference of the MoE layer's output, balancing loss or any gradient, in "
    "one process or split over ranks, from the grader's layer in float64",
)  # fmt: skip
_cases: dict = {}


def _case(impl, tmp_path_factory, name: str, ep: bool = False):
    key = (str(impl), name)
    if key not in _cases:
        folder = tmp_path_factory.mktemp(name)
        if ep:
            _cases[key] = run_lesson_cases(impl, LESSON, EP_CASES, folder, only=[name],
                                           script="experts.py")  # fmt: skip
        else:
            _cases[key] = run_lesson_cases(impl, LESSON, CASES, folder, only=[name])
    cases = _cases[key]
    return cases(name), cases.tensors(name)


def _close(got, want, what: str, cause: str) -> None:
    assert got is not None and tuple(got.shape) == tuple(want.shape), (
        f"{what}: shape {None if got is None else tuple(got.shape)}, expected {tuple(want.shape)}"
    )
    gap = (got.double() - want.double()).abs().max().item()
    EXACT.note(gap)
    assert gap <= EXACT.high, (
        f"{what} is {gap:.2e} from the grader's (allowed {EXACT.high:g}). {cause}"
    )


# --- part 1: the layer (moe.py) --------------------------------------------------------


@pytest.mark.core
@pytest.mark.points(1)
def test_route_picks_the_k_largest_and_renormalises(impl, tmp_path_factory):
    """route(logits, 2): the softmax over the 8 experts, each token's 2 most probable
    experts, largest first, and their gates renormalised to sum to 1."""
    _, tensors = _case(impl, tmp_path_factory, "routing")
    probs, gates, experts = m.route(m.skewed_logits(SEED))
    assert torch.equal(tensors["experts"], experts), (
        "route: the experts chosen differ from each token's 2 most probable, largest first"
    )
    assert torch.allclose(tensors["probs"], probs, atol=1e-6), "route: probs is not the softmax"
    assert torch.allclose(tensors["gates"], gates, atol=1e-6), (
        "route: the gates are not the chosen probabilities renormalised to sum to 1 "
        f"(rows sum to {tensors['gates'].sum(-1)[:4].tolist()}...)"
    )


@pytest.mark.core
@pytest.mark.points(2)
def test_capacity_keeps_every_first_choice_before_any_second(impl, tmp_path_factory):
    """kept on routing skewed towards experts 0 and 1, 24 tokens, capacity 6: exactly the
    choices an expert takes in order, every token's first choice before any second."""
    _, tensors = _case(impl, tmp_path_factory, "routing")
    _, _, experts = m.route(m.skewed_logits(SEED))
    want = m.kept(experts, m.capacity(m.TOKENS))
    got = tensors["keep"]
    assert got.shape == want.shape and torch.equal(got.bool(), want), (
        f"kept: {int((~got.bool()).sum())} choices dropped, {int((~want).sum())} expected; "
        f"first wrong (token, slot): "
        f"{(got.bool() != want).nonzero()[:3].tolist() if got.shape == want.shape else '-'}. "
        "Likely causes: choices numbered token by token instead of slot by slot (a token's "
        "second choice taking a place before another's first), a place counted from 1, or "
        "the capacity compared with <="
    )


@pytest.mark.points(1)
def test_balance_loss_is_switch_transformers(impl, tmp_path_factory):
    """balance_loss: 8 x the sum over experts of its share of every choice (kept or not)
    times its mean probability, on the same skewed routing, and on one where no token
    chooses the last expert."""
    _, tensors = _case(impl, tmp_path_factory, "routing")
    probs, _, experts = m.route(m.skewed_logits(SEED))
    want = float(m.balance_loss(probs, experts))
    got = float(tensors["loss"])
    assert abs(got - want) <= 1e-5, (
        f"balance_loss is {got:.5f}, Switch Transformer's is {want:.5f} (1 when balanced). "
        "Likely causes: the shares counted over tokens instead of choices, or multiplied "
        "by the probabilities of the chosen experts only"
    )
    # An expert no token chooses still has its share, 0, beside its probability.
    probs, _, experts = m.route(m.last_expert_unchosen(m.skewed_logits(SEED)))
    want, got = float(m.balance_loss(probs, experts)), float(tensors["loss_unused"])
    assert abs(got - want) <= 1e-5, (
        f"with the last of the {m.E} experts chosen by no token, balance_loss is {got:.5f}, "
        f"Switch Transformer's is {want:.5f}. Likely cause: the choices counted without "
        "a place for every expert (torch.bincount without minlength=n_experts is shorter "
        "than the experts when the last gets no choice)"
    )


@pytest.mark.core
@pytest.mark.points(3)
def test_the_layer_computes_what_the_graders_computes(impl, tmp_path_factory):
    """MoE with the grader's router and 8 experts, 24 tokens, top-2, capacity factor 1:
    the choices each expert gets and how many are dropped, the output, the balancing
    loss, and the gradients of the input, the router and every
    expert from (output x w).sum() + the loss equal the grader's layer in float64."""
    _layer_matches(*_case(impl, tmp_path_factory, "layer"))


@pytest.mark.points(1)
@pytest.mark.gpus(1)
def test_the_layer_on_a_gpu_computes_what_the_graders_computes(impl, tmp_path_factory):
    """The same MoE on one GPU (float32, TF32 off): the router's choices, what each expert
    computes, the output, the loss and every gradient, against the grader's layer in
    float64 on the CPU."""
    _layer_matches(*_case(impl, tmp_path_factory, "layer_cuda"))


def _layer_matches(found: dict, tensors: dict) -> None:
    router, experts = m.experts_like(SEED)
    weights = m.weights_of(router, experts)
    x, w = m.inputs(SEED)
    out, aux, wd, xd, chosen, keep = m.layer(weights, x)
    ((out * w.double()).sum() + aux).backward()
    load = torch.bincount(chosen.flatten(), minlength=m.E).tolist()
    assert found["load"] == load, (
        f"MoE's choices per expert {found['load']}, the grader's routing gives {load}"
    )
    assert found["dropped"] == int((~keep).sum()), (
        f"MoE dropped {found['dropped']} choices, the grader's layer {int((~keep).sum())}"
    )
    # What the experts compute: at least the kept choices' rows, at most each expert's
    # capacity (an implementation may pad to it); masking every token costs E / k times more.
    router = 2 * m.TOKENS * m.DIM * m.E
    row = 2 * m.DIM * 2 * m.DIM * 2  # an expert's two matmuls, one row
    low, high = router + row * int(keep.sum()), router + row * m.E * m.capacity(m.TOKENS)
    assert low <= found["flops"] <= high, (
        f"MoE's forward ran {found['flops']:,} matmul FLOPs; the router and the kept "
        f"choices need {low:,}, each expert filled to its capacity {high:,}. "
        + ("Likely cause: every token run through every expert, the unchosen masked out"
           if found["flops"] >= router + row * m.E * m.TOKENS
           else "Seen: more than the kept choices and padding explain" if found["flops"] > high
           else "Seen: fewer than the kept choices need")
    )  # fmt: skip
    combine = ("Likely causes: an expert's output not multiplied by the gate, a dropped "
               "choice still computed, or rows added to the wrong tokens")  # fmt: skip
    _close(tensors["out"], out, "MoE's output", combine)
    _close(tensors["aux"], aux, "MoE's balancing loss", "")
    _close(tensors["x"], xd.grad, "the input's gradient", combine)
    _close(tensors["router"], wd["router"].grad, "the router's gradient",
           "Likely cause: the gates detached from the router")  # fmt: skip
    for key in weights:
        if key != "router":
            _close(tensors[key], wd[key].grad, f"expert {key}'s gradient", combine)


LOAD = re.compile(r"step (\d+)/\d+: loss ([\d.]+), busiest expert ([\d.]+) x the mean")
AFTER = re.compile(r"steps \d+-200: busiest expert ([\d.]+) x the mean on average")
BALANCED = tolerance(
    "13.balanced", high=1.3, room=1, test="test_the_balancing_loss_evens_the_load",
    what="moe.py's busiest expert over the mean, averaged over steps 51-200, with the "
    "balancing loss at weight 0.1, at --seed drawn from the grading seed",
)  # fmt: skip
GAIN = tolerance(
    "13.balance_gain", low=0.02, test="test_the_balancing_loss_evens_the_load",
    what="the same without the balancing loss minus with it",
)  # fmt: skip
LEARNED = tolerance(
    "13.learned", high=0.5, test="test_the_balancing_loss_evens_the_load",
    what="moe.py's loss after 200 steps, with and without the balancing loss "
    "(ln 64 = 4.16 at the start)",
)  # fmt: skip
_runs: dict = {}


@pytest.fixture
def runs(impl, tmp_path_factory, launcher):
    """moe.py with and without its balancing loss, and experts.py on 2 x 2 ranks, at once."""
    if str(impl) not in _runs:
        moe_seed = str(draw("13.script_seed", range(4)) + seed(0))
        jobs = {}
        for name, script, flags in (
            ("aux", "moe.py", ["--steps", "200", "--seed", moe_seed, "--aux-weight", "0.1"]),
            ("no-aux", "moe.py", ["--steps", "200", "--seed", moe_seed, "--aux-weight", "0"]),
            ("ep", "experts.py", ["--nproc", "4", "--backend", "gloo", "--data-parallel", "2",
                                  "--steps", "50"]),
            ("bad", "experts.py", ["--nproc", "4", "--backend", "gloo", "--experts", "6"]),
        ):  # fmt: skip
            folder = tmp_path_factory.mktemp(name)
            device = ["--device", "cpu"] if script == "moe.py" else []
            command = [sys.executable, str(LESSON.path(impl).with_name(script)), *device, *flags]
            jobs[name] = dict(args=command, timeout=120, cwd=folder)
        _runs[str(impl)] = launcher.run_all(jobs)
    return _runs[str(impl)]


def _output(runs, name: str) -> str:
    result = runs[name]
    if not result.ok:
        pytest.fail(f"{' '.join(result.args[1:])}: {result.failure()}", pytrace=False)
    return result.output


@pytest.mark.points(2)
def test_the_balancing_loss_evens_the_load(runs):
    """moe.py, 200 steps, with the balancing loss (--aux-weight 0.1) and without (0): both
    learn (loss below LEARNED); the busiest expert's load over the mean, averaged over
    steps 51-200 as the script prints it, is below BALANCED with the loss, and lower than
    without it by at least GAIN."""
    seen = {}
    for name in ("aux", "no-aux"):
        rows = [(int(s), float(loss), float(r)) for s, loss, r in LOAD.findall(_output(runs, name))]
        assert rows and rows[-1][0] == 200, f"moe.py ({name}): printed steps {[r[0] for r in rows]}"
        LEARNED.note(rows[-1][1])
        assert rows[-1][1] <= LEARNED.high, (
            f"moe.py ({name}): loss {rows[-1][1]} after 200 steps, expected below {LEARNED.high}"
        )
        after = AFTER.findall(_output(runs, name))
        assert after, f"moe.py ({name}): no line 'steps 51-200: busiest expert ... on average'"
        seen[name] = float(after[0])
    BALANCED.note(seen["aux"])
    gain = seen["no-aux"] - seen["aux"]
    GAIN.note(gain)
    cause = ("Likely cause: the balancing loss not added to the loss, or without gradient "
             "(the probabilities detached)")  # fmt: skip
    assert seen["aux"] <= BALANCED.high, (
        f"moe.py --aux-weight 0.1: the busiest expert averaged {seen['aux']:.3f} x the mean; "
        f"expected below {BALANCED.high}. {cause}"
    )
    assert gain >= GAIN.low, (
        f"moe.py: the busiest expert averaged {seen['aux']:.3f} x the mean with the balancing "
        f"loss and {seen['no-aux']:.3f} without; expected lower with it by {GAIN.low} at "
        f"least. {cause}"
    )


# --- part 2: expert parallelism (experts.py) ------------------------------------------


def _reference(rank: int, mean: bool = False):
    """Rank `rank`'s tokens through the grader's whole layer: output, gradients, routing."""
    router, experts = m.experts_like(EP_SEED)
    weights = m.weights_of(router, experts)
    x, w = m.ep_inputs(EP_SEED, rank, router)
    out, aux, wd, xd, chosen, keep = m.layer(weights, x, EP_FACTOR)
    loss = (out * w.double()).sum()
    (loss / len(x) if mean else loss).backward()
    # An expert none of these tokens reached (rank 0's last) has no gradient from them: 0.
    grads = {k: torch.zeros_like(v) if v.grad is None else v.grad for k, v in wd.items()}
    return out, xd.grad, grads, chosen, keep


def _ep_exact(found, tensors, what: str, averaged: bool) -> None:
    world = found["world"]
    for rank in range(world):
        used = found[str(rank)]["library"]
        assert not used, f"rank {rank}: " + tripwires.refused(used, "AllToAll")
    per = m.E // (world if not averaged else 2)
    refs = [_reference(r, mean=averaged) for r in range(world)]
    total = {k: sum(ref[2][k] for ref in refs) / (world if averaged else 1) for k in refs[0][2]}
    for rank in range(world):
        out, xgrad, grads, _, _ = refs[rank]
        dispatch = (
            "Likely causes: rows sent to the wrong rank, or coming back in another order "
            "than they left, or a piece of the inbox run by another expert"
        )
        _close(tensors.get(f"rank{rank}/out"), out, f"{what}, rank {rank}: the output", dispatch)
        backward = "Likely cause: AllToAll's backward not sending the gradients back reversed"
        _close(tensors.get(f"rank{rank}/x"), xgrad, f"{what}, rank {rank}: the input's "
               "gradient", backward)  # fmt: skip
        router_want = total["router"] if averaged else grads["router"]
        _close(tensors.get(f"rank{rank}/router"), router_want,
               f"{what}, rank {rank}: the router's gradient",
               "Likely cause: the router's gradient averaged over the wrong group, or not "
               "divided by the world size" if averaged else "")  # fmt: skip
        mine = range((rank % (m.E // per)) * per, (rank % (m.E // per) + 1) * per)
        for e in mine:
            for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
                want = total[f"{e}.{name}"]
                _close(tensors.get(f"rank{rank}/{e}.{name}"), want,
                       f"{what}, rank {rank}: expert {e}'s {name} gradient",
                       "Likely causes: an expert's gradient summed over every rank instead of "
                       "the ranks holding it, or divided by the data-parallel size instead of "
                       "the world size" if averaged else dispatch)  # fmt: skip


@pytest.mark.exercise("experts.py")
@pytest.mark.core
@pytest.mark.points(3)
def test_expert_parallel_computes_what_one_process_computes(impl, tmp_path_factory):
    """ExpertParallel over 2 or 4 gloo ranks (drawn), 8 experts split evenly, each rank
    routing its own 24 tokens (rank 0's drawn among those that leave the last expert out,
    so its count for that expert is 0): each rank's output and input gradient, its router
    gradient, and each expert's gradient on the rank that holds it (the sum of every
    rank's tokens' shares), equal the grader's whole layer on those tokens. AllToAll is
    the hand-written one: torch's differentiable all-to-alls are tripwired."""
    found, tensors = _case(impl, tmp_path_factory, "ep", ep=True)
    _ep_exact(found, tensors, "ExpertParallel", averaged=False)


@pytest.mark.exercise("experts.py")
@pytest.mark.core
@pytest.mark.points(2)
def test_tokens_travel_by_all_to_all_as_routing_demands(impl, tmp_path_factory):
    """Seen below torch.distributed on every rank: forward, one all-to-all of the experts'
    counts (int64), then one of the rows each way: out, this rank's kept choices (24
    tokens' routing counted by the grader) x 16 float32 values; back, what it received.
    Backward, the same two reversed. Nothing else: gathering every token to every rank is
    refused."""
    found, _ = _case(impl, tmp_path_factory, "ep", ep=True)
    world = found["world"]
    per = m.E // world
    refs = [_reference(r) for r in range(world)]
    row = m.DIM * 4
    for rank in range(world):
        records = found[str(rank)]["records"]
        extra = [r for r in records if r["op"] != "all_to_all"]
        if extra:  # say what was seen: integers (the counts), or the rows themselves
            seen = ", ".join(f"{r['op']} of {r['bytes']} bytes of {r['dtypes'][0]}" for r in extra)
            ints = all(not r["dtypes"][0].startswith("torch.float") for r in extra)
            why = (
                f"the experts' counts are exchanged by all-to-all too: each rank needs only "
                f"what each other rank sends it ({m.E} int64 counts)"
                if ints
                else "tokens travel to their experts by all-to-all; gathering every token to "
                f"every rank and masking gives the right numbers at {world} times the bytes"
            )
            raise AssertionError(f"ExpertParallel, rank {rank}: called {seen}. Expected only "
                                 f"all-to-alls: {why}. Refused.")  # fmt: skip
        _, _, _, chosen, keep = refs[rank]
        sent = int(keep.sum()) * row
        arrived = sum(int(((ref[3] // per == rank) & ref[4]).sum()) for ref in refs) * row
        counts = [r for r in records if not r["dtypes"][0].startswith("torch.float")]
        assert len(counts) == 1 and counts[0]["phase"] == "forward" and (
            counts[0]["bytes"] <= m.E * 8), (
            f"ExpertParallel, rank {rank}: all-to-alls of integers {counts}; expected one, in "
            f"forward, of the {m.E} experts' counts"
        )  # fmt: skip
        kinds = [(r["phase"], r["bytes"]) for r in records if r not in counts]
        want = [("forward", sent), ("forward", arrived), ("backward", sent),
                ("backward", arrived)]  # fmt: skip
        assert sorted(kinds) == sorted(want) and all(
            r["dtypes"] == ["torch.float32"] for r in records if r not in counts), (
            f"ExpertParallel, rank {rank} of {world}: all-to-alls of rows (phase, bytes sent) "
            f"{kinds}; expected {want}: {sent:,} bytes out (its {int(keep.sum())} kept "
            f"choices x {m.DIM} float32) and {arrived:,} back (the rows its experts "
            "received), each way"
        )  # fmt: skip


@pytest.mark.exercise("experts.py")
@pytest.mark.points(2)
def test_experts_by_data_average_over_the_right_groups(impl, tmp_path_factory):
    """4 ranks as 2 x 2 (groups): experts split within each pair, each rank its own tokens
    and its loss their mean; after average_gradients every rank's router gradient and its
    experts' gradients equal one process's on the whole batch (the mean over all 4 ranks'
    tokens), and the all-to-alls stay inside each pair."""
    found, tensors = _case(impl, tmp_path_factory, "ep_dp", ep=True)
    for rank in range(4):
        groups = {tuple(r["group"]) for r in found[str(rank)]["records"] if r["op"] == "all_to_all"}
        pair = tuple(range(rank // 2 * 2, rank // 2 * 2 + 2))
        assert groups == {pair}, (
            f"groups: rank {rank}'s all-to-alls spanned {sorted(groups)}; expected its pair {pair}"
        )
    _ep_exact(found, tensors, "ExpertParallel x data", averaged=True)


@pytest.mark.exercise("experts.py")
@pytest.mark.points(1)
def test_the_expert_parallel_script_learns(runs):
    """experts.py on 4 gloo ranks, --data-parallel 2, 50 steps: the loss falls from
    ln 64 below 0.5, and each printed step names the rows every rank sent. Experts that do
    not split over the ranks are refused in one line, before any rank starts."""
    bad = runs["bad"]
    lines = [line for line in bad.output.strip().splitlines() if line.strip()]
    assert bad.returncode not in (0, None) and len(lines) == 1 and "Traceback" not in bad.output, (
        f"experts.py --experts 6 on 4 ranks: exit {bad.returncode}, {bad.output[-400:]!r}; "
        "expected a one-line error"
    )
    steps = re.findall(r"step (\d+)/50: loss ([\d.]+), rows sent by rank \[([\d, ]+)\]",
                       _output(runs, "ep"))  # fmt: skip
    assert steps and steps[-1][0] == "50", f"experts.py: printed steps {[s[0] for s in steps]}"
    assert float(steps[-1][1]) < 0.5 < float(steps[0][1]), (
        f"experts.py: loss {steps[0][1]} at step 1 and {steps[-1][1]} at 50; expected below 0.5"
    )
    assert all(len(s[2].split(",")) == 4 for s in steps), "experts.py: rows sent by 4 ranks"
