"""python -m course spy SCRIPT [ARGS...]: where each rank of a stuck job is waiting.

    python -m course spy lessons/09_debugging/hang.py

Runs `python SCRIPT ARGS...` and, once a second, asks py-spy (`pip install py-spy`) for
the main thread's stack of each of its processes, without stopping them. Once ranks
0, 1, ... have stood in the same torch.distributed calls at two looks in a row (each
waiting in a collective, none still joining the group), it prints each rank's stack,
innermost call first, ends the job (its whole process group) and exits 0. A rank is
named by the `rank` variable py-spy finds in its frames. If the job ends, or nothing is
stuck within --wait seconds, it says so, shows where the ranks were at the last look,
and exits 1.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from course.launch.warm import protocol

FRAME = re.compile(r"^\s+(\S.*) \((.+):(\d+)\)$")
RANK = re.compile(r"^\s+rank: (\d+)$", re.M)
# Frames of the launcher's plumbing, not the script's: left out of what is printed.
PLUMBING = ("multiprocessing/", "<frozen ", "<string>", "runpy", "torch/multiprocessing/")


def parser() -> argparse.ArgumentParser:
    from course.options import ArgumentParser, positive_float

    p = ArgumentParser(prog="python -m course spy", description=__doc__.splitlines()[0])
    # A rank's imports alone took over 60 s beside the suite's other recordings (2 cores).
    p.add_argument("--wait", type=positive_float, default=150, help="seconds to wait (150)")
    p.add_argument("script", help="a distributed script (a lesson's, or your own)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def children(root: int) -> list[int]:
    """Every process below `root`, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone since the listing
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def main_thread(pid: int) -> tuple[int | None, list[tuple[str, str, str]]] | None:
    """(the rank py-spy finds in its locals, the main thread's frames), or None when the
    process is not Python or has gone."""
    done = subprocess.run(
        [py_spy(), "dump", "--locals", "--pid", str(pid)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if done.returncode != 0 or "MainThread" not in done.stdout:
        return None
    main = done.stdout.split('"MainThread"', 1)[1].split("\nThread ", 1)[0]
    rank = RANK.search(main)
    frames = [m.groups() for m in map(FRAME.match, main.splitlines()) if m]
    return (int(rank[1]) if rank else None), frames


# Joining the group: a rank here waits for peers that may still be importing torch (on
# a loaded machine, seconds behind), so it is not stuck yet. A CI run once took rank 2,
# alone in init_process_group while ranks 0 and 1 started, for the whole job.
JOINING = ("init_process_group", "rendezvous", "_create_c10d_store")


def waiting(frames) -> bool:
    """In a torch.distributed call: the innermost frame is there, and not an import, and
    the rank has joined its group (no frame of init_process_group's rendezvous)."""
    name, file, _ = frames[0]
    joining = any(n in JOINING or "distributed/rendezvous.py" in f for n, f, _ in frames)
    return "torch/distributed/" in file and name != "<module>" and not joining


def stuck(ranks: list[tuple[int, list]]) -> bool:
    """Every rank found waits in a collective, and they are ranks 0, 1, ..., n-1: a rank
    missing from the middle is a process still starting, not a rank that moved on."""
    found = sorted(rank for rank, _ in ranks)
    return (
        bool(ranks)
        and found == list(range(len(found)))
        and all(waiting(frames) for _, frames in ranks)
    )


def shown(frames) -> list[str]:
    return [f"    {name} ({file}:{line})" for name, file, line in frames
            if not any(p in file for p in PLUMBING)]  # fmt: skip


def show(ranks) -> None:
    for rank, frames in ranks:
        print(f"rank {rank}, main thread, innermost call first:")
        print("\n".join(shown(frames)))


def py_spy() -> str | None:
    """py-spy's path: on PATH, or beside this Python (a venv that is not activated)."""
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.is_file() else None)


def unavailable() -> str | None:
    """Why py-spy cannot show a stack here (not installed, or not allowed to read another
    process: ptrace, in some containers), or None when it can."""
    if py_spy() is None:
        return "py-spy is not installed (pip install py-spy)"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        done = subprocess.run([py_spy(), "dump", "--pid", str(sleeper.pid)],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
    finally:
        sleeper.kill()
        sleeper.wait()
    if done.returncode != 0:
        return f"py-spy cannot read a process here: {(done.stderr or done.stdout).strip()[:200]}"
    return None


def cold_env() -> dict[str, str]:
    """This environment, for a job whose every process starts cold: py-spy must find the
    ranks among the job's processes, not in a zygote's children (course/launch/warm/)."""
    return {k: v for k, v in os.environ.items() if k != protocol.SOCKET_ENV}


def spy(args) -> int:
    if py_spy() is None:
        raise FileNotFoundError("py-spy is not installed (pip install py-spy)")
    if not Path(args.script).is_file():
        raise FileNotFoundError(f"{args.script}: no such script")
    with tempfile.TemporaryFile() as output:
        job = subprocess.Popen(
            [sys.executable, args.script, *args.args],
            stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
            env=cold_env(),
        )  # fmt: skip
        try:
            deadline, before, ranks = time.monotonic() + args.wait, None, []
            while time.monotonic() < deadline and job.poll() is None:
                time.sleep(1)
                stacks = [s for s in map(main_thread, children(job.pid)) if s and s[1]]
                ranks = sorted((s for s in stacks if s[0] is not None), key=lambda s: s[0])
                if stuck(ranks) and before == ranks:
                    show(ranks)
                    return 0
                before = ranks if stuck(ranks) else None
            output.seek(0)
            tail = output.read().decode(errors="replace").strip().splitlines()[-5:]
            what = "ended" if job.poll() is not None else f"was not stuck within {args.wait:g} s"
            print(f"python -m course spy: the job {what}; its last lines:", *tail, sep="\n")
            if ranks:  # a rendezvous that never completes, for one: where it waited
                print("where its ranks were at the last look:")
                show(ranks)
            return 1
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def main(argv: list[str] | None = None) -> int:
    return spy(parser().parse_args(argv))
