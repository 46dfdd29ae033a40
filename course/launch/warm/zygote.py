"""The zygote: an interpreter that imported torch once, and forks a child that becomes
each client's program (`python -m course.launch.warm.zygote SOCKET`)."""

from __future__ import annotations

import os
import signal
import socket
import sys

from course.launch.warm.protocol import (
    FORWARDED,
    LAUNCH_ENV,
    PRELOAD,
    SOCKET_ENV,
    cold_reason,
    key,
    parse_command,
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
            code = _child(request, fds, zygote)
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


def _child(request: dict, fds: list[int], zygote: int) -> int:
    """In the fork: become the client's program, run it, return its exit code."""
    import ctypes
    import resource

    os.setsid()
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the zygote
    if os.getppid() != zygote:  # it died before the line above
        return 1
    for signum in (*FORWARDED, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # The client's descriptors, at the client's numbers; nothing of the zygote's.
    high = [_dup_above(fd, 1000) for fd in fds]
    os.closerange(0, 1000)
    for target, fd, inheritable in zip(request["fds"], high, request["inheritable"], strict=True):
        os.dup2(fd, target, inheritable=inheritable)
    os.closerange(1000, os.sysconf("SC_OPEN_MAX"))
    for name, (soft, hard) in request["limits"].items():
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (OSError, ValueError):
            pass
    os.umask(request["umask"])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _stdio(request["env"], request["argv"])
    return _run(request)


def _dup_above(fd: int, floor: int) -> int:
    import fcntl

    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor)
    os.close(fd)
    return new


def _stdio(env: dict, argv: list[str]) -> None:
    import io

    unbuffered = bool(env.get("PYTHONUNBUFFERED")) or "-u" in argv[1:]

    def writer(fd, errors):  # as Python makes them: -u, a raw file under the text layer
        raw = io.FileIO(fd, "w", closefd=False)
        tty = raw.isatty()
        return io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw),
                                encoding=sys.stdout.encoding, errors=errors,
                                line_buffering=tty, write_through=unbuffered)  # fmt: skip

    reader = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                              encoding=sys.stdin.encoding if sys.stdin else "utf-8")  # fmt: skip
    sys.stdin = sys.__stdin__ = reader
    sys.stdout = sys.__stdout__ = writer(1, sys.stdout.errors if sys.stdout else "strict")
    sys.stderr = sys.__stderr__ = writer(2, "backslashreplace")


def _run(request: dict) -> int:
    import atexit
    import builtins
    import importlib
    import runpy
    import threading
    import types

    kind, what, args = parse_command(request["argv"])
    for name in [m for m in sys.modules if m == "course" or m.startswith("course.")]:
        del sys.modules[name]  # the client's course, imported afresh by what runs
    importlib.invalidate_caches()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # each fresh interpreter seeds its own
    sys.orig_argv = request["argv"]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    if kind == "script":
        sys.argv = [what, *args]
        sys.path[0] = os.path.dirname(os.path.realpath(what)) if os.path.isfile(what) else what
    elif kind == "module":
        sys.argv = ["-m", *args]
        sys.path[0] = os.getcwd()
    else:
        sys.argv = ["-c", *args]
        sys.path[0] = ""
    sys.modules["__main__"] = main
    # Start-up as a fresh interpreter's, with the client's environment: the sitecustomize
    # (course/probes/_site: the probes it arms; the zygote had none) runs again, here.
    site = getattr(sys.modules.get("sitecustomize"), "__file__", None)
    if site:
        path = os.environ.pop(SOCKET_ENV, None)
        runpy.run_path(site, run_name="sitecustomize")
        if path:
            os.environ[SOCKET_ENV] = path
    code = 0
    try:
        if kind == "script":
            runpy.run_path(what, run_name="__main__")
        elif kind == "module":
            runpy._run_module_as_main(what, alter_argv=True)
        else:
            exec(compile(what, "<string>", "exec"), main.__dict__)
    except SystemExit as err:
        code = _exit_code(err)
    except KeyboardInterrupt:
        _print_exception()
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 - printed as the interpreter would
        _print_exception()
        code = 1
    try:
        threading._shutdown()  # as the interpreter does: wait for non-daemon threads
        atexit._run_exitfuncs()
    except SystemExit as err:
        code = _exit_code(err)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code < 0:  # died of SIGINT, as Python does after a KeyboardInterrupt
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _exit_code(err: SystemExit) -> int:
    if err.code is None:
        return 0
    if isinstance(err.code, int):
        return err.code
    print(err.code, file=sys.stderr)
    return 1


def _print_exception() -> None:
    """The traceback without the frames of this module and runpy (not the program's)."""
    kind, value, tb = sys.exc_info()
    ours = (__file__, "<frozen runpy>", getattr(sys.modules.get("runpy"), "__file__", None))
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    sys.excepthook(kind, value.with_traceback(tb), tb)


if __name__ == "__main__":
    serve(sys.argv[1])
