"""Warm starts (course/launch/warm/): a launch's Python processes are forks of a zygote
that imported torch, and behave as the fresh interpreters they replace.

Each script below prints whether torch was imported before its first line ran: that is
the proof a process started warm (a fresh interpreter has not imported it), so none of
these tests can pass with the zygote silently out of the way.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap

import pytest

from course import launch
from course.launch.warm import pool, protocol

pytestmark = pytest.mark.skipif(not protocol.allowed(), reason="no warm starts here")

COLD = {protocol.SWITCH_ENV: "0"}

ECHO = """
    import sys
    print("warm" if "torch" in sys.modules else "cold")
    import os, torch, torch.distributed as dist
    print(sys.argv, __name__, os.path.basename(__file__), sys.path[0] == os.path.dirname(__file__))
    print(os.getcwd(), os.environ.get("LESSON_FLAG"), repr(sys.stdin.read()))
    print(torch.get_num_threads(), dist.get_debug_level())
    print("to stderr", file=sys.stderr)
    sys.exit(3)
"""


def script(tmp_path, text: str, name: str = "s.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def both(path, *args, env=None, **kwargs):
    """(warm, cold) results of one command."""
    command = [sys.executable, str(path), *args]
    warm = launch.run(command, timeout=90, env=env, **kwargs)
    cold = launch.run(command, timeout=90, env={**(env or {}), **COLD}, **kwargs)
    return warm, cold


def test_a_warm_process_sees_what_a_fresh_one_sees(tmp_path):
    """argv, __main__, sys.path[0], cwd, environment, stdin, stderr, exit code: the same."""
    path = script(tmp_path, ECHO)
    warm, cold = both(path, "a", "--b", env={"LESSON_FLAG": "on"}, cwd=tmp_path)
    assert warm.output.splitlines()[0] == "warm", warm.describe()
    assert cold.output.splitlines()[0] == "cold", cold.describe()
    assert warm.returncode == cold.returncode == 3
    assert warm.output.splitlines()[1:] == cold.output.splitlines()[1:], (
        f"warm:\n{warm.output}\ncold:\n{cold.output}"
    )


def test_what_torch_reads_at_import_is_the_launchs_own(tmp_path, monkeypatch):
    """torch reads TORCH_DISTRIBUTED_DEBUG and the thread counts when imported: a launch
    that sets them gets them, from a zygote started with its environment or cold (a
    zygote whose imports started threads serves nobody: a fork would copy them). With
    room for one zygote, each new environment ends the idle one before."""
    monkeypatch.setattr(pool._Zygotes, "MOST", 1)
    path = script(tmp_path, ECHO)
    warm, cold = both(path, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, cwd=tmp_path)
    assert warm.output.splitlines()[0] == "warm", warm.describe()
    assert "1 DebugLevel.DETAIL" in warm.output.splitlines(), warm.output
    assert warm.output.splitlines()[1:] == cold.output.splitlines()[1:]
    threads = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}  # this machine: 1 in the zygote
    warm, cold = both(path, env=threads, cwd=tmp_path)
    assert f"{min(2, os.cpu_count())} DebugLevel.OFF" in warm.output.splitlines(), warm.output
    assert warm.output.splitlines()[1:] == cold.output.splitlines()[1:]
    live = [path for proc, path in pool._zygotes.running.values() if proc is not None]
    assert len(live) <= 1, live


def test_a_crash_and_a_signal_end_a_warm_process_as_they_end_a_cold_one(tmp_path):
    crash = script(tmp_path, "import sys\nprint(1)\nraise ValueError('no')\n", "crash.py")
    warm, cold = both(crash)
    assert warm.returncode == cold.returncode == 1
    # The traceback names the script only, not the zygote's frames nor runpy's.
    assert warm.output == cold.output, f"warm:\n{warm.output}\ncold:\n{cold.output}"
    term = script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n", "t.py")
    warm, cold = both(term)
    assert warm.returncode == cold.returncode == -signal.SIGTERM


def test_a_killed_launch_leaves_no_warm_process_behind(tmp_path):
    """The deadline kills the launch's group: the client, and (drained by launch.run
    before it returns) the zygote's child that ran the program."""
    pid_file = tmp_path / "pid"
    code = f"""
        import os, sys, time
        open({str(pid_file)!r}, "w").write(f"{{os.getpid()}} {{'torch' in sys.modules}}")
        time.sleep(120)
    """
    result = launch.run([sys.executable, str(script(tmp_path, code))], timeout=8)
    assert result.timed_out
    pid, warm = pid_file.read_text().split()
    assert warm == "True", "the sleeper did not start warm"
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid), 0)


