"""Run a command the way the grader does: in its own session, under a
deadline, with every process it started killed afterwards.

Distributed code fails by hanging more often than by crashing: one rank waits
in a collective that another rank never reaches. So every launch here has a
deadline, and on timeout the whole process group (the launcher, its ranks and
their DataLoader workers) is killed, and the last lines of each rank's log are
kept for the error message.

Over 300 lines, on purpose: launching, the deadline, the group kill, the rank logs
and the failure report are one contract (RunResult); apart, each part would reach
into the others' state.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from course import REPO_ROOT, warmstart

SITE_DIR = Path(__file__).parent / "probes" / "_site"

# Each rank writes its output to <dir>/rank<N>.log when this is set (see
# course/probes/rank_output.py), so a hang can be blamed on a rank.
RANK_LOG_ENV = "COURSE_RANK_LOG_DIR"
# The child writes when it finished importing torch here (course/probes/__init__.py).
READY_ENV = "COURSE_READY_LOG"

# One thread per rank: several ranks on two cores otherwise fight over them.
QUIET_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

# NVLink multicast (NVLS) can take a shared GPU host down; keep it off in
# every process we start, whatever the caller's environment says.
SAFE_GPU_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


# A hang is a rank waiting in a collective that another rank never reaches.
# The process-group timeout (course.ranks.process_group_timeout) is set to half
# the deadline of every launch here, so PyTorch's own error, which names the
# operation, arrives before the deadline kills the group.
PG_TIMEOUT_SHARE = 0.5
TIMEOUT_SIGNS = ("Timed out waiting", "Watchdog caught collective operation timeout", "timed out")
HANG_CAUSE = (
    "likely cause: a rank waits in a collective (all_reduce, barrier, broadcast...) that "
    "another rank never reaches: a collective inside `if rank == 0:`, or ranks that take "
    "different numbers of steps. Each rank's last lines above show where it stopped."
)


def timeout_scale() -> float:
    """Slow machines can stretch every deadline with COURSE_TIMEOUT_SCALE=2."""
    try:
        return max(float(os.environ.get("COURSE_TIMEOUT_SCALE", "1")), 0.1)
    except ValueError:
        return 1.0


@dataclass
class RunResult:
    args: list[str]
    returncode: int | None
    output: str
    timed_out: bool
    seconds: float
    timeout: float
    pgid: int
    rank_logs: dict[str, str] = field(default_factory=dict)

    reported: bool = False
    started: float = 0.0  # time.time() at the start: to compare with what the child logged
    ready: float | None = None  # seconds until the child had imported torch (`after_import`)
    after_import: float | None = None  # the deadline after that, scaled

    @property
    def killed_after_import(self) -> bool:
        """Timed out by the `after_import` deadline (not by the whole run's)."""
        if not self.timed_out or self.ready is None or self.after_import is None:
            return False
        return self.ready + self.after_import < self.timeout

    @property
    def after_ready(self) -> float | None:
        """Seconds the child ran after importing torch, when `after_import` measured it."""
        return None if self.ready is None else max(0.0, self.seconds - self.ready)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def failure(self, lines: int = 12) -> str:
        """describe() the first time; after that one line, so that several tests
        sharing one failed launch show its story once."""
        if self.reported:
            return "the shared launch failed: its output is in the first failing test's message"
        self.reported = True
        return self.describe(lines)

    def describe(self, lines: int = 12) -> str:
        """A short account of what happened, for a failing test's message."""
        command = " ".join(Path(a).name if os.sep in a else a for a in self.args)
        if self.timed_out and self.killed_after_import:
            head = (
                f"`{command}` was still running {self.after_import:.0f} s after it imported "
                f"torch ({self.ready:.1f} s after its start), and was killed"
            )
        elif self.timed_out:
            head = f"`{command}` did not finish within {self.timeout:.0f} s and was killed"
        else:
            head = f"`{command}` exited with code {self.returncode} after {self.seconds:.1f} s"
        parts = [head]
        for name, text in [("output", self.output), *sorted(self.rank_logs.items())]:
            tail = [line for line in text.rstrip().splitlines() if line.strip()][-lines:]
            if tail:
                parts.append(f"--- last lines of {name} ---")
                parts.extend(tail)
        if self.timed_out or self.collective_timed_out:
            parts.append(HANG_CAUSE)
        return "\n".join(parts)

    @property
    def collective_timed_out(self) -> bool:
        """PyTorch's own process-group timeout fired in some rank (gloo or NCCL)."""
        text = "\n".join([self.output, *self.rank_logs.values()])
        return any(sign in text for sign in TIMEOUT_SIGNS)


def group_alive(pgid: int) -> bool:
    _reap(pgid)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap(pgid: int) -> None:
    """Collect the exit status of this group's dead processes that are our children
    (orphans adopted by a subreaper): otherwise they linger as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_group(pgid: int, grace: float = 3.0) -> None:
    """SIGTERM the group, give it `grace` seconds to exit, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return
            time.sleep(0.05)


def become_subreaper() -> bool:
    """Make this process adopt every orphan among its descendants (Linux).

    A child that double-forks or calls setsid leaves its process group, and
    kill_group cannot reach it; as a subreaper this process still finds it
    (kill_descendants). False where the platform has no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    pr_set_child_subreaper = 36
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) == 0


def descendants(pid: int | None = None) -> list[int]:
    """Every living descendant of `pid` (this process by default), from /proc."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) "
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants() -> list[int]:
    """SIGKILL every descendant of this process; returns their pids."""
    pids = descendants()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:  # reap the ones that are our children (the adopted orphans)
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    return pids


CHILD_USER_ENV = "COURSE_CHILD_USER"


def child_user(*folders: str | Path | None) -> dict:
    """Popen's user/group options when the grader runs as root with COURSE_CHILD_USER set.

    In the course container the `grade` service grades as root and sets
    COURSE_CHILD_USER=runner: every child then runs as that unprivileged
    user, who cannot write the results file, the grader's code or the
    reference solutions, nor signal the grader. The child's working folders
    are handed to that user. Elsewhere (a laptop, CI as an ordinary user)
    children run as the grader's own user: see docs/threat-model.md."""
    name = os.environ.get(CHILD_USER_ENV)
    if not name or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return {}
    import pwd

    entry = pwd.getpwnam(name)  # KeyError: a user that does not exist is a setup error
    for folder in folders:
        if folder is None or not Path(folder).exists():
            continue
        folder = Path(folder).resolve()
        os.chown(folder, entry.pw_uid, entry.pw_gid)
        for parent in folder.parents:  # e.g. pytest's /tmp/pytest-of-root is 0700:
            mode = parent.stat().st_mode  # let the child pass through (not list) it
            if not mode & 0o001:
                os.chmod(parent, (mode & 0o7777) | 0o001)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


# Limits every child runs under: no core dumps, and no file larger than
# this (a runaway writer fills no disk). CPU time is bounded by each run's
# deadline, which kills the whole group.
FILE_SIZE_LIMIT = 4 << 30


def limit(pid: int) -> None:
    """Apply the children's resource limits to a just-started process (inherited by
    everything it starts later)."""
    import resource

    if not hasattr(resource, "prlimit"):
        return
    for what, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT)):
        try:
            soft, hard = resource.prlimit(pid, what)
            cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.prlimit(pid, what, (cap, hard))
        except (OSError, ValueError):
            pass


