"""Grades lesson 14: pipeline, fully sharded data and tensor parallelism composed on one
device mesh (lessons/14_composing/compose.py).

The case script (tests/lessons/cases/lesson_14.py) builds the grader's model with the
submission's make_mesh, stage_of, parallelize and pipeline on 8 forked gloo ranks, and
trains it with the grader's own loop on the grader's batches:
  composed  mesh (pp 2, dp 2, tp 2), 2 steps, every collective recorded with its group;
  shapes    the 1-D FSDP control (dp 8), (dp 2, tp 4), (dp 4, tp 2) and (pp 2, dp 2, tp 2),
            4 steps each; a checkpoint saved by the last at step 2, resumed on
            (dp 4, tp 2) and in one process.
This process trains the whole model on the whole batch in one process (the reference,
tests/lessons/cases/lesson_14_models.py) and compares.

EXACT and CURVE are measured over seeds 0-11 by `python -m course tolerances 14`.
"""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch

from course import registry
from course.grader.case_runs import run_lesson_cases
from course.grader.tolerances import seed, tolerance
from course.measure.draws import draw

LESSON = registry.get("14")
CASES = Path(__file__).with_name("cases") / "lesson_14.py"
sys.path.insert(0, str(CASES.parent))
import lesson_14_models as m  # noqa: E402

sys.path.remove(str(CASES.parent))

SEED = seed(7)  # the case script's
EXACT = tolerance(
    "14.exact", high=1e-5, test="test_step_one_equals_one_process_on_the_whole_batch",
    what="largest difference of step 1's loss or any gradient (gathered whole) on mesh "
    "(pp 2, dp 2, tp 2) from one process on the whole batch",
)  # fmt: skip
CURVE = tolerance(
    "14.curve", high=1e-5,
    test="test_every_shape_follows_the_1d_fsdp_control "
    "test_a_checkpoint_of_one_shape_resumes_on_another test_one_process_resumes_it_too",
    what="largest difference of any step's loss, over 4 steps, between a mesh's run (or a "
    "resumed one) and the 1-D FSDP control's",
)  # fmt: skip
LEARNED = tolerance(
    "14.learned", high=0.2, test="test_the_script_trains_and_refuses_bad_meshes",
    what="compose.py's loss after 30 steps on (pp 2, dp 1, tp 2) (ln 64 = 4.16 at the start)",
)  # fmt: skip
AXES = ("pp", "dp", "tp")
AXIS_OF = {"all_gather": "dp", "reduce_scatter": "dp", "all_reduce": "tp", "send": "pp",
           "recv": "pp"}  # fmt: skip
_cases: dict = {}


def _case(impl, tmp_path_factory, name: str):
    key = (str(impl), name)
    if key not in _cases:
        folder = tmp_path_factory.mktemp(name)
        _cases[key] = run_lesson_cases(impl, LESSON, CASES, folder, only=[name])
    cases = _cases[key]
    tensorless = ("layout", "one_gpu")
    return cases(name), ({} if name in tensorless else cases.tensors(name))


def _ranks(found) -> dict[int, dict]:
    return {int(k): v for k, v in found.items() if k.isdigit()}


def _reference():
    return m.one_process(SEED, m.STEPS)


def _gap(got, want) -> float:
    return (got.double() - want.double()).abs().max().item()


# --- the mesh and the stages --------------------------------------------------------


@pytest.mark.core
@pytest.mark.points(2)
def test_the_mesh_groups_are_the_ones_the_page_draws(impl, tmp_path_factory):
    """make_mesh on 8 ranks as (pp 2, dp 2, tp 2): each rank's tp group is its neighbour
    pair (0-1, 2-3...), its dp group the ranks 2 apart, its pp group the ranks 4 apart."""
    found, _ = _case(impl, tmp_path_factory, "layout")
    for rank, seen in _ranks(found).items():
        want = m.groups(m.COMPOSED, rank)
        for axis in AXES:
            assert sorted(seen["groups"][axis]) == want[axis], (
                f"rank {rank}: its {axis} group is {seen['groups'][axis]}; the page's mesh "
                f"puts it in {want[axis]} (ranks numbered along tp fastest, then dp, then "
                "pp). Likely cause: the mesh's axes in another order than (pp, dp, tp)"
            )


