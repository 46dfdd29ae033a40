"""Cases: a lesson's functions called in a child process; only plain data comes back.

The grading process never imports a submission: imported there, it could
rewrite pytest's reports, the comparisons or the grade. Function-level tests
therefore go through a *case script* of the grader (tests/lessons/cases/lesson_NN.py)
that runs in a child process. It imports the lesson file, calls its functions
in named cases and writes one JSON document, plus one file of tensors when a
case returns some. The parent reads them with `json.loads` and
`torch.load(weights_only=True)`, neither of which can run code, and makes
every comparison itself.

One child per lesson runs every case (importing torch once), so the cost is a
few seconds per lesson, not per test.

The machinery has one name, cases, and three modules:
  cases        (this one) the protocol and the child's side: what a case script uses
  case_ranks   the ranks a case starts (Cases.spawn), and why one of them failed
  case_runs    the grader's side: the child started, its CaseResults read, and the
               LessonCases a test reads

Child side (a case script):

    cases = Cases()                      # argv: LESSON_FILE OUT_DIR

    @cases.case
    def pick_backend_no_gpu(lesson):     # runs with the imported lesson
        return lesson.pick_backend()

    cases.run(requires=("pick_backend",))

Grader side (a test module, course/grader/case_runs.py):

    cases = run_lesson_cases(impl, LESSON, CASES, tmp_path)   # CASES:
    tests/lessons/cases/lesson_00.py
    assert cases("pick_backend_no_gpu") == "gloo"
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from course.grader import case_ranks

RESULTS = "cases.json"
TENSORS = "tensors.pt"
ONLY_ENV = "COURSE_CASES"  # comma-separated: run only these cases (the tests selected need)


@dataclass
class Tensors:
    """A case's return value that holds tensors: {name: tensor}, saved weights-only."""

    tensors: dict
    extra: dict = field(default_factory=dict)


@dataclass
class Exit:
    """What a call that exits (argparse's errors) left: exit code and stderr."""

    code: int | str | None
    stderr: str


def exits(function: Callable, *args) -> Exit | object:
    """Call `function(*args)`; if it raises SystemExit, return an Exit instead."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return function(*args)
    except SystemExit as stop:
        return Exit(stop.code, err.getvalue())


def raised(function: Callable, *args, kind: type[BaseException] = ValueError) -> dict:
    """Call `function(*args)` expecting it to refuse: {"raised": "ValueError", "message": ...},
    or {"raised": None} when it returned (other exceptions propagate: the case failed)."""
    try:
        function(*args)
    except kind as err:
        return {"raised": kind.__name__, "message": str(err)}
    return {"raised": None}


# mp.spawn's ProcessRaisedException carries a rank's whole traceback as its message.
_RANK_FAILED = re.compile(
    r"-- Process (\d+) terminated with the following error:\n(Traceback.*)", re.S
)
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')
_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): ?(.*)$")


def _rank_error(message: str, lesson_file: Path) -> dict | None:
    """The exception a spawned rank raised, from its traceback text: its type, its own
    message and the submission's line, instead of the whole traceback (or None)."""
    found = _RANK_FAILED.search(message)
    if not found:
        return None
    rank, text = found.group(1), found.group(2).split("\n\nDuring handling")[0]
    lines, where, last_frame = text.splitlines(), None, -1
    for number, line in enumerate(lines):
        if frame := _FRAME.match(line):
            last_frame = number
            if Path(frame.group(1)).resolve() == lesson_file.resolve():
                where = f"{lesson_file.name}:{frame.group(2)}"
    raised = next((m for line in lines[last_frame + 1 :] if (m := _RAISED.match(line))), None)
    if raised is None:
        return None
    kind = raised.group(1).rsplit(".", 1)[-1]
    return {"type": kind, "message": f"on rank {rank}: {raised.group(2)}", "where": where}


def _error(err: BaseException, lesson_file: Path) -> dict:
    """One line about an exception, with the submission's line that raised it (for a rank
    that mp.spawn started, the rank's exception and line)."""
    if rank := _rank_error(str(err), lesson_file):
        return rank
    frames = traceback.extract_tb(err.__traceback__)
    own = [f for f in frames if Path(f.filename).resolve() == lesson_file.resolve()]
    where = f"{lesson_file.name}:{own[-1].lineno}" if own else None
    return {"type": type(err).__name__, "message": str(err), "where": where}


