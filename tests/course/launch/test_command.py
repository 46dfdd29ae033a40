"""course.launch and course.ranks: deadlines, process groups, ports, rank logs."""

from __future__ import annotations

import socket
import sys
import textwrap

import pytest

from course import REPO_ROOT, launch, ranks


def test_output_and_exit_code_are_captured():
    result = launch.run([sys.executable, "-c", "print('hello'); raise SystemExit(4)"], timeout=30)
    assert result.returncode == 4 and not result.ok and not result.timed_out
    assert "hello" in result.output
    assert "exited with code 4" in result.describe()


def test_timeout_kills_children_and_grandchildren(tmp_path):
    # The child starts a grandchild that would outlive it, then hangs.
    script = tmp_path / "tree.py"
    script.write_text(
        textwrap.dedent(
            """
            import subprocess, sys, time
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            print("started", flush=True)
            time.sleep(600)
            """
        )
    )
    result = launch.python(script, timeout=5)
    assert result.timed_out and result.returncode is None
    assert "started" in result.output
    assert not launch.group_alive(result.pgid)


def test_after_import_counts_from_the_end_of_import_torch(tmp_path):
    """`after_import` bounds what a child does once `import torch` returns, whatever its
    start cost. A stand-in torch package (first on PYTHONPATH) sleeps 2 s at import, as a
    loaded machine's real import would, so the test itself imports nothing heavy."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("import time\ntime.sleep(2)\n")
    # Cold: a warm start (course/launch/warm/) would find torch imported already.
    env = {"PYTHONPATH": str(tmp_path), "COURSE_WARM_START": "0"}
    quick = "import time, torch; time.sleep(0.5); print('done')"
    result = launch.run([sys.executable, "-c", quick], timeout=60, after_import=1.5, env=env)
    assert result.ok, result.describe()  # 2.5 s in all, but 0.5 s after the import
    assert result.ready is not None and result.ready >= 2.0 and result.after_ready < 1.5
    stuck = "import time, torch; print('imported', flush=True); time.sleep(60)"
    result = launch.run([sys.executable, "-c", stuck], timeout=60, after_import=1.5, env=env)
    assert result.timed_out and result.killed_after_import and result.seconds < 20
    assert "imported" in result.output and "after it imported torch" in result.describe()
    assert not launch.group_alive(result.pgid)


def test_ready_comes_after_the_start_up_imports_of_a_distributed_lesson():
    """The moment `after_import` counts from follows torch._dynamo's import too (what every
    distributed lesson imports next): a process that imports only torch has it already."""
    check = "import sys, torch; print('dynamo' if 'torch._dynamo' in sys.modules else 'not')"
    result = launch.run([sys.executable, "-c", check], timeout=60, after_import=30)
    assert result.ok and result.output.split()[-1] == "dynamo", result.describe()
    assert result.ready is not None, result.describe()


def test_a_finished_command_leaves_no_orphans(tmp_path):
    script = tmp_path / "orphan.py"
    script.write_text(
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    )
    result = launch.python(script, timeout=30)
    assert result.ok
    assert not launch.group_alive(result.pgid)


def test_children_get_one_thread_and_gpu_safety_settings(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env = launch.child_env({"EXTRA": "x"})
    assert env["OMP_NUM_THREADS"] == "1" and env["EXTRA"] == "x"
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["PYTHONPATH"].split(":")[0] == str(REPO_ROOT)


def test_timeout_scale(monkeypatch):
    monkeypatch.setenv("COURSE_TIMEOUT_SCALE", "2.5")
    assert launch.timeout_scale() == 2.5
    monkeypatch.setenv("COURSE_TIMEOUT_SCALE", "fast")
    assert launch.timeout_scale() == 1.0


def test_free_port_can_be_bound():
    port = ranks.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
    assert 0 < port < 65536


def test_process_group_timeout(monkeypatch):
    monkeypatch.setenv("COURSE_PG_TIMEOUT", "7")
    assert ranks.process_group_timeout().total_seconds() == 7


def test_each_rank_writes_its_own_log(tmp_path):
    """A process that knows its rank ($RANK, as torchrun sets it) writes to its own log;
    the lesson calls nothing (course/probes/rank_output.py is installed at start-up)."""
    code = "import sys\nprint('to the log')\nprint('err', file=sys.stderr)\n"
    env = {"RANK": "3"}
    result = launch.run([sys.executable, "-c", code], timeout=30, log_dir=tmp_path, env=env)
    assert result.ok, result.describe()
    assert "to the log" not in result.output
    assert result.rank_logs["rank3"].split() == ["to", "the", "log", "err"]


def test_a_students_environment_keeps_its_own_thread_settings(monkeypatch):
    """one_thread=False: `course run` and `course bench` leave threads to the lesson."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert "OMP_NUM_THREADS" not in launch.child_env(one_thread=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    assert launch.child_env(one_thread=False)["OMP_NUM_THREADS"] == "8"
    env = launch.child_env({"OMP_NUM_THREADS": None}, one_thread=False)  # None unsets
    assert "OMP_NUM_THREADS" not in env and env["NCCL_NVLS_ENABLE"] == "0"


