"""Grades lesson 15: the student's cost model (lessons/15_planning/plan.py) against the
program at scale.

The grader draws four hidden meshes of 64 to 1024 ranks from the grading seed, each with a
rank to count (tests/lessons/cases/lesson_15_models.py): stages of unequal depth,
vocabularies that do not split evenly (padded shards; ranks with fewer rows, or none),
GPipe and 1F1B. One child (tests/lessons/cases/lesson_15_scale.py, no submission in it)
joins a fake world of that size as that rank, builds lesson 14's composition, steps it
once and counts the bytes held and moved. Another child (tests/lessons/cases/lesson_15.py)
asks the submission for the same numbers. Bytes must be equal: both sides count whole
float32 elements, and the counts were equal for every seed tried (tests/course/grader/
test_scale.py holds four). The step time and the three questions are compared with the
grader's own model (the page's α-β model, written apart) on hidden machines, within RELATIVE.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from course import launch, registry
from course.grader.case_runs import run_lesson_cases

LESSON = registry.get("15")
CASES = Path(__file__).with_name("cases") / "lesson_15.py"
SCALE = CASES.with_name("lesson_15_scale.py")
sys.path.insert(0, str(CASES.parent))
import lesson_15_models as m  # noqa: E402

sys.path.remove(str(CASES.parent))

RELATIVE = 1e-9  # for sums in another order; the reference's gap was 0.0 over seeds 0-199
COUNT_SECONDS = 60  # the four counted ranks take 3-6 s on two cores
_cases: dict = {}
_counted: list = []


def hidden() -> dict:
    """The seed's hidden numbers, as the case child reads them (numbers only: the child
    imports none of the grader's model, so neither can the submission in it)."""
    q = m.questions()
    return {
        "counted": [[c.__dict__, *m.placed(c, rank)] for c, rank in m.counted_configs()],
        "timed": [[c.__dict__, hw] for c, hw in m.timed_configs()],
        "questions": {"pipelines": q["pipelines"],
                      "bound": [[c.__dict__, hw] for c, hw in q["bound"]],
                      "tp": [[c.__dict__, hw] for c, hw in q["tp"]],
                      "bound_most": [q["bound_most"][0].__dict__, *q["bound_most"][1:]]},
    }  # fmt: skip


def _case(impl, tmp_path_factory, name: str):
    key = str(impl)
    if key not in _cases:
        folder = tmp_path_factory.mktemp("plan")
        (folder / "hidden.json").write_text(json.dumps(hidden()))
        _cases[key] = run_lesson_cases(impl, LESSON, CASES, folder)
    return _cases[key](name)


def _program(tmp_path_factory) -> list[dict]:
    """What the program held and moved, counted at scale (once a session)."""
    if not _counted:
        out = tmp_path_factory.mktemp("scale") / "counted.json"
        run = launch.python(SCALE, out, timeout=COUNT_SECONDS, cwd=out.parent)
        assert run.ok and out.exists(), "the grader's count at scale failed\n" + run.failure()
        _counted.extend(json.loads(out.read_text()))
    return _counted


def _where(item) -> str:
    c = item["config"]
    return (f"rank {item['rank']} of (pp {c['pp']}, dp {c['dp']}, tp {c['tp']}), stage "
            f"{item['stage']}, {c['depth']} blocks, dim {c['dim']}, vocab {c['vocab']}, "
            f"{c['micro_batches']} micro-batches, {c['schedule']}")  # fmt: skip


def _config(item):
    return m.Config(**item["config"])


# --- part 1: bytes, against the program at 64-1024 ranks --------------------------------


