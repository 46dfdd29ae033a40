"""Lesson 15's cost model, called in a child process (course/grader/cases.py).

Run by tests/lessons/test_15_planning.py as `python lesson_15.py LESSON_FILE OUT_DIR`, in a
folder where the test wrote the grading seed's hidden numbers (HIDDEN, drawn by
tests/lessons/cases/lesson_15_models.py): the grader names each counted rank's stage and
data-parallel rank; the submission answers. The child reads numbers only: it imports none
of the grader's model or counting code, so the submission, which runs in it, cannot
import them either (course/grader/submission.py refuses the grader's modules to it).

Case `bytes`: held, activations and traffic for the counted ranks.
Case `times`: step_time on hidden machines.
Case `times`: step_time for the timed models, and traffic for each of their stages.
Case `questions`: micro_batches_for, communication_bound and best_tp on hidden numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

from course.grader.cases import Cases

HIDDEN = "hidden.json"  # written by the test in the child's working folder
cases = Cases()
REQUIRES = ("held", "activations", "traffic", "step_time", "micro_batches_for",
            "communication_bound", "best_tp", "Model", "Parallel", "Hardware")  # fmt: skip


def _hidden() -> dict:
    return json.loads(Path(HIDDEN).read_text())


def _shapes(lesson, c: dict):
    model = lesson.Model(c["vocab"], c["dim"], c["depth"], c["seq"], c["hidden"])
    par = lesson.Parallel(c["pp"], c["dp"], c["tp"], c["batch"], c["micro_batches"],
                          c["schedule"])  # fmt: skip
    return model, par


def _plain(d) -> dict:
    return {str(k): (int(v) if isinstance(v, int) else float(v)) for k, v in dict(d).items()}


@cases.case
def bytes(lesson):  # noqa: A001 - the case's name
    found = []
    for c, stage, dp_rank in _hidden()["counted"]:
        model, par = _shapes(lesson, c)
        found.append({"held": _plain(lesson.held(model, par, stage, dp_rank)),
                      "activations": int(lesson.activations(model, par, stage)),
                      "traffic": _plain(lesson.traffic(model, par, stage))})  # fmt: skip
    return found


@cases.case
def times(lesson):
    found = []
    for c, hw in _hidden()["timed"]:
        model, par = _shapes(lesson, c)
        found.append({"time": _plain(lesson.step_time(model, par, lesson.Hardware(**hw))),
                      "traffic": [_plain(lesson.traffic(model, par, stage))
                                  for stage in range(par.pp)]})  # fmt: skip
    return found


@cases.case
def questions(lesson):
    q = _hidden()["questions"]
    return {
        "pipelines": [lesson.micro_batches_for(pp, t) for pp, t in q["pipelines"]],
        "bound": [lesson.communication_bound(*_shapes(lesson, c), lesson.Hardware(**hw))
                  for c, hw in q["bound"]],
        "tp": [lesson.best_tp(*_shapes(lesson, c), lesson.Hardware(**hw)) for c, hw in q["tp"]],
        "bound_most": lesson.communication_bound(
            *_shapes(lesson, q["bound_most"][0]), lesson.Hardware(**q["bound_most"][1]),
            most=q["bound_most"][2]),
    }  # fmt: skip


if __name__ == "__main__":
    cases.run(requires=REQUIRES)