RACE_SCRIPT = """
import os, sys, time
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    if os.environ["LOCAL_RANK"] == "0":
        if sys.argv[1] == "race":  # as if stopped between opening its error file and writing it
            open(os.environ["TORCHELASTIC_ERROR_FILE"], "w").close()
        open("rank0-ready", "w").close()
        time.sleep(60)
    # Fail only once rank 0 is in place: under load its start can lag rank 1's by seconds,
    # and an agent that stops rank 0 before it opened its error file sees no race.
    for _ in range(600):
        if os.path.exists("rank0-ready"):
            break
        time.sleep(0.05)
    os._exit(1)

main()
"""


def test_torchrun_agent_race_is_recognised_and_launched_again(tmp_path):
    """torchrun's agent dies when it reads an empty error file (a PyTorch race that
    the lesson-04 fault runs can hit): run_torchrun sees it and launches once more."""
    import inspect

    from torch.distributed.elastic.multiprocessing.api import SubprocessContext

    if inspect.getsource(SubprocessContext._poll).count("_capture_process_failures(") < 2:
        pytest.skip("this PyTorch's agent reads no error file of a worker it stopped: no race")
    script = tmp_path / "race.py"
    script.write_text(RACE_SCRIPT)
    fresh_calls = []

    def fresh():  # as the lesson-04 runs put their folder back
        fresh_calls.append(1)
        (tmp_path / "rank0-ready").unlink(missing_ok=True)

    def attempt(case):
        args = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        args += ["--nproc_per_node=2", "--max-restarts=0", str(script), case]
        return launch.run_torchrun(fresh=fresh, args=args, timeout=60, cwd=tmp_path)

    raced = attempt("race")
    assert fresh_calls == [1], raced.describe()
    assert launch.torchrun_agent_raced(raced), raced.describe()
    assert raced.output.startswith("course: torchrun's agent died"), raced.output[:300]
    assert raced.seconds < 30, "torchrun should stop the sleeping rank, not wait for it"

    (tmp_path / "rank0-ready").unlink()
    failed = attempt("plain")  # rank 1 fails, rank 0 leaves no error file: no race
    assert fresh_calls == [1] and not launch.torchrun_agent_raced(failed), failed.describe()
    assert failed.returncode != 0 and "ChildFailedError" in failed.output, failed.describe()


def test_children_run_as_the_configured_user_when_grading_as_root(tmp_path, monkeypatch):
    """COURSE_CHILD_USER=nobody (the container would use `student`): a child gets that
    uid, can work in its folder under pytest's root-only temp area, and cannot write a
    file the grader owns."""
    import os
    import pwd
    from pathlib import Path

    if os.geteuid() != 0:
        pytest.skip("dropping to another user needs root (a grader run as root)")
    nobody = pwd.getpwnam("nobody")
    folder = tmp_path / "child"
    folder.mkdir()
    results = tmp_path / "results.json"
    results.write_text("{}")
    monkeypatch.setenv(launch.CHILD_USER_ENV, "nobody")
    code = (
        f"import os; print(os.getuid()); open('mine.txt', 'w').write('ok'); "
        f"open({str(results)!r}, 'w').write('forged')"
    )
    # any interpreter 'nobody' may run: the test is about the uid, not about torch
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    try:
        result = launch.run([python, "-c", code], timeout=30, cwd=folder)
    except PermissionError as err:
        pytest.skip(f"no interpreter here that 'nobody' may run ({err})")
    assert result.output.splitlines()[0] == str(nobody.pw_uid), result.describe()
    assert (folder / "mine.txt").read_text() == "ok", "the child could not use its own folder"
    assert "PermissionError" in result.output and results.read_text() == "{}", result.output


def test_run_all_fail_fast_stops_the_rest_of_the_job():
    """Two launches of one job: when one fails, the other is stopped at once, not
    left waiting for its peer until the deadline."""
    jobs = {
        "fails": dict(args=[sys.executable, "-c", "raise SystemExit(3)"], timeout=60),
        "waits": dict(args=[sys.executable, "-c", "import time; time.sleep(60)"], timeout=60),
    }
    results = launch.run_all(jobs, fail_fast=True)
    assert results["fails"].returncode == 3
    waits = results["waits"]
    assert waits.seconds < 20 and not waits.timed_out and not waits.ok, waits.describe()
    assert "stopped, because another launch of the same job failed" in waits.output


