"""Every bound a lesson test allows is measured, and the record says so.

A lesson test declares its bounds (course/grader/tolerances.py); `python -m course tolerances`
measures each on the reference over many seeds into docs/results/tolerances/cpu.json. This
file fails when a declared bound has no measurement, was changed since it was measured, or
has too little room above the worst value the reference reached; and it checks the pieces
the measurement relies on: a test's seed follows COURSE_TOLERANCE_SEED, note() appends to
the log only when one is asked for, and the tool keeps what a run saw nearest each bound.
It also keeps the other side in step: every known mistake (tests/mutants/) that a bounded
test catches is measured by that test (`course tolerances --mistakes`), so a page can say
how far the nearest one lands from the bound.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from course import REPO_ROOT, launch
from course.grader import tolerances
from course.tools.author import measure_tolerances as tool
from course.tools.author import mutants
from course.tools.author import tolerance_store as rec

RECORD = REPO_ROOT / rec.RECORD


@pytest.fixture(scope="module")
def declared():
    return tool.declared()


def test_every_lesson_bound_is_declared_measured_and_has_room(declared):
    """Each declared bound has an entry measured at its current value, on every seed it
    names, with every value the reference reached inside the bound (a `high`-only bound
    at least `room` times the worst)."""
    record = rec.load(RECORD)
    found = [p for t in declared.values() for p in rec.problems(t, record["tolerances"].get(t.key))]
    assert not found, "\n".join(found)
    stale = sorted(set(record["tolerances"]) - set(declared))
    assert not stale, f"the record measures bounds no test declares any more: {stale}"
    lessons = {t.lesson for t in declared.values()}
    assert lessons >= {"01", "02", "03", "04", "06", "08", "09", "10", "11"}, sorted(lessons)


def test_the_checks_catch_a_changed_bound_a_tight_bound_and_a_missing_seed():
    t = tolerances.Tolerance("99.x", "a gap", "test_x", high=1e-3, seeds=(0, 1))
    entry = {"high": 1e-3, "low": None, "seen": {"0": [1e-4], "1": [2e-4]}, "failed_seeds": []}
    assert rec.problems(t, entry) == []
    assert "measure it again" in rec.problems(t, dict(entry, high=1e-2))[0]
    tight = dict(entry, seen={"0": [1e-4], "1": [6e-4]})
    assert "less than 2 times the worst" in rec.problems(t, tight)[0]
    assert "seeds [1]" in rec.problems(t, dict(entry, seen={"0": [1e-4]}))[0]
    assert "outside" in rec.problems(t, dict(entry, seen={"0": [1e-4], "1": [2e-3]}))[0]
    assert "failed" in rec.problems(t, dict(entry, failed_seeds=[1]))[0]
    loaded = tolerances.Tolerance("99.t", "a timing", "test_t", high=1e-3, seeds=(0, 1), busy=2)
    assert "beside 2 busy loops, measured beside 0" in rec.problems(loaded, entry)[0]
    assert rec.problems(loaded, dict(entry, busy=2)) == []
    assert "not measured" in rec.problems(t, None)[0]
    floor = tolerances.Tolerance("99.y", "accuracy", "test_y", low=0.8, seeds=(0,))
    assert rec.problems(floor, {"high": None, "low": 0.8, "seen": {"0": [0.9]}}) == []
    assert "outside" in rec.problems(floor, {"high": None, "low": 0.8, "seen": {"0": [0.7]}})[0]
    assert rec.extremes(t, [3e-5, 1e-4, 2e-6]) == [1e-4]
    assert rec.extremes(floor, [0.91, 0.95]) == [0.91]
    both = tolerances.Tolerance("99.z", "excess", "test_z", low=-0.05, high=0.15)
    assert rec.extremes(both, [0.01, 0.04, 0.02]) == [0.01, 0.04]


def test_a_seed_and_a_note_follow_the_measurement_environment(tmp_path):
    """In a grading (no variable set) seed() is the test's own and note() writes nothing;
    under `course tolerances` both follow the environment, in child processes too."""
    log = tmp_path / "notes.jsonl"
    code = (
        "from course.grader.tolerances import Tolerance, seed\n"
        "t = Tolerance('99.x', 'a gap', 'test_x', high=1.0)\n"
        "print(seed(3)); t.note(0.25, 'gloo')\n"
    )
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in (tolerances.SEED_ENV, tolerances.LOG_ENV)}  # fmt: skip
    plain = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert plain.stdout.strip() == "3" and not log.exists(), plain.stderr
    env |= {tolerances.SEED_ENV: "7", tolerances.LOG_ENV: str(log)}
    measured = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True)  # fmt: skip
    assert measured.stdout.strip() == "7", measured.stderr
    (line,) = log.read_text().splitlines()
    assert json.loads(line) | {"test": ""} == {"key": "99.x", "seen": 0.25, "seed": 7,
                                               "backend": "gloo", "test": ""}  # fmt: skip


def test_the_tool_refuses_an_unknown_bound_in_one_line(declared):
    result = subprocess.run([sys.executable, "-m", "course", "tolerances", "42.nothing"],
                            cwd=REPO_ROOT, capture_output=True, text=True)  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "42.nothing" in lines[0], result.stderr


def test_the_tool_measures_one_bound_on_the_reference_and_on_the_starter(tmp_path):
    """`course tolerances 09.ddp_step --seeds 1 --out F` runs the test once, at seed 0, and
    records what it saw; on the starter (--impl lessons, whose train_step divides the loss
    by the world size) the test fails, the record says so, and the command exits 1."""
    out = tmp_path / "t.json"
    deadline = 120 * launch.timeout_scale()
    base = [sys.executable, "-m", "course", "tolerances", "09.ddp_step", "--seeds", "1"]
    run = subprocess.run([*base, "--out", str(out)], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=deadline)  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr  # one seed of twelve: a problem
    assert "no value recorded at seeds [1, 2" in run.stdout, run.stdout
    entry = json.loads(out.read_text())["tolerances"]["09.ddp_step"]
    assert list(entry["seen"]) == ["0"] and entry["failed_seeds"] == [], entry
    assert 0 < entry["max"] <= entry["high"] / 2, entry
    listed = subprocess.run([*base[:4], "--list", "--out", str(out)], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=deadline)  # fmt: skip
    assert "09.ddp_step" in listed.stdout and "09.oom" in listed.stdout, listed.stdout
    starter = tmp_path / "starter.json"
    run = subprocess.run([*base, "--impl", "lessons", "--out", str(starter)], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=deadline)  # fmt: skip
    entry = json.loads(starter.read_text())["tolerances"]["09.ddp_step"]
    assert run.returncode == 1 and entry["failed_seeds"] == [0], run.stdout
    assert entry["max"] > entry["high"], entry  # the planted bug, seen by the same test


def test_the_grading_tables_quote_each_bound_as_declared(declared):
    """A test's docstring is its row in the page's grading table; a bound it quotes ("at
    least 80 %", "within 5e-5") must be the one the test declares, or the page would say
    one bound and grade with another."""
    import importlib
    from pathlib import Path

    bounds: dict = {}  # (file, test) -> {"low": {...}, "high": {...}}: one test, many bounds
    for t in declared.values():
        for name in t.test.split():
            mine = bounds.setdefault((t.file, name), {"low": set(), "high": set()})
            if t.high is None:
                mine["low"].add(t.low)
            elif t.low is None:
                mine["high"].add(t.high)
    wrong = []
    for (file, name), mine in bounds.items():
        module = importlib.import_module(Path(file).stem)
        doc = " ".join((getattr(module, name).__doc__ or "").split())
        if mine["low"]:
            quoted = [float(p) / 100 for p in re.findall(r"(\d+(?:\.\d+)?) %", doc)]
            wrong += [f"{name}: {q:.0%}, not among {sorted(mine['low'])}" for q in quoted
                      if not any(abs(q - low) < 1e-9 for low in mine["low"])]  # fmt: skip
        if mine["high"]:
            quoted = [float(p) for p in re.findall(r"within (\d(?:\.\d+)?e-\d+)", doc)]
            wrong += [f"{name}: {q:g}, not among {sorted(mine['high'])}" for q in quoted
                      if q not in mine["high"]]  # fmt: skip
    assert not wrong, f"docstrings quote other bounds than their tests declare: {wrong}"


def test_every_known_mistake_a_bounded_test_catches_is_measured(declared):
    """For each bound, the mutants whose `caught_by` picks a test that measures it are the
    ones the record measured (`--mistakes`), each rejected; a mutant that reached a value
    reached it outside the bound or was stopped by another of the test's checks."""
    record = rec.load(RECORD)["tolerances"]
    wrong = []
    for t in declared.values():
        expected = {case["name"] for number, _, case in mutants.cases("MUTANTS")
                    if number == t.lesson and any(mutants.selects(case["caught_by"], n)
                                                  for n in t.test.split())}  # fmt: skip
        got = record.get(t.key, {}).get("mistakes", {})
        if set(got) != expected:
            wrong.append(f"{t.key}: mutants {sorted(expected)}, measured {sorted(got)} (run "
                         f"`python -m course tolerances {t.key} --mistakes`)")  # fmt: skip
        wrong += [f"{t.key}: the mutant {name} passed its tests" for name, m in got.items()
                  if not m["rejected"]]  # fmt: skip
    assert not wrong, "\n".join(wrong)
    measured = [m for e in record.values() for m in e.get("mistakes", {}).values()]
    assert sum(m["value"] is not None for m in measured) >= 20, measured  # most reach a value


def test_a_mistake_is_what_rejected_it_and_the_nearest_is_least_outside():
    assert rec.outside_by(None, 1e-3, 5e-4) == 0 and rec.outside_by(0.8, None, 0.9) == 0
    assert rec.outside_by(None, 1e-3, 3e-3) == pytest.approx(2.0)
    assert rec.outside_by(0.8, None, 0.4) == pytest.approx(0.5)
    assert rec.outside_by(-0.05, 0.15, 0.25) == pytest.approx(0.5)  # a band: over its width
    t = tolerances.Tolerance("99.x", "a gap", "test_x", high=1e-3)
    assert rec.farthest(t, [5e-2, 2e-3, 1e-4]) == 5e-2  # one schedule wrong of several
    assert rec.farthest(t, [2e-4, 1e-4]) == 2e-4  # caught by another check: the worst inside
    entry = {"mistakes": {"a": {"value": 5e-2}, "b": {"value": 2e-3}, "c": {"value": None},
                          "d": {"value": 1e-4}}}  # fmt: skip
    assert rec.nearest_mistake(t, entry) == ("b", 2e-3)  # d, inside, was caught otherwise
    assert rec.nearest_mistake(t, {"mistakes": {"c": {"value": None}}}) is None


def test_the_tool_measures_a_known_mistake(tmp_path):
    """`course tolerances 09.ddp_step --mistakes --mutant silent_loss_divided_by_world`: the
    mutant's run is rejected, and its value, recorded beside the reference's, is far above
    the bound."""
    out = tmp_path / "t.json"
    out.write_text(RECORD.read_text())
    deadline = 120 * launch.timeout_scale()
    run = subprocess.run([sys.executable, "-m", "course", "tolerances", "09.ddp_step",
                          "--mistakes", "--mutant", "silent_loss_divided_by_world", "--out",
                          str(out)], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=deadline)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    entry = json.loads(out.read_text())["tolerances"]["09.ddp_step"]
    mistake = entry["mistakes"]["silent_loss_divided_by_world"]
    assert mistake["rejected"] and mistake["value"] > 10 * entry["high"], mistake
    assert mistake["command"].startswith("python -m course tolerances 09.ddp_step --mistakes")
    assert "silent_loss_divided_by_world" in run.stdout, run.stdout
