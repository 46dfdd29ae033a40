"""The program at scale, counted: for each hidden configuration of this grading seed, one
process joins a fake world of 64 to 1024 ranks as the counted rank, builds lesson 14's
composition and steps it once (course/measure/scale.py). No submission is imported here.

Run by tests/lessons/test_15_planning.py as `python lesson_15_scale.py OUT.json`.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import lesson_15_models as m  # noqa: E402

from course.measure.scale import count, fake_world  # noqa: E402

warnings.filterwarnings("ignore")  # FSDP2's and DTensor's notes on a fake world


def main(out: str) -> None:
    found = []
    for config, rank in m.counted_configs():
        with fake_world(config.world, rank):
            counted = count(config)
        found.append({"config": config.__dict__, "rank": rank, "stage": counted["stage"],
                      "held": counted["held"], "traffic": counted["traffic"]})  # fmt: skip
    Path(out).write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