class Cases:
    def __init__(self, argv: list[str] | None = None):
        argv = sys.argv[1:] if argv is None else argv
        self.lesson_file, self.out = Path(argv[0]), Path(argv[1])
        self.cases: dict[str, Callable] = {}
        self.hung: str | None = None  # what timed out in an earlier spawn (see spawn)

    def case(self, function: Callable) -> Callable:
        self.cases[function.__name__] = function
        return function

    def spawn(
        self, target: Callable, world: int, *args, what: str, cuda: bool = False, ddp: bool = False
    ) -> None:
        """Run target(rank, world, port, *args) in `world` ranks, on a free port.

        CPU ranks are forked from this process, which has imported torch and the lesson
        already: a spawned rank imports both again (1.5-3 s of CPU each, most of a case's
        cost). CUDA ranks (`cuda`) are spawned: CUDA does not survive a fork.

        Ranks that deadlock wait for the process-group timeout, half the grader's deadline
        for the case script: after one such case the others would not fit in the rest, so
        every later call raises at once, naming `what` timed out. ddp: the ranks build
        DistributedDataParallel, whose constructor imports torch._dynamo (2 s of CPU):
        imported here once, before the fork, instead of once in every rank. Which rank's error
        mp.spawn reports is a race: the first rank to time out leaves, and its peer may
        fail first with "connection closed". Each rank therefore writes its own error, and
        a timeout on any rank is reported as the case's."""
        import tempfile

        from course import ranks

        if self.hung:
            raise RuntimeError(f"not run: the {self.hung} timed out (see that test)")
        errors = Path(tempfile.mkdtemp(prefix="rank-errors-", dir=self.out.parent))
        if ddp and not cuda:
            import torch._dynamo  # noqa: F401 - inherited by the forked ranks
        try:
            args = (target, str(errors), world, ranks.free_port(), *args)
            case_ranks.start_and_wait(args, world, "spawn" if cuda else "fork")
        except Exception as err:
            timed_out = case_ranks.timeout_among(err, errors)
            if timed_out is None:
                native = case_ranks.native_error(err, errors)
                if native is not None:
                    raise RuntimeError(native) from None
                raise
            self.hung = what
            if timed_out:  # another rank's: say so, rather than its peer's symptom
                raise RuntimeError(f"the {what} timed out: {timed_out[:400]}") from None
            raise
        finally:  # what the ranks wrote to stderr, in this process's output as before
            for path in sorted(errors.glob("rank*.err")):
                sys.stderr.write(path.read_text(errors="replace"))
            sys.stderr.flush()

    def run(self, requires: tuple[str, ...] = ()) -> None:
        from course.grader import submission

        results: dict = {"cases": {}}
        tensors: dict = {}
        try:
            lesson = submission.load(self.lesson_file, requires=requires)
        except submission.LessonError as err:
            results["load_error"] = str(err)
            lesson = None
        only = os.environ.get(ONLY_ENV)  # unset: every case; empty: none
        wanted = None if only is None else set(filter(None, only.split(",")))
        chosen = {n: f for n, f in self.cases.items() if wanted is None or n in wanted}
        for name, function in chosen.items() if lesson is not None else ():
            try:
                value = function(lesson)
            except BaseException as err:  # noqa: BLE001 - the submission's failure, recorded
                results["cases"][name] = {"error": _error(err, self.lesson_file)}
                continue
            if isinstance(value, Tensors):
                if missing := [key for key, tensor in value.tensors.items() if tensor is None]:
                    # a gradient that never reached its tensor is None: say which, not crash
                    results["cases"][name] = {"error": {
                        "type": "NoGradient", "where": None,
                        "message": f"no tensor for {', '.join(missing)}: None (a gradient "
                        "that did not reach its tensor is None)"}}  # fmt: skip
                    continue
                keys = []
                for key, tensor in value.tensors.items():
                    tensors[f"{name}/{key}"] = tensor.detach().cpu().clone()
                    keys.append(key)
                value = {"tensors": keys, **value.extra}
            elif isinstance(value, Exit):
                value = {"exit": value.code, "stderr": value.stderr}
            results["cases"][name] = {"value": value}
        self.out.mkdir(parents=True, exist_ok=True)
        if tensors:
            import torch

            torch.save(tensors, self.out / TENSORS)
        (self.out / RESULTS).write_text(json.dumps(results, default=repr))