# torchrun's agent shares its rendezvous store with the workers by default,
# and a restarted group can then read the previous attempt's addresses and
# fail to connect ("Connection refused" in gloo or NCCL; pytorch/pytorch#135712,
# #167288). With this set, every attempt gets a fresh store.
ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def child_env(
    extra: dict[str, str | None] | None = None,
    one_thread: bool = True,
    course_root: str | Path | None = None,
) -> dict[str, str]:
    """The environment for a child: the caller's, plus the course's settings.

    one_thread=False leaves the thread count to the child, as a student's
    shell would: `course run` and `course bench` launch lessons that way, so
    a lesson that forgets to share the CPU between its ranks shows it.
    """
    threads = QUIET_ENV if one_thread else {"PYTHONUNBUFFERED": "1"}
    env = {**os.environ, **threads, **ELASTIC_ENV, **(extra or {}), **SAFE_GPU_ENV}
    env = {key: value for key, value in env.items() if value is not None}  # None: unset it
    # The caller's pytest options (a --junitxml for the suite, say) are not the grade's:
    # a nested grading gets only the options its command line gives.
    env.pop("PYTEST_ADDOPTS", None)
    env.pop(warmstart.SOCKET_ENV, None)  # `run` gives a launch its own zygote, or none
    env.pop(warmstart.LAUNCH_ENV, None)
    for key in [key for key in env if key.startswith("PYTEST_XDIST_")]:
        del env[key]  # a child is never the suite's xdist worker (see can_fork)
    # The lesson scripts import `course`; make that work for a student folder
    # anywhere on disk and on machines where the package is not pip-installed.
    # SITE_DIR's sitecustomize installs the grader's probes (course/probes/__init__.py),
    # armed only by their COURSE_* variables.
    # course_root: another copy of the course (a class deployment without solutions/)
    # whose grader the child runs: its `course` must come first, and this one's not at all,
    # or the sitecustomize on this one's path would import this course before the other.
    root = Path(course_root) if course_root is not None else REPO_ROOT
    ours = {str(REPO_ROOT), str(SITE_DIR)}
    paths = [str(root), str(root / "course" / "probes" / "_site")]
    paths += (p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in ours)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