@pytest.mark.core
@pytest.mark.points(2)
def test_each_stage_holds_an_even_cut(impl, tmp_path_factory):
    """stage_of on 4 blocks and 2 stages: stage 0 holds blocks 0-1 and the embedding,
    stage 1 blocks 2-3, the norm and the head (each checked)."""
    found, _ = _case(impl, tmp_path_factory, "layout")
    for rank, seen in _ranks(found).items():
        stage = seen["stage"]
        want = m.blocks_of(stage, 2)
        assert seen["blocks"] == want, (
            f"rank {rank}, stage {stage}: holds blocks {seen['blocks']}, expected {want} "
            "(4 blocks, the same number on each of 2 stages)"
        )
        assert seen["norm"] == (stage == 1), (
            f"rank {rank}, stage {stage}: the final norm {'kept' if seen['norm'] else 'gone'}; "
            "expected it on the last stage only (it runs just before the head). Likely "
            "cause: only the head set to None on the other stages"
        )
        assert (seen["embed"], seen["head"]) == (stage == 0, stage == 1), (
            f"rank {rank}, stage {stage}: embedding {'kept' if seen['embed'] else 'gone'}, "
            f"head {'kept' if seen['head'] else 'gone'}; expected the embedding on the first "
            "stage only, the norm and head on the last only"
        )


@pytest.mark.core
@pytest.mark.points(3)
def test_step_one_equals_one_process_on_the_whole_batch(impl, tmp_path_factory):
    """Step 1 on (pp 2, dp 2, tp 2) with 4 or 8 micro-batches (drawn): the loss (the mean
    over the last stage's data-parallel ranks) and every gradient, gathered whole, equal
    one process's on the whole batch within EXACT; the stages' parameters are named as in
    the whole model, and together they are the whole model's, once."""
    found, tensors = _case(impl, tmp_path_factory, "composed")
    losses, grads, _, _ = _reference()
    names = sorted(k.split("/", 2)[2] for k in tensors)
    whole = sorted(grads)
    assert names == whole, (
        f"the stages' parameters are named {names[:6]}...; expected the whole model's "
        f"{whole[:6]}..., each on one stage. Likely cause: the stage rebuilt in a new "
        "container (an nn.Sequential) rather than cut in place"
    )
    last = [s["losses"][0] for s in _ranks(found).values() if s["stage"] == 1]
    assert len(last) == 4 and None not in last, f"the last stage's losses: {last}"
    got = sum(last) / len(last)
    EXACT.note(abs(got - losses[0]))
    assert abs(got - losses[0]) <= EXACT.high, (
        f"step 1's loss is {got:.6f}, one process's {losses[0]:.6f}"
    )
    for key, grad in sorted(tensors.items()):
        name = key.split("/", 2)[2]
        want = grads[name]
        assert tuple(grad.shape) == tuple(want.shape), f"{name}: gradient shape {grad.shape}"
        gap = _gap(grad, want)
        EXACT.note(gap)
        assert gap <= EXACT.high, (
            f"{name}'s gradient is {gap:.2e} from one process's on the whole batch (allowed "
            f"{EXACT.high:g}), {grad.norm() / want.norm():.3f} times its size. Likely "
            "causes: gradients averaged over the wrong group, or a layer split on the "
            "wrong axis"
        )


# --- the collectives, by axis -------------------------------------------------------


def _step(seen: dict, step: str) -> list[dict]:
    return [r for r in seen["records"] if r["phase"] == step]


@pytest.mark.points(2)
def test_each_collective_runs_on_its_axis(impl, tmp_path_factory):
    """Steps 1 and 2 on (pp 2, dp 2, tp 2), every rank: all-gathers and reduce-scatters
    (FSDP's) on its dp group, all-reduces (TP's activations) on its tp group, sends and
    receives on its pp group, to and from the other stage, and nothing else; every one of
    them runs in step 2, all in float32."""
    found, _ = _case(impl, tmp_path_factory, "composed")
    for rank, seen in _ranks(found).items():
        want = m.groups(m.COMPOSED, rank)
        for record in seen["records"]:
            axis = AXIS_OF.get(record["op"])
            assert axis is not None, f"rank {rank}: a {record['op']} in step {record['phase']}"
            assert sorted(record["group"]) == want[axis], (
                f"rank {rank}, step {record['phase']}: a {record['op']} of "
                f"{record['bytes']} bytes ran on ranks {record['group']}; expected its "
                f"{axis} group {want[axis]}"
            )
            if axis == "pp":
                assert record["peer"] in want["pp"] and record["peer"] != rank, record
        kinds = Counter(r["op"] for r in _step(seen, "2"))
        missing = sorted(set(AXIS_OF) - set(kinds))
        assert not missing, f"rank {rank}: no {missing} in step 2 (saw {dict(kinds)})"
        types = {t for r in _step(seen, "2") for t in r["dtypes"]}
        assert types == {"torch.float32"}, f"rank {rank}: step 2 sent {sorted(types)}"


