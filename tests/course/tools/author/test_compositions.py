"""course/tools/author/compositions.py: lesson 14's curves and collectives by axis, drawn from
the record that `python -m course compositions` writes."""

from __future__ import annotations

import base64

import pytest

from course import REPO_ROOT
from course.tools.author import compositions, figures

RECORD = REPO_ROOT / "docs" / "results" / "14_composing" / "cpu.json"


def _doc(gap: float = 0.0) -> dict:
    curves = {compositions.name(s): {"1": 4.0, "2": 3.0} for s in compositions.SHAPES}
    curves["pp 1, dp 4, tp 2, resumed"] = {"2": 3.0 + gap}
    axes = [{"rank": 0, "stage": 0, "op": op, "axis": compositions.AXIS_OF[op],
             "group": [0, 1], "count": 16, "bytes": 131072}
            for op in ("send", "all_gather", "all_reduce")]  # fmt: skip
    return {"kind": compositions.KIND, "micro_batches": 4, "curves": curves, "axes": axes}


def test_the_axes_table_has_a_row_per_kind_with_its_axis_and_bytes():
    table = compositions.render_html(_doc(), "axes")
    rows = [line for line in table.splitlines() if line.startswith("| 0 (0)")]
    assert len(rows) == 3
    assert "| tp: [0, 1] | all-reduce |" in rows[2] and rows[2].endswith("| 16 | 131,072 |")
    assert "Step 2 of 4 micro-batches" in table
    chinese = compositions.render_html(_doc(), "axes", "zh")  # a Chinese page's words
    assert "4 个微批次中的第 2 步" in chinese and "激活及其梯度" in chinese
    assert "Step" not in chinese and chinese.count("| 0 (0)") == 3


def test_the_curves_image_states_the_largest_gap_from_the_control():
    html = compositions.render_html(_doc(gap=0.0125), "curves")
    assert "at any step of any run: 0.0125." in html
    svg = base64.b64decode(html.split("base64,")[1].split('"')[0]).decode()
    assert svg.startswith("<?xml") and "pp 1, dp 4, tp 2, resumed" in svg
    chinese = compositions.render_html(_doc(gap=0.0125), "curves", "zh")
    svg = base64.b64decode(chinese.split("base64,")[1].split('"')[0]).decode()
    assert "与对照组打印的损失的最大差：0.0125。" in chinese and "损失" in svg and "loss" not in svg
    with pytest.raises(ValueError, match="curves or axes"):
        compositions.render_html(_doc(), "bubble")


def test_load_refuses_another_kind_of_record(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"kind": "course-schedules"}')
    with pytest.raises(ValueError, match="not a `course compositions` record"):
        compositions.load(path)


def test_the_record_is_known_to_figures_and_its_curves_agree():
    """The committed record names the command that makes it again, and its printed losses
    agree with the control's at every step, as the page says."""
    figure = figures.recipe(RECORD)
    assert figure.verb == "compositions" and figure.command[:4] == (
        "python", "-m", "course", "compositions")  # fmt: skip
    doc = compositions.load(RECORD)
    assert set(doc["curves"]) == {compositions.name(s) for s in compositions.SHAPES} | {
        "pp 1, dp 4, tp 2, resumed"
    }
    assert compositions.largest_gap(doc) < 1e-3
    assert {row["axis"] for row in doc["axes"]} == {"pp", "dp", "tp"}
