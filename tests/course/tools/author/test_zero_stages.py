"""course/tools/author/zero_stages.py: lesson 10's figure agrees with the formula `course memory`
prints and checks, and reads the record the page shows."""

from __future__ import annotations

import re

import pytest

from course.tools.author import zero_stages
from course.tools.author.record import load as read
from course.tools.student import sharding_memory

RECORD = "10_memory"


def test_the_figures_bars_are_the_formula_course_memory_checks():
    params, ranks, counted = zero_stages.from_record(read(RECORD))
    assert params > 0 and ranks >= 2 and {"DDP", "FSDP2"} <= set(counted), counted
    bars = {k: sum(v) for k, v in zero_stages.per_rank(params, ranks, "fp32 AdamW").items()}
    formula = sharding_memory.predict(params, 0, ranks)  # every parameter sharded, as ZeRO-3 shards
    assert bars["DDP"] == formula["DDP"]
    assert bars["ZeRO-3 (FSDP)"] == formula["FSDP2"]
    assert bars["ZeRO-1"] == pytest.approx(8 * params + 8 * params / ranks)
    mixed = zero_stages.per_rank(params, ranks, "bf16, as ZeRO counts")
    assert sum(mixed["ZeRO-1"]) == pytest.approx(4 * params + 12 * params / ranks)
    one_d = int(re.search(r"\(([\d,]+) in 1-D", read(RECORD)["output"])[1].replace(",", ""))
    predicted = sharding_memory.predict(params, one_d, ranks)
    for name, bytes_ in counted.items():  # the record's own check: within 1 %
        assert abs(bytes_ / predicted[name] - 1) < 0.01, (name, bytes_, predicted[name])
    assert zero_stages.render_html(read(RECORD)).startswith('<img class="course-plot"')


def test_a_record_without_its_first_line_is_refused():
    with pytest.raises(ValueError, match="parameters"):
        zero_stages.from_record({"output": "way predicted counted"})
