"""The zygote: an interpreter that imported torch once, and forks a child that becomes
each client's program (`python -m course.launch.warm.zygote SOCKET`)."""

from __future__ import annotations

import os
import signal
import socket
import sys

from course.launch.warm import child
from course.launch.warm.protocol import (
    LAUNCH_ENV,
    PRELOAD,
    SOCKET_ENV,
    cold_reason,
    key,
    receive,
    send,
)  # fmt: skip

_START_ENV: dict[str, str] = {}  # the zygote's environment, as it started


def _refusal(request: dict) -> str | None:
    why = cold_reason(request["argv"])
    if why is not None:
        return why
    if request["flags"] != list(sys.flags) or request["xoptions"] != sys._xoptions:
        return "other interpreter flags"
    if request["warnoptions"] != sys.warnoptions:
        return "other -W options"
    if key(request["env"]) != _START_ENV:
        return "another environment for torch's import"
    if len(os.listdir("/proc/self/task")) != 1:
        return "the zygote has threads"  # a fork would copy them mid-state
    return None


def serve(path: str) -> None:
    """The zygote: import, listen on `path`, fork a child for each request."""
    import importlib
    import selectors

    os.environ.pop(SOCKET_ENV, None)
    global _START_ENV
    _START_ENV = key(os.environ)  # before the imports, which may set variables of their own
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    if len(os.listdir("/proc/self/task")) != 1:  # the imports started threads (OpenMP,
        print("started threads while importing: serves nobody")  # OpenBLAS): never fork
        return
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)  # clients see the socket only once it listens
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, tuple[socket.socket, str]] = {}  # pid -> (client's socket, launch)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))

    def reap(pid: int, status: int) -> None:
        conn, _ = children.pop(pid, (None, ""))
        if conn is not None and conn.fileno() >= 0:
            selector.unregister(conn)
            try:
                send(conn, {"status": status})
            except OSError:
                pass
            conn.close()

    while not stop and os.getppid() == parent:
        for event, _ in selector.select(timeout=0.05):
            conn = event.fileobj
            if conn is not listener:  # readable only when its client is gone
                pid = event.data
                selector.unregister(conn)
                conn.close()
                _kill(pid)
                continue
            conn, _ = listener.accept()
            conn.settimeout(10)
            try:
                request, fds = receive(conn, with_fds=True)
            except (OSError, ValueError):
                conn.close()
                continue
            if request and "drain" in request:  # launch.run, after a launch: end its children
                ended = [pid for pid, (_, launch) in children.items() if launch == request["drain"]]
                for pid in ended:
                    _kill(pid)
                    reap(pid, os.waitpid(pid, 0)[1])
                _reply(conn, {"drained": len(ended)})
                continue
            pid = _serve_one(conn, request, fds)
            if pid:
                children[pid] = (conn, request["env"].get(LAUNCH_ENV, ""))
                selector.register(conn, selectors.EVENT_READ, pid)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            reap(pid, status)
    for pid in children:
        _kill(pid)
    listener.close()
    folder = os.path.dirname(path)
    if os.path.basename(folder).startswith("course-warm-"):  # the pool made it for us alone
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def _reply(conn: socket.socket, message: dict) -> None:
    try:
        send(conn, message)
    except OSError:
        pass
    conn.close()


def _kill(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _serve_one(conn: socket.socket, request: dict | None, fds: list[int]) -> int | None:
    """Fork the child that runs `request`; its pid, or None (refused, and told why)."""
    why = "no request" if request is None else _refusal(request)
    if why is not None:
        print(f"started cold: {' '.join(request['argv'])[-200:] if request else ''}: {why}")
        for fd in fds:
            os.close(fd)
        _reply(conn, {"pid": None, "why": why})
        return None
    zygote = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = child.become(request, fds, zygote)
        except BaseException:  # noqa: BLE001 - a child never returns into the zygote
            import traceback

            traceback.print_exc()
        os._exit(code)
    for fd in fds:
        os.close(fd)
    try:
        send(conn, {"pid": pid})
    except OSError:
        _kill(pid)
        conn.close()
        return None
    return pid


if __name__ == "__main__":
    serve(sys.argv[1])