class Cancel:
    """A reason to end every launch at once: the grader sets one per lesson and cancels it
    when the submission is known broken (it hangs or fails at import, course/grader/plugin.py),
    so that the lesson's other tests fail in a second instead of each waiting out its
    deadline."""

    def __init__(self, broken: dict[str, str] | None = None):
        self.event = threading.Event()
        self.reason = ""
        # Files of a lesson of several known broken ({path: why}): a launch that names one
        # is not started, whatever test asks for it (a launch shared by the lesson's
        # exercises among them), while the others run.
        self.broken = dict(broken or {})

    def set(self, reason: str) -> None:
        self.reason = reason
        self.event.set()

    def refuses(self, args) -> str | None:
        """Why a launch of `args` must not start, or None."""
        if self.event.is_set():
            return self.reason
        return next((self.broken[str(a)] for a in args if str(a) in self.broken), None)


# The Cancel of the test running now in this process (tests run one at a time per
# process; the grader sets it before each test and clears it after), or None.
current_cancel: Cancel | None = None


def _not_launched(args, timeout: float, reason: str) -> RunResult:
    output = f"course: not launched: {reason}\n"
    return RunResult([str(a) for a in args], None, output, False, 0.0, timeout, 0)


def run(
    args: list[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    log_dir: str | Path | None = None,
    one_thread: bool = True,
    stop: threading.Event | None = None,
    cancellable: bool = True,
    course_root: str | Path | None = None,
    after_import: float | None = None,
) -> RunResult:
    """Run `args` to completion or until `timeout` seconds pass (scaled by
    COURSE_TIMEOUT_SCALE), then make sure nothing it started is still alive.
    A launch also ends when `stop` is set, or the grader's `current_cancel` (unless
    cancellable=False). course_root: the child runs another copy of the course.

    after_import: a second deadline, that many seconds (scaled) after the child finished
    importing torch (the COURSE_READY_LOG probe): a bound on what the child does, which
    a loaded machine's slow start does not eat into. `timeout` still bounds the whole."""
    timeout = timeout * timeout_scale()
    cancel = current_cancel if cancellable else None
    if cancel is not None and cancel.refuses(args):
        return _not_launched(args, timeout, cancel.refuses(args))
    extra = dict(env or {})
    extra.setdefault("COURSE_PG_TIMEOUT", f"{max(5.0, timeout * PG_TIMEOUT_SHARE):.0f}")
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        extra[RANK_LOG_ENV] = str(log_dir)
    ready_file = None
    if after_import is not None:
        after_import *= timeout_scale()
        ready_file = Path(tempfile.mkdtemp(prefix="course-ready-")) / "ready"
        extra[READY_ENV] = str(ready_file)
    env = child_env(extra, one_thread, course_root)
    # Warm only for the grader's one-thread launches: `course run` and `course bench`
    # start a lesson as a student's shell would.
    warm = _zygotes.socket_for(env) if one_thread else None
    if warm is not None:  # its Python processes start with torch imported (course/warmstart.py)
        env[warmstart.SOCKET_ENV] = warm
        env[warmstart.LAUNCH_ENV] = launch = os.urandom(8).hex()
    start, started = time.monotonic(), time.time()
    user = child_user(cwd, log_dir, ready_file and ready_file.parent)
    # A file, not a pipe: a chatty child can never block on a full pipe buffer.
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            [str(a) for a in args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
            start_new_session=True,
            **user,
        )
        pgid = proc.pid
        limit(proc.pid)
        timed_out = stopped = cancelled = False
        deadline = start + timeout
        watched = stop is not None or cancel is not None or ready_file is not None
        ready = None  # seconds from the start to the end of the child's `import torch`
        try:
            while True:  # `stop`: another launch of the same job failed, end this one too
                if ready is None and ready_file is not None:
                    ready = _ready_at(ready_file, started)
                    if ready is not None:
                        deadline = min(deadline, start + ready + after_import)
                left = deadline - time.monotonic()
                try:
                    proc.wait(timeout=max(0.0, min(left, 0.2 if watched else left)))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= deadline:
                        timed_out = True
                        break
                    if stop is not None and stop.is_set():
                        stopped = True
                        break
                    if cancel is not None and cancel.event.is_set():
                        cancelled = True
                        break
        finally:
            if proc.poll() is None:  # stopped or timed out: end the launcher first, so
                proc.terminate()  # that its exit status is collected here, not reaped
                try:  # with the group's leftovers by kill_group
                    proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            # Also on success: a rank or worker that outlived its launcher is an orphan.
            kill_group(pgid)
            proc.wait()
            if warm is not None:  # the clients are gone; their children too, by now
                warmstart.drain(warm, launch)
                _zygotes.release(warm)
        out.seek(0)
        output = out.read().decode(errors="replace")
        if stopped:
            output += "\ncourse: stopped, because another launch of the same job failed\n"
        if cancelled:
            output += f"\ncourse: stopped: {cancel.reason}\n"
    if ready_file is not None:
        if ready is None:
            ready = _ready_at(ready_file, started)
        shutil.rmtree(ready_file.parent, ignore_errors=True)
    logs = {}
    if log_dir is not None:
        for path in sorted(Path(log_dir).glob("*.log")):
            logs[path.stem] = path.read_text(errors="replace")
    return RunResult(
        args=[str(a) for a in args],
        returncode=None if timed_out or cancelled else proc.returncode,
        output=output,
        timed_out=timed_out,
        seconds=time.monotonic() - start,
        timeout=timeout,
        pgid=pgid,
        rank_logs=logs,
        started=started,
        ready=ready,
        after_import=after_import,
    )


class _Zygotes:
    """This process's zygotes (course/warmstart.py), one per environment (warmstart.key):
    each started at the first launch that needs it, and ended when this process ends."""

    # At most this many at once (each holds torch in memory, about 0.4 GB): a launch with
    # yet another environment ends the one used least recently, unless every one is in use.
    MOST = 4

    def __init__(self):
        self.lock = threading.Lock()
        self.owner, self.running = None, {}  # key -> (Popen, socket path), oldest use first
        self.busy: dict[str, int] = {}  # socket path -> launches using it now

    def socket_for(self, env: dict[str, str]) -> str | None:
        """The socket of the zygote for a launch with environment `env`, or None (cold).
        A socket returned is in use until release(socket)."""
        if not warmstart.allowed(env):
            return None
        key = json.dumps(warmstart.key(env))
        with self.lock:
            if self.owner != os.getpid():  # the zygotes of a fork's parent are not ours
                self.owner, self.running, self.busy = os.getpid(), {}, {}
            if key not in self.running:  # (an entry whose zygote failed stays: cold, for good)
                live = [k for k, (proc, _) in self.running.items() if proc is not None]
                idle = [k for k in live if not self.busy.get(self.running[k][1])]
                while len(live) >= self.MOST and idle:
                    live.remove(idle[0])
                    proc, path = self.running.pop(idle.pop(0))
                    self.stop(proc, os.path.dirname(path))
                if len(live) >= self.MOST:
                    return None
                self.running[key] = self.start(warmstart.key(env))
            self.running[key] = self.running.pop(key)  # the most recently used, last
            proc, path = self.running[key]
            deadline = time.monotonic() + 120 * timeout_scale()
            while proc is not None and not os.path.exists(path):  # the first launch waits
                if proc.poll() is not None or time.monotonic() > deadline:
                    self.running[key] = proc, path = None, path  # for good: cold from now
                time.sleep(0.05)
            if proc is None or proc.poll() is not None:
                return None
            self.busy[path] = self.busy.get(path, 0) + 1
            return path

    def release(self, path: str) -> None:
        with self.lock:
            self.busy[path] = max(0, self.busy.get(path, 0) - 1)

    @staticmethod
    def start(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
        import atexit

        folder = tempfile.mkdtemp(prefix="course-warm-")
        path = os.path.join(folder, "zygote")
        with open(os.path.join(folder, "zygote.log"), "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "course.warmstart", path],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=folder, env=env, start_new_session=True,
            )  # fmt: skip
        atexit.register(_Zygotes.stop, proc, folder)
        return proc, path

    def fork(self, env: dict[str, str]) -> None:
        """Make a fork of this process the zygote for launches with environment `env`:
        a process that imported torch already (a warm grading) starts it in milliseconds.
        Only where can_fork()."""
        import atexit

        key = json.dumps(warmstart.key(env))
        folder = tempfile.mkdtemp(prefix="course-warm-")
        path = os.path.join(folder, "zygote")
        log = os.open(os.path.join(folder, "zygote.log"), os.O_WRONLY | os.O_CREAT, 0o600)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the zygote, in a session of its own, with nothing of ours open
            try:
                os.setsid()
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.closerange(3, os.sysconf("SC_OPEN_MAX"))
                sys.stdout = open(1, "w", buffering=1, closefd=False)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                for signum in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(signum, signal.SIG_DFL)
                os.environ.clear()
                os.environ.update(warmstart.key(env))
                warmstart.serve(path)
            finally:
                os._exit(0)
        os.close(log)
        with self.lock:
            self.owner, self.running = os.getpid(), {key: (_Forked(pid), path)}
        atexit.register(_Zygotes.stop, self.running[key][0], folder)

    @staticmethod
    def stop(proc: subprocess.Popen, folder: str) -> None:
        """SIGTERM: the zygote kills its children and exits; SIGKILL after 5 s."""
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(folder, ignore_errors=True)

    def stop_all(self) -> None:
        with self.lock:
            if self.owner == os.getpid():
                for proc, path in self.running.values():
                    if proc is not None:
                        self.stop(proc, os.path.dirname(path))
            self.running = {}


class _Forked:
    """The part of Popen's interface that _Zygotes uses, for a child made by os.fork."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else (a subreaper's sweep)
                done, status = self.pid, 0
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.02)
        return self.returncode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass


_zygotes = _Zygotes()


def fork_zygote() -> bool:
    """Make a fork of this process its zygote (course/warmstart.py) for the launches it
    will make with the course's usual environment: for a process that imported torch
    already, in a single thread (a grading forked by course.grader.warm). False where it
    cannot (then the first launch starts one the ordinary way)."""
    env = child_env()
    if not (can_fork() and warmstart.allowed(env)):
        return False
    _zygotes.fork(env)
    return True


def stop_zygotes() -> None:
    """End this process's zygotes and their children now (a grading's end: also where
    the process ends by os._exit, and its atexit handlers do not run)."""
    _zygotes.stop_all()


def _ready_at(path: Path, started: float) -> float | None:
    """Seconds from `started` (time.time()) to the time the READY_ENV probe wrote."""
    try:
        return max(0.0, float(path.read_text()) - started)
    except (OSError, ValueError):  # not written yet, or being written
        return None


# torchrun's agent reads the error file of every worker that failed (the JSON
# that @record writes when a worker dies of an exception). When a rank dies,
# its peers fail too ("Connection reset by peer") and start writing theirs,
# while the agent SIGTERMs them. A worker stopped between opening its error
# file and writing it leaves it empty, and the agent itself then dies of a
# JSONDecodeError (ProcessFailure.__post_init__ in
# torch/distributed/elastic/multiprocessing/errors/__init__.py) instead of
# restarting the group or reporting the failure. A race inside PyTorch, rare
# (about one kill in a hundred here), that no training script can prevent.
TORCHRUN_AGENT_RACE = ("JSONDecodeError", "elastic/multiprocessing/errors")


def torchrun_agent_raced(result: RunResult) -> bool:
    """True when torchrun's own agent died of the error-file race above."""
    return not result.timed_out and all(sign in result.output for sign in TORCHRUN_AGENT_RACE)


def run_torchrun(*, fresh: Callable[[], None] | None = None, **kwargs) -> RunResult:
    """`run` a torchrun launch; if torchrun's agent died of its error-file race,
    call `fresh()` (put the run's folder back as it was) and launch once more.
    The result's output then starts with a line that says so."""
    result = run(**kwargs)
    if not torchrun_agent_raced(result):
        return result
    if fresh is not None:
        fresh()
    again = run(**kwargs)
    again.output = (
        "course: torchrun's agent died reading an empty error file (a PyTorch race, "
        "not the lesson's fault); launched once more\n" + again.output
    )
    return again


def can_fork() -> bool:
    """Whether `forked` may be used here: Linux, one thread (a fork keeps only the calling
    thread, and a lock another thread held stays held in the child), no
    COURSE_CHILD_USER to switch to (a fork would keep the grader's user), and not an
    xdist worker. A worker talks to its controller through descriptors that the child
    closes; files and sockets the child opens then take their numbers, and what the
    inherited worker code sends its controller (a warning, a log record) lands in them.
    Measured: a gloo rank of lesson 09's case script, forked from a worker's fork, died of
    SIGBUS in every run (never outside xdist), and passed once the child dropped the
    inherited logging handlers and warning hook.

    One thread means one thread of the OS too, not only of Python: CUDA's threads once a
    test has used the GPU, or an OpenMP pool once torch has computed on several threads
    (a grader run without OMP_NUM_THREADS=1), would be forked mid-state (on an H200 the
    import check forked a process with CUDA's threads; Python 3.12 warned of deadlocks).
    There a new interpreter starts instead."""
    return (
        sys.platform.startswith("linux")
        and threading.active_count() == 1
        and _os_threads() == 1
        and not os.environ.get(CHILD_USER_ENV)
        and not os.environ.get("PYTEST_XDIST_WORKER")
    )


def _os_threads() -> int:
    """This process's threads as the OS counts them (native threads included)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _child_exit(fn: Callable[[], object], out: int, cwd: str | Path | None) -> None:
    """In a just-forked child: its own session, output to `out`, run fn, never return."""
    code = 1
    try:
        os.setsid()
        limit(os.getpid())
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # nothing of the parent's stays open
        # pytest's capture replaced sys.stdout and sys.stderr: write to the fds again.
        sys.stdout = open(1, "w", buffering=1, errors="replace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, errors="replace", closefd=False)
        import faulthandler

        # pytest enables faulthandler on a copy of its stderr, a descriptor closed above:
        # a later file can take its number, and a crash report would land in that file.
        if faulthandler.is_enabled():
            faulthandler.enable(file=sys.stderr)
        if cwd is not None:
            os.chdir(cwd)
        result = fn()
        code = result if isinstance(result, int) else 0
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
    except BaseException:  # noqa: BLE001 - the child reports everything, then exits
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def forked(
    fn: Callable[[], object],
    *,
    args: list[str],
    timeout: float,
    cwd: str | Path | None = None,
) -> RunResult:
    """`run` for a Python function instead of a command: fn() runs in a fork of this
    process (its own session, the same deadline and group kill, output to a file), so a
    child that needs what this process has imported (torch: 2 s of CPU per interpreter)
    starts in milliseconds. fn's int result, or SystemExit's code, is the exit code.
    `args` only names the work in describe(). Only where can_fork()."""
    if not can_fork():
        raise RuntimeError("procs.forked needs a single-threaded process on Linux")
    timeout = timeout * timeout_scale()
    start = time.monotonic()
    with tempfile.TemporaryFile() as out:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child_exit(fn, out.fileno(), cwd)
        timed_out, status = False, None
        deadline = start + timeout
        while status is None:
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = raw
            elif time.monotonic() >= deadline:
                timed_out = True
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:  # killed before its setsid()
                    os.kill(pid, signal.SIGKILL)
                status = os.waitpid(pid, 0)[1]
            else:
                time.sleep(0.02)
        kill_group(pid)  # also on success: what the child started does not outlive it
        out.seek(0)
        output = out.read().decode(errors="replace")
    return RunResult(
        args=[str(a) for a in args],
        returncode=None if timed_out else os.waitstatus_to_exitcode(status),
        output=output,
        timed_out=timed_out,
        seconds=time.monotonic() - start,
        timeout=timeout,
        pgid=pid,
    )


def python(*args: str | Path, **kwargs) -> RunResult:
    """`run` with this interpreter."""
    return run([sys.executable, *map(str, args)], **kwargs)


def run_all(jobs: dict[str, dict], fail_fast: bool = False) -> dict[str, RunResult]:
    """Several `run(**kwargs)` at once (independent launches overlap their start-up
    costs, which dominate on a small machine); {name: kwargs} -> {name: RunResult}.

    fail_fast: the launches are parts of one job (two torchrun agents, say): as
    soon as one fails, the others are stopped instead of waiting for peers that
    will never come until their timeout."""
    from concurrent.futures import ThreadPoolExecutor

    stop = threading.Event() if fail_fast else None

    def one(kwargs):
        result = run(**kwargs, stop=stop)
        if stop is not None and not result.ok:
            stop.set()
        return result

    with ThreadPoolExecutor(max_workers=max(len(jobs), 1)) as pool:
        futures = {name: pool.submit(one, kwargs) for name, kwargs in jobs.items()}
        return {name: future.result() for name, future in futures.items()}
