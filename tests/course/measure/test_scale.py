"""course/measure/scale.py: one rank of a fake world of 64 to 1024, counted, against the
grader's own cost model (tests/lessons/cases/lesson_15_models.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from course.measure.scale import Config, count, fake_world

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


# (config of CONFIGS, stage): a middle stage of 1F1B with tp 4, the last stage of a
# two-stage pipeline with tp 1, and GPipe's first stage with tp 2.
PEAKS = [(0, 1), (1, 1), (3, 0)]
# In a child: the grading process never imports a plan.py, not even the reference's.
_PEAK = """
import json, math, sys, warnings
warnings.filterwarnings("ignore")
from course.measure.scale import Config, fake_world, tracked_peak
config, stage, folder = Config(**json.loads(sys.argv[1])), int(sys.argv[2]), sys.argv[3]
sys.path.insert(0, folder)
import plan
from course.tools.student import planner
model = plan.Model(config.vocab, config.dim, config.depth, config.seq, config.hidden)
par = plan.Parallel(config.pp, config.dp, config.tp, config.batch, config.micro_batches,
                    config.schedule)
shards = plan.held(model, par, stage, 0)
said = {"peak": planner.peak(plan, model, par, stage), "shards": shards["params"],
        "whole": sum(math.prod(s) for u in plan.units(model, par, stage) for s in u) * 4,
        "old": sum(shards.values()) + plan.activations(model, par, stage)}
with fake_world(config.world, stage * config.dp * config.tp):  # dp rank 0: largest shards
    print(json.dumps({"said": said, "tracked": tracked_peak(config)}))
"""


def test_the_planners_whole_peak_agrees_with_torchs_memory_tracker():
    """The planner's peak() (course plan's memory, from the reference plan.py's terms), at a
    rank of dp rank 0 of each stage, against the bytes torch's MemTracker saw alive at that
    rank's worst moment of the program's step: within planner.TRACKED. The parameters
    alive at the peak include the shards and every unit's whole tp-local weights (FSDP2
    keeps them gathered; with tp > 1 DTensor's own copies add more). The sharded state and
    the blocks' saved tensors alone (plan.memory's formula) fall far below."""
    import dataclasses
    import json
    from concurrent.futures import ThreadPoolExecutor

    from course import REPO_ROOT, launch
    from course.tools.student import planner

    folder = str(REPO_ROOT / "solutions" / "15_planning")

    def run(case):
        config, stage = CONFIGS[case[0]][0], case[1]
        args = (json.dumps(dataclasses.asdict(config)), str(stage), folder)
        result = launch.python("-c", _PEAK, *args, timeout=120)
        assert result.ok, result.describe()
        return config, stage, json.loads(result.output.strip().splitlines()[-1])

    with ThreadPoolExecutor(2) as pool:
        found = list(pool.map(run, PEAKS))
    low, high = planner.TRACKED
    for config, stage, got in found:
        said, tracked = got["said"], got["tracked"]
        ratio, where = said["peak"] / tracked["Total"], f"{config} stage {stage}: {got}"
        assert low <= ratio <= high, f"planner.peak / tracked = {ratio:.3f}; {where}"
        assert tracked["Parameter"] >= said["shards"] + said["whole"], where
        assert said["old"] / tracked["Total"] < low, f"the state and saved tensors: {where}"