def _units(stage: int, tp: int, pp: int = 2) -> dict[str, tuple[int, int]]:
    """The FSDP units of stage `stage` of `pp`, each block and the root (what no block
    claims): {unit: (bytes of its parameters on one tp rank, how many tensors)}."""
    model = m.whole(SEED)
    blocks = m.blocks_of(stage, pp)
    root = ({"embed."} if stage == 0 else set()) | (
        {"norm.", "head."} if stage == pp - 1 else set()
    )
    units: dict[str, tuple[int, int]] = {}
    for name, p in model.named_parameters():
        if name.startswith("blocks.") and int(name.split(".")[1]) in blocks:
            unit = ".".join(name.split(".")[:2])
        elif any(name.startswith(k) for k in root):
            unit = "root"
        else:
            continue
        split = name.endswith(("up.weight", "up.bias", "down.weight"))
        size, count = units.get(unit, (0, 0))
        units[unit] = (size + p.nbytes // (tp if split else 1), count + 1)
    return units


def _stage_bytes(stage: int, tp: int, pp: int = 2) -> tuple[int, int]:
    """(bytes of the stage's parameters on one tp rank, how many FSDP-sharded tensors)."""
    units = _units(stage, tp, pp).values()
    return sum(size for size, _ in units), sum(count for _, count in units)


@pytest.mark.points(2)
def test_each_collective_moves_what_its_axis_owes(impl, tmp_path_factory):
    """Step 2 on (pp 2, dp 2, tp 2), every rank, against the grader's count: tp 2 blocks x
    m micro-batches x 2 all-reduces (forward and backward) of one micro-batch's
    activation; pp m sends and m receives of one; dp reduce-scatters of its stage's
    tp-local gradients, whole, once; all-gathers of at least its shard, at most 2m
    times, each receiving 2 x what it sends and none more than one FSDP unit (a block, or
    the root's leftovers)."""
    found, _ = _case(impl, tmp_path_factory, "composed")
    micro = found["micro_batches"]
    activation = m.BATCH // 2 // micro * 16 * m.DIM * 4  # (rows, 16 tokens, dim) float32
    for rank, seen in _ranks(found).items():
        records = _step(seen, "2")
        by = defaultdict(list)
        for record in records:
            by[record["op"]].append(record)
        reduce = [r["bytes"] for r in by["all_reduce"]]
        assert reduce == [activation] * (2 * 2 * micro), (
            f"rank {rank}: step 2's all-reduces sent {reduce} bytes; expected "
            f"{2 * 2 * micro} of {activation} (2 blocks x {micro} micro-batches, forward "
            "and backward, one micro-batch's activation each)"
        )
        for op in ("send", "recv"):
            sizes = [r["bytes"] or r["received"] for r in by[op]]
            assert sizes == [activation] * micro, (
                f"rank {rank}: step 2's {op}s moved {sizes} bytes; expected {micro} of "
                f"{activation} (one activation or its gradient per micro-batch)"
            )
        tp_local, tensors = _stage_bytes(seen["stage"], 2)
        scattered = sum(r["bytes"] for r in by["reduce_scatter"])
        assert tp_local <= scattered <= tp_local + 4 * 2 * tensors, (
            f"rank {rank}: step 2's reduce-scatters sent {scattered} bytes; its stage's "
            f"gradients on one tp rank are {tp_local} (plus padding to a multiple of dp 2, "
            f"at most {4 * 2 * tensors}). Likely causes: gradients reduced once per micro-"
            "batch, or over the wrong group"
        )
        shard = seen["local_bytes"]
        gathered = sum(r["bytes"] for r in by["all_gather"])
        assert shard <= gathered <= 2 * micro * shard, (
            f"rank {rank}: step 2's all-gathers sent {gathered} bytes; its shard is {shard}: "
            f"expected between one gather of it and {2 * micro} (one per micro-batch, "
            "forward and backward)"
        )
        assert all(r["received"] == 2 * r["bytes"] for r in by["all_gather"]), (
            f"rank {rank}: an all-gather received other than 2 x what it sent (dp is 2)"
        )
        units = _units(seen["stage"], 2)
        biggest, tensors = max(units.values())
        largest = max((r["received"] for r in by["all_gather"]), default=0)
        assert largest <= biggest + 4 * 2 * tensors, (
            f"rank {rank}: step 2's largest all-gather received {largest} bytes; its stage's "
            f"largest FSDP unit (a block, or the root's leftovers) holds {biggest} on one tp "
            f"rank, units {dict((k, v[0]) for k, v in units.items())}. Likely cause: the "
            "whole stage sharded as one unit (fully_shard on the root only), so all its "
            "weights are gathered at once and held through backward"
        )


# --- shapes, and a checkpoint resumed on another -------------------------------------


def _composes(found) -> None:
    """Every shape of the shapes case, and the resumed one, used each of its axes: on each
    stage and tp rank, the dp ranks' local parts add up to the stage's parameters on one tp
    rank, once. Without the pipeline a rank holds every stage; without tensor parallelism
    the whole MLP weights; with replicas (DDP) instead of FSDP, dp copies."""
    shapes = {",".join(map(str, s)): s for s in m.SHAPES} | {"resumed": m.RESUMED}
    for name, (pp, dp, tp) in shapes.items():
        sums: dict[tuple[int, int], int] = defaultdict(int)
        for seen in _ranks(found).values():
            held = seen["held"][name]
            sums[held["stage"], held["tp_rank"]] += held["local_bytes"]
        want = {
            (stage, t): _stage_bytes(stage, tp, pp)[0] for stage in range(pp) for t in range(tp)
        }
        what = "resumed on " if name == "resumed" else ""
        assert dict(sums) == want, (
            f"{what}mesh (pp {pp}, dp {dp}, tp {tp}): the bytes of the local parameters, "
            f"added over each (stage, tp rank)'s {dp} dp rank(s), are {dict(sums)}; expected "
            f"{want}: each stage's parameters, the MLP's split in {tp}, sharded once over dp. "
            "Likely causes: an axis skipped (no stage cut, no tensor parallelism, or whole "
            "replicas instead of FSDP2's shards), so the curves below do not show the "
            "composition"
        )


def _curve(found, name: str) -> list[float]:
    """A run's losses, each step's the mean over its last stage's dp ranks."""
    pp, dp, tp = (int(x) for x in name.split(",")) if name != "resumed" else m.RESUMED
    rows = [seen[name] for seen in _ranks(found).values()]
    steps = []
    for step in range(len(rows[0])):
        values = [row[step] for row in rows if row[step] is not None]
        assert len(values) == dp * tp, f"mesh {name}: {len(values)} ranks reported step {step + 1}"
        steps.append(sum(values) / len(values))
    return steps


def _follows(got: list[float], want: list[float], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} steps, expected {len(want)}"
    gap = max(abs(a - b) for a, b in zip(got, want, strict=True))
    CURVE.note(gap)
    assert gap <= CURVE.high, (
        f"{what}: losses {[round(x, 5) for x in got]}, the control's "
        f"{[round(x, 5) for x in want]}: {gap:.2e} apart (allowed {CURVE.high:g})"
    )


@pytest.mark.points(3)
def test_every_shape_follows_the_1d_fsdp_control(impl, tmp_path_factory):
    """The same seed and global batch, 4 steps: the 1-D FSDP control (dp 8) follows one
    process, and (dp 2, tp 4), (dp 4, tp 2) and (pp 2, dp 2, tp 2) follow the control,
    each step within CURVE; the control learns. Every shape holds what its axes make it
    hold (_composes): a shape that skips an axis does not count as one."""
    found, _ = _case(impl, tmp_path_factory, "shapes")
    _composes(found)
    reference = _reference()[0]
    control = _curve(found, "1,8,1")
    _follows(control, reference, "the 1-D FSDP control (dp 8) against one process")
    assert control[-1] < control[0] - 1.0, f"the control did not learn: {control}"
    for shape in m.SHAPES[1:]:
        pp, dp, tp = shape
        _follows(_curve(found, ",".join(map(str, shape))), control,
                 f"mesh (pp {pp}, dp {dp}, tp {tp})")  # fmt: skip


def _same_state(tensors, prefix: str, what: str) -> None:
    saved = {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith("saved/")}
    names = sorted(n.split("/", 1)[1] for n in saved if n.startswith("param/"))
    assert names == sorted(n for n, _ in m.whole(SEED).named_parameters()), (
        f"the saved stages hold {names[:5]}..., not the whole model"
    )
    for key, want in sorted(saved.items()):
        got = tensors.get(f"{prefix}/{key}")
        assert got is not None and torch.equal(got, want), (
            f"{what}: {key} differs from what (pp 2, dp 2, tp 2) saved at step {m.SAVED_AT}"
            f"{'' if got is None else f' by {_gap(got, want):.2e}'}"
        )


@pytest.mark.points(2)
def test_a_checkpoint_of_one_shape_resumes_on_another(impl, tmp_path_factory):
    """A checkpoint (torch.distributed.checkpoint) of (pp 2, dp 2, tp 2) at step 2, loaded
    on (dp 4, tp 2): every weight and AdamW first moment, gathered whole, equals the saved
    one exactly, and steps 3-4 follow the control within CURVE."""
    found, tensors = _case(impl, tmp_path_factory, "shapes")
    _composes(found)
    _same_state(tensors, "loaded", "loaded on (dp 4, tp 2)")
    control = _curve(found, "1,8,1")
    _follows(_curve(found, "resumed"), control[m.SAVED_AT :], "resumed on (dp 4, tp 2)")


@pytest.mark.points(1)
def test_one_process_resumes_it_too(impl, tmp_path_factory):
    """The same checkpoint loaded into the whole model in one process, no process group:
    weights and first moments equal the saved ones, and steps 3-4 follow the control."""
    found, tensors = _case(impl, tmp_path_factory, "shapes")
    _composes(found)
    _same_state(tensors, "single", "loaded in one process")
    control = _curve(found, "1,8,1")
    _follows(found["single"], control[m.SAVED_AT :], "resumed in one process")


# CUDA against the CPU in float32 (TF32 off), the same 4 steps: rounding in other kernels,
# which AdamW's normalised steps carry along.
CUDA_CURVE = 1e-4


@pytest.mark.points(1)
@pytest.mark.gpus(1)
def test_one_gpu_runs_the_one_rank_mesh(impl, tmp_path_factory):
    """make_mesh, stage_of, parallelize on one GPU as the mesh (pp 1, dp 1, tp 1), nccl, 4
    steps: the parameters on the GPU, and the losses of one process on the CPU (within
    CUDA_CURVE)."""
    found, _ = _case(impl, tmp_path_factory, "one_gpu")
    seen = found["0"]
    assert seen["devices"] == ["cuda"], f"the parameters are on {seen['devices']}, not the GPU"
    want = _reference()[0]
    gap = max(abs(a - b) for a, b in zip(seen["losses"], want, strict=True))
    assert gap <= CUDA_CURVE, (
        f"on one GPU the losses are {[round(x, 5) for x in seen['losses']]}, one process on "
        f"the CPU {[round(x, 5) for x in want]}: {gap:.2e} apart (allowed {CUDA_CURVE:g})"
    )


# --- the script ----------------------------------------------------------------------

_runs: dict = {}
STEP = re.compile(r"step (\d+)/30: loss ([\d.]+)")
RESUME_TO = 32  # the resumed run's --steps: two more than the saved 30


@pytest.fixture
def runs(impl, tmp_path_factory, launcher):
    """compose.py on 4 ranks (pp 2, dp 1, tp 2) saving a checkpoint, and two meshes it must
    refuse, at once; then the checkpoint resumed on (pp 1, dp 2, tp 2) for RESUME_TO."""
    if str(impl) not in _runs:
        script = str(LESSON.path(impl))
        jobs, drawn = {}, str(draw("14.script_seed", range(4)) + seed(0))
        ckpt = tmp_path_factory.mktemp("ckpt") / "ckpt"
        for name, flags in (
            ("train", ["--pp", "2", "--dp", "1", "--tp", "2", "--steps", "30", "--seed", drawn,
                       "--log-every", "4", "--checkpoint", str(ckpt)]),
            ("product", ["--pp", "2", "--dp", "2", "--tp", "2", "--nproc", "4"]),
            ("depth", ["--pp", "3", "--dp", "1", "--tp", "1", "--depth", "4"]),
        ):  # fmt: skip
            folder = tmp_path_factory.mktemp(name)
            jobs[name] = dict(args=[sys.executable, script, "--backend", "gloo", *flags],
                              timeout=120, cwd=folder)  # fmt: skip
        results = launcher.run_all(jobs)
        if results["train"].ok:
            flags = ["--pp", "1", "--dp", "2", "--tp", "2", "--steps", str(RESUME_TO),
                     "--seed", drawn, "--checkpoint", str(ckpt)]  # fmt: skip
            resume = dict(args=[sys.executable, script, "--backend", "gloo", *flags],
                          timeout=120, cwd=ckpt.parent)  # fmt: skip
            results |= launcher.run_all({"resume": resume})
        _runs[str(impl)] = results
    return _runs[str(impl)]


@pytest.mark.points(2)
def test_the_script_trains_and_refuses_bad_meshes(runs):
    """compose.py --pp 2 --dp 1 --tp 2, 30 steps at a drawn seed, a line every 4: the loss
    falls from ln 64 below LEARNED. Its checkpoint, resumed by compose.py on (pp 1, dp 2,
    tp 2), goes on from step 30's loss.
    A mesh whose product is not --nproc, and blocks that do not split into the stages,
    are refused in one line each, before any rank starts."""
    result = runs["train"]
    if not result.ok:
        pytest.fail(f"{' '.join(result.args[1:])}: {result.failure()}", pytrace=False)
    steps = STEP.findall(result.output)
    printed = [int(s[0]) for s in steps]
    assert printed == [1, *range(4, 30, 4), 30], (
        f"compose.py --log-every 4 --steps 30 printed steps {printed}; expected 1, every "
        "4th, and 30"
    )
    LEARNED.note(float(steps[-1][1]))
    assert float(steps[-1][1]) <= LEARNED.high < float(steps[0][1]), (
        f"compose.py: loss {steps[0][1]} at step 1 and {steps[-1][1]} at 30; expected below "
        f"{LEARNED.high}"
    )
    resumed = runs.get("resume")
    if resumed is None or not resumed.ok:
        pytest.fail(
            "compose.py --pp 1 --dp 2 --tp 2 --checkpoint (the run's, saved at step 30): "
            + (resumed.failure() if resumed else "not run, the training run failed"),
            pytrace=False,
        )
    after = {int(s): float(v) for s, v in re.findall(r"step (\d+)/\d+: loss ([\d.]+)",
                                                     resumed.output)}  # fmt: skip
    first, last = float(steps[0][1]), float(steps[-1][1])
    near = last + (first - last) / 4
    assert (
        "(step 30)" in resumed.output and sorted(after) == [31, RESUME_TO] and (after[31] <= near)
    ), (
        f"compose.py saved at step 30 on (pp 2, dp 1, tp 2) (loss {last}), then resumed on "
        f"(pp 1, dp 2, tp 2) --steps {RESUME_TO}: expected 'resumed from ... (step 30)', "
        f"steps 31 and {RESUME_TO}, and step 31's loss near step 30's (at most {near:.3f}; "
        f"a fresh start is {first}); it printed steps {after}:\n{resumed.output[-800:]}"
    )
    for name, words in (("product", "--nproc"), ("depth", "--pp")):
        bad = runs[name]
        lines = [line for line in bad.output.strip().splitlines() if line.strip()]
        assert (
            bad.returncode not in (0, None)
            and len(lines) == 1
            and "Traceback" not in bad.output
            and words in bad.output
            and "ranks as mesh" not in bad.output
        ), (
            f"{' '.join(bad.args[2:])}: exit {bad.returncode}, {bad.output[-400:]!r}; "
            f"expected a one-line error naming {words}, before any rank starts"
        )
