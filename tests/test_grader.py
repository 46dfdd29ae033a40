"""The grader grades itself: it fails unsolved starters, survives broken and
hanging submissions, and keeps its results file valid through a crash.

These run pytest (or a planted script) in a subprocess, exactly as an
instructor's `python -m course grade` would. Those that grade a wrong submission
(the starters, a broken or hanging file) are marked `mutation`, like the mutants:
the full suite runs them, the quick loop (`-m "not mutation"`) does not.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import course
from course import REPO_ROOT, lessons, procs
from course.grader import warm


@pytest.fixture(scope="module")
def grader():
    """A warm grading server (course/grader/warm.py), as tests/test_mutants.py uses."""
    with warm.Server(REPO_ROOT) as server:
        yield server


def grade(grader, tmp_path, files, *options, timeout=300):
    """Run the grader on `files`; return (results.json as a dict, RunResult)."""
    results = tmp_path / "results.json"
    args = [sys.executable, "-m", "pytest", *map(str, files), f"--grade-json={results}"]
    args += ["-p", "no:cacheprovider", "-p", "no:xdist", "-q", *options]
    run = grader.run(args, timeout=timeout, cwd=REPO_ROOT)
    assert not run.timed_out, run.describe()
    assert results.exists(), run.describe()
    return json.loads(results.read_text()), run


def lesson_test_files(lesson):
    return sorted((REPO_ROOT / "tests").glob(f"test_{lesson.number}_*.py"))


def copy_solutions(tmp_path):
    submission = tmp_path / "submission"
    shutil.copytree(
        REPO_ROOT / "solutions", submission, ignore=shutil.ignore_patterns("__pycache__")
    )
    return submission


@pytest.mark.mutation
@pytest.mark.parametrize("lesson", lessons.LESSONS, ids=lambda lesson: lesson.number)
def test_every_starter_fails_its_core_tests(grader, tmp_path, lesson):
    results, run = grade(
        grader, tmp_path, lesson_test_files(lesson), "--impl=lessons", "-m", "core"
    )
    graded = [t for t in results["tests"] if t["status"] != "skipped"]
    assert graded, f"lesson {lesson.number} has no core tests\n{run.describe()}"
    passed = [t["name"] for t in graded if t["status"] != "failed" or t["score"] != 0]
    assert not passed, f"these core tests pass on the unsolved starter: {passed}"
    assert results["score"] == 0


def test_solutions_earn_full_points_and_json_has_gradescope_shape(grader, tmp_path):
    results, run = grade(grader, tmp_path, lesson_test_files(lessons.get("00")), "--impl=solutions")
    assert run.returncode == 0, run.describe()
    assert results["score"] == results["max_score"] > 0
    assert isinstance(results["execution_time"], float | int)
    assert results["course_version"] == course.__version__, results.get("course_version")
    for test in results["tests"]:
        assert set(test) >= {"name", "score", "max_score", "status", "output"}
        assert test["status"] in ("passed", "skipped")
    assert "grade of" in run.output and "Environment check" in run.output


@pytest.mark.mutation
def test_syntax_error_fails_only_that_lesson_with_one_line(grader, tmp_path):
    submission = copy_solutions(tmp_path)
    broken = submission / "00_environment" / "env_check.py"
    broken.write_text(broken.read_text() + "\ndef unfinished(:\n")
    # Lessons 00 and 02: one other lesson graded in the same session shows the others
    # unharmed. With lesson 01 as well (two training runs) the test took 14.4 s of CPU,
    # without it 6.4 s (measured 2026-12-02, 2 cores), and showed nothing more.
    files = [f for n in ("00", "02") for f in lesson_test_files(lessons.get(n))]
    results, _ = grade(grader, tmp_path, files, f"--impl={submission}", "-m", "core")
    mine = [t for t in results["tests"] if t["number"] == "00"]
    others = [t for t in results["tests"] if t["number"] != "00" and t["status"] != "skipped"]
    assert mine and all(t["status"] == "failed" and t["score"] == 0 for t in mine)
    for test in mine:
        message = test["output"].strip()
        assert "\n" not in message, f"not one line: {message!r}"
        assert "env_check.py:" in message and "syntax error" in message
    unharmed = [f"{t['name']}: {t['status']}: {t['output'][-800:]}" for t in others]
    assert others and all(t["status"] == "passed" for t in others), "\n".join(unharmed)


def test_function_that_never_returns_fails_within_the_timeout(grader, tmp_path):
    submission = copy_solutions(tmp_path)
    script = submission / "00_environment" / "env_check.py"
    source = script.read_text().replace(
        "def cuda_device_count() -> int:\n",
        "def cuda_device_count() -> int:\n    while True:\n        pass\n",
    )
    script.write_text(source)
    files = lesson_test_files(lessons.get("00"))
    results, run = grade(
        grader,
        tmp_path,
        files,
        f"--impl={submission}",
        "-k",
        "zero_when",
        "-o",
        "timeout=3",
        timeout=60,
    )
    (test,) = results["tests"]
    assert test["status"] == "failed" and test["score"] == 0
    assert "Timeout" in test["output"]
    assert run.seconds < 30


@pytest.mark.mutation
@pytest.mark.parametrize(
    "top, words",
    [
        ("import time\ntime.sleep(10**6)  # waits at import\n", "did not finish within"),
        ("import not_a_module_of_the_course\n", "fails at import at train.py:"),
    ],
    ids=["hangs", "raises"],
)
def test_a_submission_broken_at_import_fails_its_lesson_at_once(grader, tmp_path, top, words):
    """Lesson 03 whose file hangs (or raises) at import: every test of the lesson fails with
    the same one line, as soon as the grader's import check knows, instead of each test
    waiting out its own deadline (the launches alone wait 120 s)."""
    from course.grader.plugin import IMPORT_DEADLINE_S

    submission = tmp_path / "submission"
    shutil.copytree(REPO_ROOT / "solutions" / "03_ddp_spawn", submission / "03_ddp_spawn")
    script = submission / "03_ddp_spawn" / "train.py"
    source = script.read_text()
    script.write_text(source.replace("\nimport torch\n", f"\n{top}import torch\n", 1))
    results, run = grade(
        grader, tmp_path, lesson_test_files(lessons.get("03")), f"--impl={submission}"
    )
    graded = [t for t in results["tests"] if t["status"] != "skipped"]
    assert graded and all(t["status"] == "failed" for t in graded), run.describe(30)
    reasons = {t["output"].strip() for t in graded}
    assert len(reasons) == 1 and words in reasons.pop(), f"expected one shared line: {reasons}"
    limit = (IMPORT_DEADLINE_S + 60) * procs.timeout_scale()  # the check, plus pytest's start
    assert run.seconds < limit, (
        f"the lesson took {run.seconds:.0f} s to grade; a broken import should end it within "
        f"{limit:.0f} s (each launch alone waits up to 120 s)"
    )


def test_a_killed_grading_leaves_a_zero_score_file(grader, tmp_path):
    """The results file is written when the session starts (score 0) and, for real,
    only at its end: a grading killed halfway (by a test, or by a submission that
    kills its parent) leaves a valid file with no points, never a stale or partial one."""
    planted = tmp_path / "test_98_planted.py"
    planted.write_text(
        textwrap.dedent(
            """
            import os

            def test_passes():
                assert True

            def test_kills_the_grader():
                os._exit(3)

            def test_never_reached():
                assert True
            """
        )
    )
    (tmp_path / "results.json").write_text('{"score": 99, "max_score": 99, "tests": []}')
    results, run = grade(
        grader, tmp_path, [planted], "-o", "addopts=", "-p", "course.grader.plugin"
    )
    assert run.returncode == 3
    assert results["score"] == 0 and results["tests"] == [], results


# Deadlines of the two planted hangs below. Both ranks printed 3.2-4.0 s after the start
# on an idle two-core machine (2026-12-01); importing torch is 2.7x slower with four busy
# loops (grading.IMPORT_DEADLINE_S), so about 11 s loaded. Beside a busy loop *and* the
# other worker's launches (2026-12-03, twice), that was not enough: the hang's rank 1 had
# not printed within 25 s, and the barrier's ranks, whose 18 s timeout had fired, had not
# exited 36 s after the start. The hang is now killed at 40 s, and the barrier's
# process-group timeout, half its 60 s deadline, leaves 30 s for the start and the exit.
HANG_DEADLINE_S = 40
BARRIER_DEADLINE_S = 60

# Neither script imports course.ranks (and with it torch._dynamo, 2.3 s of CPU a process):
# in a CI run beside a busy loop the barrier's three processes had not both reached the
# collective's timeout within the deadline, and the hang's rank 1 had not printed in 25 s.
FREE_PORT = """
def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
"""

HANG = (
    """
import sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
"""
    + FREE_PORT
    + """

def worker(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    if rank == 1:
        print("rank 1 skips the all-reduce", flush=True)
        time.sleep(3600)
    print("rank 0 waits in all_reduce", flush=True)
    dist.all_reduce(torch.ones(1))

if __name__ == "__main__":
    mp.spawn(worker, args=(free_port(),), nprocs=2)
"""
)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The two planted hangs below, launched at once when the first of their tests asks
    (both mostly wait: 40 s and 30 s together instead of one after the other); each test
    waits for its own. One left running when the module ends (its test ran on another
    xdist worker) is stopped then."""
    stop = threading.Event()
    scripts = {"hang": (HANG, HANG_DEADLINE_S), "barrier": (BARRIER_ON_RANK_0, BARRIER_DEADLINE_S)}
    pool = ThreadPoolExecutor(max_workers=len(scripts))
    futures = {}
    for name, (text, deadline) in scripts.items():
        folder = tmp_path_factory.mktemp(name)
        script = folder / f"{name}.py"
        script.write_text(text)
        futures[name] = pool.submit(
            procs.python, script, timeout=deadline, log_dir=folder / "ranks", cwd=folder, stop=stop
        )
    try:
        yield futures
    finally:
        stop.set()
        pool.shutdown(wait=True)


def test_rank_that_never_joins_a_collective_is_killed_with_its_group(planted):
    # Long enough for both ranks to start and print on a loaded 2-core machine
    # (the lines below are asserted; HANG_DEADLINE_S); the hang itself would last an hour.
    result = planted["hang"].result()
    assert result.timed_out and not result.ok
    assert not procs.group_alive(result.pgid), "processes outlived the timeout"
    message = result.describe()
    assert "did not finish within" in message
    assert "rank 1 skips the all-reduce" in message
    assert "rank 0 waits in all_reduce" in message
    assert procs.HANG_CAUSE in message, "a hang's report names its likely cause"


BARRIER_ON_RANK_0 = (
    """
import os, datetime
import torch, torch.distributed as dist, torch.multiprocessing as mp
"""
    + FREE_PORT
    + """
def worker(rank, port):
    timeout = datetime.timedelta(seconds=float(os.environ["COURSE_PG_TIMEOUT"]))  # set by procs
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timeout)
    for step in range(3):
        print(f"rank {rank} at step {step}", flush=True)
        if rank == 0:
            dist.barrier()  # the classic bug: a collective only one rank calls
        dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(free_port(),), nprocs=2)
"""
)


def test_a_rank_0_only_barrier_is_reported_once_before_the_deadline(planted):
    """The launch's process-group timeout is half its deadline, so PyTorch names the stuck
    collective before the grader has to kill anything; the report shows both ranks and the cause."""
    result = planted["barrier"].result()
    assert not result.ok
    assert not procs.group_alive(result.pgid), "processes outlived the launch"
    message = result.failure()
    assert not result.timed_out, f"PyTorch's timeout should fire before the deadline\n{message}"
    assert "rank 0 at step 0" in message and "rank 1 at step" in message, message
    assert message.count(procs.HANG_CAUSE) == 1, message
    assert "shared launch failed" in result.failure(), "a second test gets one line, not a copy"


def test_pytest_timeouts_stretch_with_course_timeout_scale(tmp_path):
    """pytest-timeout's limits follow COURSE_TIMEOUT_SCALE like every launch's deadline."""
    planted = tmp_path / "test_97_slow.py"
    planted.write_text(
        "import time, pytest\n\n"
        "def test_default_limit():\n    time.sleep(1.6)\n\n"
        "@pytest.mark.timeout(1)\ndef test_marked_limit():\n    time.sleep(1.6)\n"
    )
    args = [sys.executable, "-m", "pytest", str(planted), "-q", "-p", "no:cacheprovider"]
    args += ["-p", "no:xdist", "-o", "addopts=", "-p", "course.grader.plugin", "-o", "timeout=1"]
    for scale, failed in (("1", 2), ("3", 0)):
        run = procs.run(args, timeout=60, cwd=tmp_path, env={"COURSE_TIMEOUT_SCALE": scale})
        assert f"{failed} failed" in run.output if failed else "2 passed" in run.output, (
            f"COURSE_TIMEOUT_SCALE={scale}: expected {failed} of 2 tests past their 1 s "
            f"limit to fail\n{run.describe()}"
        )
        assert failed == 0 or "Timeout" in run.output, run.describe()
