"""A dishonest submission cannot raise its score (docs/threat-model.md).

Each cheat below is a few lines added to the top of the *unsolved* starters
of lessons 00 and 03, nothing else; the two lessons are then graded together
in a subprocess, as an instructor would, with --grade-json. The grade, in the
terminal table and in the JSON file, must not exceed the plain starters'.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import textwrap
import time
from pathlib import Path

import pytest

from course import REPO_ROOT, launch, registry
from course.grader.grading import of_lessons

GRADED = ("00", "03")

CHEATS = {
    # Rewrites pytest's reports: only works in a process that runs pytest.
    "patch_pytest_reports": """
        try:
            from _pytest.reports import TestReport as _Report

            _made = _Report.from_item_and_call

            def _passed(item, call):
                report = _made(item, call)
                report.outcome, report.longrepr = "passed", None
                return report

            _Report.from_item_and_call = staticmethod(_passed)
        except Exception:
            pass
    """,
    # Finds --grade-json in its ancestors' command lines and writes a perfect
    # score there: now, at exit, and from a daemon that leaves its process group.
    "rewrite_results_file": """
        import atexit as _atexit, json as _json, os as _os, time as _time

        def _grade_files():
            found, pid = [], _os.getppid()
            while pid > 1:
                try:
                    args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
                    stat = open(f"/proc/{pid}/stat").read()
                except OSError:
                    break
                for i, arg in enumerate(args):
                    if arg.startswith(b"--grade-json="):
                        found.append(arg.split(b"=", 1)[1].decode())
                    elif arg == b"--grade-json" and i + 1 < len(args):
                        found.append(args[i + 1].decode())
                pid = int(stat[stat.rfind(")") + 2 :].split()[1])
            return found

        def _forge():
            forged = {"score": 1000, "max_score": 1000, "tests": [
                {"name": "forged", "score": 1000, "max_score": 1000, "status": "passed"}]}
            for path in _grade_files():
                try:
                    with open(path, "w") as f:
                        _json.dump(forged, f)
                except OSError:
                    pass

        _forge()
        _atexit.register(_forge)
        if _os.fork() == 0:
            _os.setsid()
            if _os.fork() == 0:
                for _ in range(1200):
                    _forge()
                    _time.sleep(0.1)
            _os._exit(0)
    """,
    # Makes every tensor comparison succeed, in its own process.
    "patch_torch_comparisons": """
        import torch as _torch

        _torch.equal = lambda *a, **k: True
        _torch.allclose = lambda *a, **k: True
        _torch.testing.assert_close = lambda *a, **k: None
    """,
    # Kills the process that started it (the grader, or a launcher under it).
    "kill_the_parent": """
        import os as _os, signal as _signal

        _os.kill(_os.getppid(), _signal.SIGKILL)
    """,
    # Run as a script: prints what the tests look for, writes plausible files,
    # and exits with status 0 before any real work.
    "forge_output_and_files": """
        import json as _json, os as _os, sys as _sys

        if __name__ == "__main__":
            _argv = _sys.argv
            _arg = lambda flag: _argv[_argv.index(flag) + 1] if flag in _argv else None
            print("How many GPUs does this process see? 0")
            print("smoke test passed: 2 processes, backend " + (_arg("--backend") or "gloo"))
            _logs = _os.environ.get("COURSE_RANK_LOG_DIR")
            for _rank in (0, 1) if _logs else ():
                with open(_os.path.join(_logs, f"rank{_rank}.log"), "w") as _f:
                    _f.write(f"rank {_rank}/2\\nglobal batch 128\\ntest accuracy 99.0%\\n")
            _half = list(range(719))
            _shards = [[_half, [i + 719 for i in _half]], [_half[::-1], [i + 719 for i in _half]]]
            _epochs = [{"epoch": 1, "train_loss": 2.0}, {"epoch": 2, "train_loss": 0.1}]
            _metrics = {"final_accuracy": 0.99, "world_size": 2, "global_batch_size": 128,
                        "epochs": _epochs, "shards": _shards}
            if _arg("--metrics-out"):
                with open(_arg("--metrics-out"), "w") as _f:
                    _json.dump(_metrics, _f)
            if _arg("--checkpoint"):
                import torch as _torch
                from course import models as _models

                _torch.manual_seed(0)
                _model = _models.build_model("cnn", 10, 1, norm=_arg("--norm") or "batch")
                _torch.save({"model": _model.state_dict(), "epoch": 2, "step": 24},
                            _arg("--checkpoint"))
            _os._exit(0)
    """,
    # Stops at once with status 0, whatever imports or runs it.
    "exit_zero_early": """
        import os as _os

        _os._exit(0)
    """,
    # Runs the reference solution instead, when it can find one next to the course.
    "run_the_reference": """
        import pathlib as _pathlib, runpy as _runpy, sys as _sys
        import course as _course

        _here = _pathlib.Path(__file__)
        _ref = (_pathlib.Path(_course.__file__).resolve().parents[1] / "solutions"
                / _here.parent.name / _here.name)
        if _ref.is_file():
            if __name__ == "__main__":
                _runpy.run_path(str(_ref), run_name="__main__")
                _sys.exit(0)
            _sys.modules[__name__].__dict__.update(_runpy.run_path(str(_ref)))
            raise SystemExit(0)
    """,
}


def _docstring_or_future(node: ast.stmt) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.module == "__future__"
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)


def starters_with(tmp_path: Path, cheat: str | None) -> Path:
    """A copy of the unsolved starters of GRADED with `cheat` put at the top of each file."""
    impl = tmp_path / "impl"
    for number in GRADED:
        lesson = registry.get(number)
        shutil.copytree(lesson.path("lessons").parent, impl / lesson.path("lessons").parent.name)
        if cheat is None:
            continue
        path = lesson.path(impl)
        lines = path.read_text().splitlines(keepends=True)
        # After the docstring and any __future__ import, which must come first.
        at = 0
        for node in ast.parse("".join(lines)).body:
            if not _docstring_or_future(node):
                break
            at = node.end_lineno
        path.write_text("".join(lines[:at]) + textwrap.dedent(cheat) + "".join(lines[at:]))
    return impl


def grade(
    tmp_path: Path,
    impl: Path,
    root: Path = REPO_ROOT,
    numbers=GRADED,
    workers=0,
    timeout: float = 600,
    env: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
) -> dict:
    """Grade lessons `numbers` on `impl` from the course at `root`; the totals of the
    table and of the file (read again a second later: nothing may rewrite it)."""
    results = tmp_path / "results.json"
    args = of_lessons(numbers, impl, results, workers, root=root).with_options(*extra).command()
    run = launch.run(args, timeout=timeout, cwd=root, env=env, course_root=root)
    assert not run.timed_out, run.describe()
    table = re.search(r"^total\s+([\d.]+)/([\d.]+)", run.output, re.M)
    scores = []
    for wait in (0, 1):
        time.sleep(wait)
        try:
            scores.append(json.loads(results.read_text())["score"])
        except (OSError, ValueError, KeyError, TypeError):
            scores.append(None)  # no valid file: Gradescope reports a failed grading, 0 points
    file_score = None if None in scores else max(scores)
    return {"table": float(table.group(1)) if table else None, "file": file_score, "run": run}


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The grade of the unsolved starters, unmodified."""
    tmp = tmp_path_factory.mktemp("plain")
    return grade(tmp, starters_with(tmp, None))