def test_torchrun_workers_and_mp_spawn_children_start_warm(tmp_path):
    """The processes a lesson's launcher starts (torchrun's workers, mp.spawn's
    children) find the zygote through their environment and start warm too."""
    rank = script(
        tmp_path, 'import os, sys\nprint("rank", os.environ["RANK"], "torch" in sys.modules)\n'
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(rank)]  # fmt: skip
    result = launch.run(command, timeout=120)
    assert result.ok, result.describe()
    printed = "\n".join([result.output, *result.rank_logs.values()]).splitlines()
    assert sorted(line for line in printed if line.startswith("rank")) == [
        "rank 0 True",
        "rank 1 True",
    ], result.describe()
    spawn = script(tmp_path, """
        import sys
        warm = "torch" in sys.modules
        import torch.multiprocessing as mp

        def child(i):
            print("child", i, warm)

        if __name__ == "__main__":
            mp.spawn(child, nprocs=2)
    """, "spawn.py")  # fmt: skip
    result = launch.run([sys.executable, str(spawn)], timeout=120)
    assert result.ok, result.describe()
    assert sorted(line for line in result.output.splitlines() if line.startswith("child")) == [
        "child 0 True",
        "child 1 True",
    ], result.describe()


@pytest.mark.parametrize(
    ("argv", "served"),
    [
        (["python", "lesson.py", "--epochs", "1"], True),
        (["python", "-u", "lesson.py"], True),
        (["python", "-c", "print(1)"], True),
        (["python", "-m", "torch.distributed.run", "x.py"], True),
        (["python", "-m", "pytest", "tests"], False),  # the grader
        (["python", "-m", "course", "grade", "03"], False),  # the course's tools
        (["python", "/venv/bin/course", "grade"], False),
        (["python", "-"], False),  # a program on stdin
        (["python", "-Wignore", "lesson.py"], False),
        (["python"], False),
    ],
)
def test_the_zygote_serves_programs_and_leaves_the_rest_cold(argv, served):
    assert (protocol.cold_reason(argv) is None) == served, protocol.cold_reason(argv)


def test_a_new_environment_ends_an_idle_zygote_never_one_in_use(tmp_path, monkeypatch):
    """pool._Zygotes keeps at most MOST zygotes: a launch with a new environment ends the
    least recently used idle one, and starts cold when every one serves a launch now.
    (The zygotes are stand-ins here: this is the bookkeeping, not the fork.)"""

    class Zygote:
        alive = True

        def poll(self):
            return None if self.alive else 0

    def start(env):
        path = tmp_path / f"zygote{len(list(tmp_path.iterdir()))}"
        path.touch()
        return Zygote(), str(path)

    def stop(proc, folder):
        proc.alive = False

    zygotes = pool._Zygotes()
    monkeypatch.setattr(zygotes, "MOST", 2)
    monkeypatch.setattr(zygotes, "start", start)
    monkeypatch.setattr(zygotes, "stop", stop)
    env = dict(os.environ)
    first = zygotes.socket_for({**env, "LESSON_FLAG": "1"})
    second = zygotes.socket_for({**env, "LESSON_FLAG": "2"})
    assert first and second and first != second
    assert zygotes.socket_for({**env, "LESSON_FLAG": "3"}) is None, "ended a zygote in use"
    zygotes.release(first)
    third = zygotes.socket_for({**env, "LESSON_FLAG": "3"})
    assert third not in (None, first, second)
    alive = [path for proc, path in zygotes.running.values() if proc.poll() is None]
    assert sorted(alive) == sorted([second, third]), zygotes.running
