"""course/grader/scale.py: one rank of a fake world of 64 to 1024, counted, against the
reference's formulas (solutions/15_planning/plan.py, WIP)."""

from __future__ import annotations

import importlib.util

import pytest

from course import REPO_ROOT
from course.grader.scale import Config, count, fake_world

CONFIGS = [  # (config, the rank counted): uneven stages, padded shards, 1024 ranks
    (Config(pp=4, dp=64, tp=4, depth=7, dim=96, vocab=500, seq=32, micro_batches=4,
            batch=1024), 1000),
    (Config(pp=2, dp=32, tp=1, depth=5, dim=40, vocab=333, seq=8, micro_batches=2,
            batch=128), 61),
    (Config(pp=1, dp=64, tp=2, depth=3, dim=48, vocab=100, seq=8, batch=256), 127),
    (Config(pp=3, dp=16, tp=2, depth=7, dim=64, vocab=1000, seq=16, micro_batches=3,
            batch=96), 70),
]  # fmt: skip


def _plan():
    path = REPO_ROOT / "solutions" / "15_planning" / "plan.py"
    spec = importlib.util.spec_from_file_location("plan", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("config", "rank"), CONFIGS)
def test_counted_bytes_equal_the_formulas(config, rank):
    plan = _plan()
    with fake_world(config.world, rank):
        found = count(config)
    model = plan.Model(config.vocab, config.dim, config.depth, config.seq)
    par = plan.Parallel(config.pp, config.dp, config.tp, config.batch, config.micro_batches)
    dp_rank = (rank // config.tp) % config.dp
    want = plan.held(model, par, found["stage"], dp_rank)
    assert {k: found["held"][k] for k in want} == want
    assert found["traffic"] == plan.traffic(model, par, found["stage"])