@pytest.mark.mutation
@pytest.mark.parametrize("cheat", [c for c in CHEATS if c != "run_the_reference"])
def test_a_cheat_does_not_raise_the_score(tmp_path, plain, cheat):
    got = grade(tmp_path, starters_with(tmp_path, CHEATS[cheat]))
    base = plain["file"]
    assert plain["table"] == base, "the plain starters' table and file should agree"
    for where in ("table", "file"):
        score = got[where]
        assert score is None or score <= base, (
            f"the cheat '{cheat}' raised the {where} score of unsolved starters from {base} "
            f"to {score}\n{got['run'].describe(lines=30)}"
        )


@pytest.mark.mutation
def test_without_solutions_the_run_the_reference_cheat_finds_nothing(
    tmp_path, plain, course_without_solutions
):
    """As in a class deployment, the course without solutions/: the cheat that runs the
    reference when it finds one beside the course earns no more than the plain starters.
    (With solutions/ next to the submission that cheat works: fine for self-study, never for
    a graded class.) That this course grades a correct submission in full, every lesson,
    is shown by the honest alternatives of tests/mutants/test_mutants.py, graded from the same
    copy."""
    cheat = grade(
        tmp_path, starters_with(tmp_path, CHEATS["run_the_reference"]),
        root=course_without_solutions,
    )  # fmt: skip
    assert cheat["run"].returncode != 0, cheat["run"].describe(lines=30)
    assert cheat["file"] is not None and cheat["file"] <= plain["file"], (
        f"the run-the-reference cheat scored {cheat['file']} without solutions/, "
        f"the plain starters {plain['file']}\n{cheat['run'].describe(lines=30)}"
    )