FORKED = """
import os, sys, time
from course import launch

def hello():
    print("hello from", os.getcwd(), flush=True)
    return 3

def grandchild_then_hang():
    if os.fork() == 0:
        time.sleep(3600)
    print("waiting", flush=True)
    time.sleep(3600)

launch.become_subreaper()  # as the grader is: the orphaned grandchild comes back here
assert launch.can_fork()
done = launch.forked(hello, args=["hello"], timeout=30, cwd=sys.argv[1])
print("done", done.returncode, done.timed_out, repr(done.output))
hung = launch.forked(grandchild_then_hang, args=["hang"], timeout=1)
print("hung", hung.returncode, hung.timed_out, launch.group_alive(hung.pgid), repr(hung.output))
print("described", "did not finish within" in hung.describe())
"""


def test_a_forked_function_has_its_output_exit_code_deadline_and_group_kill(tmp_path):
    """launch.forked (the grader's import check, course/grader/warm.py) keeps launch.run's
    promises: output captured, the function's int is the exit code, and at the deadline
    the child and what it started are killed. Run in a child: an xdist worker has threads,
    and can_fork() refuses those."""
    script = tmp_path / "forked.py"
    script.write_text(FORKED)
    result = launch.python(script, tmp_path, timeout=60)
    assert result.returncode == 0, result.describe()
    assert f"done 3 False 'hello from {tmp_path}\\n'" in result.output
    assert "hung None True False 'waiting\\n'" in result.output
    assert "described True" in result.output


NATIVE_THREAD = """
import _thread, threading, time
from course import launch
print("before", launch.can_fork())
_thread.start_new_thread(time.sleep, (60,))  # an OS thread that threading does not list
time.sleep(0.2)
print("python threads", threading.active_count(), "fork", launch.can_fork())
"""


def test_forking_is_refused_where_native_threads_run():
    """A thread Python's threading module does not know (CUDA's, OpenMP's) also stops
    can_fork(): the OS's count is read, not threading.active_count(). In a child, alone."""
    result = launch.run([sys.executable, "-c", NATIVE_THREAD], timeout=60)
    assert result.ok, result.describe()
    assert "before True" in result.output, result.output
    assert "python threads 1 fork False" in result.output, result.output


def test_forking_is_refused_where_threads_run():
    import threading

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert not launch.can_fork()
        with pytest.raises(RuntimeError, match="single-threaded"):
            launch.forked(lambda: 0, args=["x"], timeout=1)
    finally:
        stop.set()
        thread.join()


def test_a_hangs_report_says_what_was_seen_and_points_only_to_lines_it_shows():
    from course.launch.result import HANG_CAUSE, HANG_NO_LINES, HANG_WHERE, RunResult

    alone = RunResult(["python", "ring.py"], None, "step 1\n", True, 90.0, 90.0, 0)
    text = alone.describe()
    assert HANG_CAUSE in text and HANG_NO_LINES in text and HANG_WHERE not in text, text
    assert "if rank == 0" not in text  # a cause the grader never checked
    logged = RunResult(["python", "ring.py"], None, "", True, 90.0, 90.0, 0,
                       rank_logs={"rank 0": "waiting in recv"})  # fmt: skip
    text = logged.describe()
    assert HANG_WHERE in text and "waiting in recv" in text and HANG_NO_LINES not in text, text


def test_the_launcher_works_without_its_optional_warm_start():
    """launch/warm/ builds on the launcher, never the other way: a process that never
    loads the warm start launches cold, and nothing of launch/warm/ is imported."""
    code = textwrap.dedent(
        """
        import sys
        from course import launch
        result = launch.run([sys.executable, "-c", "import os; print(os.environ.get('X'))"],
                            timeout=60, cwd=".", env={"X": "cold"})
        print(result.output.strip(), result.ok)
        print(sorted(m for m in sys.modules if m.startswith("course.launch.warm")))
        """
    )
    # The child itself starts cold: a zygote's fork holds the warm start's modules.
    env = {"COURSE_WARM_START": "0"}
    result = launch.run([sys.executable, "-c", code], timeout=120, cwd=REPO_ROOT, env=env)
    assert result.ok, result.describe()
    assert result.output.split("\n")[:2] == ["cold True", "[]"], result.output
