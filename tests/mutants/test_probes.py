"""The declared equivalents, probed (tests/mutants/probes.py): each one a probe covers
answers as the reference on every draw, and each probe tells apart the killed mutants of
the functions it covers, so that its silence on an equivalent means something."""

from __future__ import annotations

import probes
import pytest

PROBED = [(lesson, mutant) for lesson, found in sorted(probes.probed().items())
          for mutant in found]  # fmt: skip


def _id(case) -> str:
    lesson, mutant = case
    return f"{lesson}-{mutant['file']}:{mutant['line']}-{mutant['operator'].split('/')[-1]}"


def test_the_probes_cover_equivalents_of_four_lessons():
    """plan.py, moe.py's routing, the ring's merge and the hang diagnoses: 32 of the records'
    equivalents when they were written (more as records grow)."""
    lessons = {lesson for lesson, _ in PROBED}
    assert lessons == {"09", "12", "13", "15"} and len(PROBED) >= 32, [_id(c) for c in PROBED]


@pytest.mark.parametrize("case", PROBED, ids=_id)
def test_a_probed_equivalent_answers_as_the_reference(case):
    lesson, mutant = case
    found = probes.differences(lesson, mutant)
    assert not found, (
        f"{mutant['file']}:{mutant['line']} declared equivalent ({mutant.get('reason', '')}) "
        f"answers otherwise than the reference on draws {found[:5]} of {probes.DRAWS}: "
        f"{mutant['before']!r} -> {mutant['after']!r} is a mistake to catch, not an equivalent"
    )


@pytest.mark.parametrize("key", sorted(probes.PROBES), ids=lambda k: f"{k[0]}-{k[1]}")
def test_a_probe_tells_the_killed_mutants_of_its_functions_apart(key):
    """Every 8th mutant the grade killed in the covered functions (all of them, at most
    40 draws each) differs from the reference somewhere: a probe that cannot see a known
    mistake would call anything equivalent."""
    lesson, file = key
    killed = [
        m
        for m in probes.record(lesson)["mutants"]
        if m["outcome"] == "killed" and m["file"] == file and probes.covered(lesson, m)
    ]
    sample = killed[::8]  # fmt: skip
    assert sample, f"no killed mutant of {file}'s probed functions in the record"
    blind = [f"{m['line']}: {m['after']}" for m in sample
             if not probes.differences(lesson, m, draws=40, first=True)]  # fmt: skip
    assert not blind, f"the probe of {file} sees no difference in killed mutants: {blind}"


def test_a_mutant_is_applied_only_to_the_line_the_record_names():
    source = "def f(x):\n    return min(x, 0)  # low\n"
    mutant = {"file": "f.py", "line": 2, "before": "return min(x, 0)  # low",
              "after": "return min(0, x)  # low"}  # fmt: skip
    assert probes.mutated(source, mutant) == "def f(x):\n    return min(0, x)  # low\n"
    with pytest.raises(ValueError, match="the record is stale"):
        probes.mutated(source.replace("min", "max"), mutant)
    assert probes.spans(source, ("f",)) == [range(1, 3)]
