"""course/tools/author/schedules.py: lesson 11's schedules measured from the reference's own
runs."""

from __future__ import annotations

import json

import pytest

from course import REPO_ROOT
from course.tools.author import figures, schedules

RECORD = REPO_ROOT / "docs" / "results" / "11_model_parallel" / "schedules-cpu.json"


def check_dependencies(run: dict) -> list[str]:
    """What a pipeline must respect, read from the notes: each stage runs every micro-batch's
    forward and backward once; micro-batch i's forward on stage r starts after stage r - 1
    finished it, its backward after stage r + 1 finished its backward."""
    wrong, ends = [], {}
    for stage, notes in enumerate(run["timeline"]):
        count = {"F": 0, "B": 0}
        for start, end, kind in notes:
            ends[(stage, kind, count[kind])] = (start, end)
            count[kind] += 1
        if count != {"F": run["micro_batches"], "B": run["micro_batches"]}:
            wrong.append(f"stage {stage}: {count}")
    for (stage, kind, i), (start, _) in ends.items():
        before = (stage - 1, "F", i) if kind == "F" else (stage + 1, "B", i)
        if kind == "B" and stage == run["stages"] - 1:
            before = (stage, "F", i)  # the last stage turns its own forward round
        if before in ends and start < ends[before][1] - 1.0:  # 1 ms: the clocks' resolution
            wrong.append(f"{kind}{i} on stage {stage} started before {before} ended")
    return wrong


def test_a_measured_run_follows_the_pipelines_dependencies():
    """One 1F1B run of the reference on 3 stages and 2 micro-batches: each stage's notes hold
    every forward and backward once, in an order the dependencies allow, and the bubble it
    prints is at least the formula's (p-1)/(m+p-1) less a little."""
    run = schedules.run_once("1f1b", 2, stage_ms=10, steps=2)
    assert not check_dependencies(run), check_dependencies(run)
    assert all(b > run["theory"] - 0.05 for b in run["bubble"]), (run["bubble"], run["theory"])


def test_the_record_the_page_draws_is_a_real_schedule():
    """The record on the page: GPipe and 1F1B on 4 micro-batches, 1F1B on 1 to 12, every run
    respecting the dependencies; the figures draw from it, and the course can make it again."""
    doc = schedules.load(RECORD)
    runs = {(r["schedule"], r["micro_batches"]) for r in doc["runs"]}
    assert {("gpipe", 4), ("1f1b", 4)} <= runs, runs
    assert {m for s, m in runs if s == "1f1b"} == set(schedules.BUBBLE_M)
    for run in doc["runs"]:
        assert not check_dependencies(run), (run["command"], check_dependencies(run))
    for which in ("timeline", "bubble"):
        assert schedules.render_html(doc, which).startswith('<img class="course-plot"')
    with pytest.raises(ValueError, match="timeline or bubble"):
        schedules.render_html(doc, "gantt")
    made = figures.recipe(RECORD)
    assert made.verb == "schedules" and "--out" in made.command


def test_a_record_of_another_kind_is_refused(tmp_path):
    other = tmp_path / "x.json"
    other.write_text(json.dumps({"kind": "course-bench"}))
    with pytest.raises(ValueError, match="not a `course schedules` record"):
        schedules.load(other)
