"""The launching process's zygotes: one per environment, started at the first launch that
needs one (or forked from this process), and drained after each launch."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from course.launch.environment import child_env
from course.launch.fork import can_fork
from course.launch.result import timeout_scale
from course.launch.warm import protocol


class _Zygotes:
    """This process's zygotes (course/protocol.py), one per environment (protocol.key):
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
        if not protocol.allowed(env):
            return None
        key = json.dumps(protocol.key(env))
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
                self.running[key] = self.start(protocol.key(env))
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
                [sys.executable, "-m", "course.launch.warm.zygote", path],
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

        key = json.dumps(protocol.key(env))
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
                os.environ.update(protocol.key(env))
                from course.launch.warm import zygote

                zygote.serve(path)
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


def drain(path: str, launch: str, timeout: float = 30) -> int | None:
    """Kill and wait for every child of the launch `launch` (course.launch.run calls it
    after the launch's group was killed: their clients are gone, the children may not be
    yet). The number of children ended, None when the zygote did not answer."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            protocol.send(sock, {"drain": launch})
            reply = protocol.receive(sock)
    except (OSError, ValueError):
        return None
    return None if reply is None else reply.get("drained")


_zygotes = _Zygotes()


def fork_zygote() -> bool:
    """Make a fork of this process its zygote (course/launch/warm/zygote.py) for the launches it
    will make with the course's usual environment: for a process that imported torch
    already, in a single thread (a grading forked by course.grader.warm). False where it
    cannot (then the first launch starts one the ordinary way)."""
    env = child_env()
    if not (can_fork() and protocol.allowed(env)):
        return False
    _zygotes.fork(env)
    return True


def socket_for(env: dict[str, str]) -> str | None:
    """The socket of this process's zygote for a launch with environment `env`, started if
    need be, or None (the launch starts cold). In use until release(socket)."""
    return _zygotes.socket_for(env)


def release(path: str) -> None:
    _zygotes.release(path)


def stop_zygotes() -> None:
    """End this process's zygotes and their children now (a grading's end: also where
    the process ends by os._exit, and its atexit handlers do not run)."""
    _zygotes.stop_all()
