"""course/grader/scale.py: one rank of a fake world of 64 to 1024, counted, against the
grader's own cost model (tests/lessons/cases/lesson_15_models.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from course.grader.scale import Config, count, fake_world

CASES = Path(__file__).parents[2] / "lessons" / "cases"
sys.path.insert(0, str(CASES))
import lesson_15_models as m  # noqa: E402

sys.path.remove(str(CASES))

CONFIGS = [  # (config, the rank counted): uneven stages, padded shards, 1024 ranks
    (Config(pp=4, dp=64, tp=4, depth=7, dim=96, vocab=500, seq=32, micro_batches=4,
            batch=1024), 1000),
    (Config(pp=2, dp=32, tp=1, depth=5, dim=40, vocab=333, seq=8, micro_batches=2,
            batch=128), 61),
    (Config(pp=1, dp=64, tp=2, depth=3, dim=48, vocab=100, seq=8, batch=256), 127),
    (Config(pp=3, dp=16, tp=2, depth=7, dim=64, vocab=1000, seq=16, micro_batches=3,
            batch=96, schedule="gpipe", hidden=96), 70),
]  # fmt: skip


@pytest.mark.parametrize(("config", "rank"), CONFIGS)
def test_counted_bytes_equal_the_graders_model(config, rank):
    with fake_world(config.world, rank):
        found = count(config)
    stage, dp_rank = found["stage"], (rank // config.tp) % config.dp
    assert stage == rank // (config.dp * config.tp)
    want = m.held(config, stage, dp_rank) | {"activations": m.activations(config, stage)}
    assert found["held"] == want
    assert found["traffic"] == m.traffic(config, stage)
