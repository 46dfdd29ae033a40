"""Seeds vary values, never coverage: at any grading seed, a lesson's hidden configurations
include every case family its mistakes need, so a wrong solution fails at every seed. Each
family is checked at 500 seeds, drawing only (no grading).

Lesson 12 (tests/lessons/cases/lesson_12_ring.py): the ring on 3 ranks or more, where
rank + 1 and rank - 1 are different neighbours.

Lesson 15 (tests/lessons/cases/lesson_15_models.py): both schedules, a middle stage, tp = 1
and a tp other than 2 (at tp = 2, 2(n - 1)/n = 1 hides a factor) among the counted ranks;
dp = 1, tp = 1, tp within and across a node, a middle stage setting the pace and the end
stages within a latency term among the timed models; a pipeline, a batch that does not
split over every dp (and would be fastest if it did), all the ranks as the best tp, one
stage, one micro-batch enough, and a bound search that ends at its answer in the questions.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

from course.measure import draws

CASES = Path(__file__).parents[2] / "lessons" / "cases"
sys.path.insert(0, str(CASES))
import lesson_12_models as m12  # noqa: E402
import lesson_15_models as m  # noqa: E402

sys.path.remove(str(CASES))

SEEDS = range(1, 501)


@functools.cache
def _families_15_at(seed: int) -> dict[str, bool]:
    os.environ[draws.SEED_ENV] = str(seed)
    try:
        return _families_15()
    finally:
        del os.environ[draws.SEED_ENV]


def _families_15() -> dict[str, bool]:
    counted = m.counted_configs()
    timed = m.timed_configs()
    q = m.questions()
    stages = [m.placed(c, rank)[0] for c, rank in counted]
    splits = [
        all(c.batch % (ranks // tp * c.micro_batches) == 0 for tp in (1, 2, 4, 8) if tp <= ranks)
        for c, _ in q["tp"]
        for ranks in [c.tp * c.dp]
    ]
    return {
        "counted: GPipe": any(c.schedule == "gpipe" and c.pp > 1 for c, _ in counted),
        "counted: 1F1B": any(c.schedule == "1f1b" and c.pp > 1 for c, _ in counted),
        "counted: a middle stage": any(
            0 < s < c.pp - 1 for (c, _), s in zip(counted, stages, strict=True)
        ),
        "counted: tp = 1": any(c.tp == 1 for c, _ in counted),
        "counted: a tp other than 1 and 2": any(c.tp > 2 for c, _ in counted),
        "timed: dp = 1": any(c.dp == 1 for c, _ in timed),
        "timed: tp = 1": any(c.tp == 1 for c, _ in timed),
        "timed: tp within a node": any(1 < c.tp <= hw["gpus_per_node"] for c, hw in timed),
        "timed: tp across nodes": any(c.tp > hw["gpus_per_node"] for c, hw in timed),
        "timed: both schedules": {c.schedule for c, _ in timed if c.pp > 1} == {"gpipe", "1f1b"},
        "timed: a middle stage sets the pace": any(
            0 < m.busiest(c, hw) < c.pp - 1 for c, hw in timed
        ),
        "timed: the end stages within a latency a micro-batch": any(
            c.pp > 1 and m._ends_nearly_tie((c, hw)) for c, hw in timed
        ),
        "questions: a pipeline": any(c.pp > 1 for c, _ in q["bound"] + q["tp"]),
        "questions: a batch that does not split": not all(splits),
        "questions: the fastest shape does not split the batch": any(
            m._unsplit_would_win(question) for question in q["tp"]
        ),
        "questions: all the ranks the best tp": any(
            m.best_tp(c, hw) == c.tp * c.dp for c, hw in q["tp"]
        ),
        "questions: one stage": any(pp == 1 for pp, _ in q["pipelines"]),
        "questions: one micro-batch enough for a pipeline": any(
            pp > 1 and m.micro_batches_for(pp, t) == 1 for pp, t in q["pipelines"]
        ),
        "questions: the bound search ends at its answer": q["bound_most"][2] is not None,
    }


@pytest.mark.parametrize("family", list(_families_15()))
def test_lesson_15_draws_every_family_at_every_seed(family):
    """Each seed's draws are made once (cached) and read by every family's test."""
    missing = [seed for seed in SEEDS if not _families_15_at(seed)[family]]
    assert not missing, (
        f"lesson 15's draws lack {family!r} at seeds {missing[:10]} (of {len(SEEDS)})"
    )


def test_lesson_12s_ring_has_two_different_neighbours_at_every_seed(monkeypatch):
    worlds = set()
    for seed in SEEDS:
        monkeypatch.setenv(draws.SEED_ENV, str(seed))
        worlds.add(draws.draw("12.ring_ranks", m12.RING_RANKS))  # as lesson_12_ring.py draws
    assert min(worlds) >= 3, f"lesson 12's ring drawn on {sorted(worlds)} ranks"
    assert len(worlds) > 1  # the seed still varies the value