@pytest.mark.core
@pytest.mark.points(3)
def test_held_bytes_equal_the_programs(impl, tmp_path_factory):
    """held() for four hidden ranks of 64-1024: parameters, gradients and AdamW state,
    each equal to the bytes the program at that scale holds, padding and short shards
    included."""
    said = _case(impl, tmp_path_factory, "bytes")
    for item, got in zip(_program(tmp_path_factory), said, strict=True):
        c = _config(item)
        stage, dp_rank = m.placed(c, item["rank"])
        for term in ("params", "grads", "optimizer"):
            want, seen = item["held"][term], got["held"].get(term)
            if seen == want:
                continue
            cause = ""
            shapes = [s for unit in m.stage_tensors(c, stage).values() for s in unit]
            even = sum(math.prod(s) for s in shapes) * m.F32 // c.dp
            padded = sum(-(-s[0] // c.dp) * math.prod(s[1:]) for s in shapes) * m.F32
            scale = 2 if term == "optimizer" else 1
            if seen == scale * even:
                cause = (" Likely cause: the stage's bytes divided evenly by dp; FSDP pads "
                         "each tensor's rows to ceil(n / dp) a rank.")  # fmt: skip
            elif seen == scale * padded:
                cause = (f" Likely cause: a full padded shard on dp rank {dp_rank}; the last "
                         "ranks hold fewer rows, or none.")  # fmt: skip
            raise AssertionError(
                f"{term}: expected {want:,} bytes (counted), got {seen} at {_where(item)}." + cause
            )


@pytest.mark.points(3)
def test_activations_equal_the_programs(impl, tmp_path_factory):
    """activations() for the same ranks: equal to the bytes the blocks keep at the step's
    high-water mark, counted by the memory meter, with GPipe or 1F1B in flight."""
    said = _case(impl, tmp_path_factory, "bytes")
    for item, got in zip(_program(tmp_path_factory), said, strict=True):
        c = _config(item)
        want, seen = item["held"]["activations"], got["activations"]
        if seen == want:
            continue
        one = m.activations(
            m.Config(**{**item["config"], "micro_batches": 1, "batch": c.batch // c.micro_batches}),
            item["stage"],
        )
        cause = ""
        if one and isinstance(seen, int) and seen % one == 0:
            held = seen // one
            cause = (f" Likely cause: {held} micro-batch(es) in flight; the counted step "
                     f"held {want // one} at its high-water mark.")  # fmt: skip
        raise AssertionError(
            f"activations: expected {want:,} bytes (counted), got {seen} at {_where(item)}." + cause
        )


@pytest.mark.core
@pytest.mark.points(3)
def test_traffic_equals_the_programs(impl, tmp_path_factory):
    """traffic() for the same ranks: each axis's bytes by kind equal to what the
    recorder saw in one step, no kind missing and none extra."""
    said = _case(impl, tmp_path_factory, "bytes")
    for item, got in zip(_program(tmp_path_factory), said, strict=True):
        want, seen = item["traffic"], got["traffic"]
        if seen == want:
            continue
        off = sorted(k for k in set(want) | set(seen) if want.get(k) != seen.get(k))
        lines = [f"  {k}: expected {want.get(k, 0):,}, got {seen.get(k, 0):,}" for k in off]
        cause = ""
        if seen.get("dp.all_gather") == want.get("dp.reduce_scatter") != want.get("dp.all_gather"):
            cause = ("\nLikely cause: all-gather counted as the reduce-scatter is: a "
                     "gather sends the rank's shard, a reduce-scatter takes the whole unit "
                     "in.")  # fmt: skip
        raise AssertionError(
            f"bytes moved in one step at {_where(item)}, by axis.kind:\n" + "\n".join(lines) + cause
        )


# --- part 2: the step time and the questions, against the grader's model ----------------


# What each term of the page's model is made of: where a wrong term's mistake hides.
TERM_CAUSES = {
    "compute": "compute is 6 x the stage's matmul weights (each block's up and down, split "
    "over tp, and the head on the last stage) x this dp rank's tokens, over flops x "
    "efficiency; check which stage you report (the busiest), the tp split and the tokens",
    "tp": "tp is the all-reduces' bytes x 2(n - 1)/n over the link the tp ranks span, plus "
    "a latency per call (2 a block a micro-batch)",
    "pp": "pp is the bytes sent over the link the whole world spans, plus a latency per "
    "message (one a micro-batch to each neighbour: a middle stage has two)",
    "dp": "dp is (n - 1) x what the all-gathers send plus (n - 1)/n x the reduce-scatters' "
    "input, over the link dp x tp ranks span, plus a latency per call (2 a unit)",
    "exposed": "exposed is dp minus compute where dp is larger, else 0",
    "bubble": "the bubble is the busiest stage's busy time (compute + tp + pp) x (pp - 1)/m",
    "total": "the total is the busiest stage's busy time plus its bubble plus exposed dp",
}


@pytest.mark.points(3)
def test_step_time_follows_the_pages_model(impl, tmp_path_factory):
    """step_time() for large hidden models on hidden machines (among them dp = 1, a middle
    stage setting the pace, the end stages within a latency term): every term equal to the
    grader's own model of the page, within RELATIVE; and traffic() of each of their stages
    the grader's."""
    said = _case(impl, tmp_path_factory, "times")
    for (c, hw), found in zip(m.timed_configs(), said, strict=True):
        shape = f"(pp {c.pp}, dp {c.dp}, tp {c.tp})"
        for stage, seen in enumerate(found["traffic"]):
            expected = m.traffic(c, stage)
            assert seen == expected, (
                f"traffic() of stage {stage} of {shape}: {seen}; expected {expected}, the "
                "bytes step_time is built on. "
                + (
                    "Likely cause: an axis of size 1 moving bytes (it has no one to talk to)"
                    if {k.split(".")[0] for k in set(seen) - set(expected)}
                    else ""
                )
            )
        got, want = found["time"], m.step_time(c, hw)
        for term in ("compute", "tp", "pp", "dp", "exposed", "bubble", "total"):
            seen = got.get(term)
            assert seen is not None, f"step_time returned no {term!r} (it gave {sorted(got)})"
            assert math.isclose(seen, want[term], rel_tol=RELATIVE, abs_tol=1e-15), (
                f"step time's {term!r}: expected {want[term]:.6g} s, got {seen:.6g} s, for "
                f"(pp {c.pp}, dp {c.dp}, tp {c.tp}), {c.micro_batches} micro-batches, dim "
                f"{c.dim}, {c.depth} blocks, {hw['gpus_per_node']} GPUs a node; the busiest "
                f"stage is stage {m.busiest(c, hw)} of {c.pp} (expected terms: "
                + ", ".join(f"{k} {v:.4g}" for k, v in want.items())
                + "). "
                + TERM_CAUSES[term]
            )


@pytest.mark.points(3)
def test_the_questions_are_answered_by_the_model(impl, tmp_path_factory):
    """micro_batches_for, communication_bound and best_tp on hidden numbers: the grader's
    answers. Among them at every seed: one stage, a target one micro-batch meets, a search
    limit equal to its answer, all the ranks as the best tp, a fastest shape whose batch
    does not split, a tie between every tp (the smaller wins), and a 10 % bubble."""
    got, q = _case(impl, tmp_path_factory, "questions"), m.questions()
    want = [m.micro_batches_for(pp, t) for pp, t in q["pipelines"]]
    assert got["pipelines"] == want, (
        f"micro_batches_for{[tuple(p) for p in q['pipelines']]}: expected {want}, got "
        f"{got['pipelines']} (the bubble's share of a step is (pp - 1) / (m + pp - 1))"
    )
    bound = [m.communication_bound(*question) for question in q["bound"]]
    assert got["bound"] == bound, (
        f"communication_bound on three hidden models: expected dp {bound}, got {got['bound']} "
        "(the first power of two whose data-parallel traffic is not hidden by compute, "
        "each rank keeping its share of the batch)"
    )
    c, hw, most = q["bound_most"]
    assert got["bound_most"] == most, (
        f"communication_bound(..., most={most}) on a hidden model whose answer is dp {most}: "
        f"got {got['bound_most']}; the search tries every power of two up to `most`, "
        "that one included"
    )
    best = [m.best_tp(*question) for question in q["tp"]]
    assert got["tp"] == best, (
        f"best_tp on {len(best)} hidden models: expected tp {best}, got {got['tp']} (the "
        "ranks kept: dp shrinks as tp grows; the last, where every tp takes the same time, "
        "the smaller tp on a tie)"
    )
