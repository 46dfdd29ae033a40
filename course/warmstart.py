"""Warm starts: every Python process a launch starts begins with torch already imported.

A lesson's rank does little work in the tests (a tiny model, a few steps) but pays
about 3 s of CPU for `import torch` and 3 s more for torch._dynamo, which the first
optimizer imports (torch 2.14.1, 2 cores, measured 2026-12-03). A torchrun launch of
two ranks starts three such processes; the suite starts hundreds.

So the process that launches (a grading, the suite's worker) starts one *zygote*:
an interpreter that imports torch, torch.distributed and torch._dynamo once, with the
launches' own environment, and then only forks. Every Python process of a launch
(the launcher, torchrun's workers, mp.spawn's children) starts as usual; its
sitecustomize (course/probes/_site) finds COURSE_WARM_SOCKET and calls `hand_off()`
before anything else runs. That *client* sends the zygote its command line,
environment, working folder, limits and open file descriptors. The zygote forks a
child, which takes them over, as the client would have been, and runs the program
(script, -m module or -c code); the client waits, forwards the signals it gets to the
child, and exits with the child's status (or dies of the same signal). The client is
what its launcher and the grader see: its pid, its process group, its command line.

The contract with course.procs: the child lives in a session of its own and dies
when its client dies (the zygote watches every client's socket and SIGKILLs that
child's group at once), or when the zygote dies (PR_SET_PDEATHSIG). The zygote is a
child of the launching process, so what the children leave behind is still among
that process's descendants (procs.kill_descendants, the grader's end of session).

Whenever a process could come out different, it is started cold instead: another
environment for what torch reads when imported (thread counts, TORCH_*, PYTHON*,
LD_*, the PYTHONPATH), other interpreter flags, -W or -X options, a program read from
stdin. Not the same as a fresh interpreter, and accepted: the hash seed of str is the
zygote's in every child (PYTHONHASHSEED set by the caller is honoured, cold).
Off where GPUs are present (CUDA must never be forked mid-state), with
COURSE_CHILD_USER (children switch user), and with COURSE_WARM_START=0. Also what a
warm child cannot hide: /proc/PID/cmdline shows the zygote's command, and a stack dump
(faulthandler, py-spy) shows the zygote's frames under the program's, so `course spy`
and the recordings that keep stacks start their processes cold.

Over 300 lines, on purpose: the client, the zygote and the child speak one protocol
(the request, the fds, the status, the drain), and each half is tested through the other.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

SOCKET_ENV = "COURSE_WARM_SOCKET"
SWITCH_ENV = "COURSE_WARM_START"
LAUNCH_ENV = "COURSE_WARM_LAUNCH"  # names the launch a child belongs to (see drain)
# A zygote serves a process only if their environments are equal, but for these: what a
# launch sets for each rank and what is read only after start-up (not by `import torch`).
PER_LAUNCH = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "PYTHONUNBUFFERED", "PWD", "OLDPWD", "_", "SHLVL"}  # fmt: skip
PER_LAUNCH_PREFIXES = ("COURSE_", "TORCHELASTIC_", "TORCH_NCCL_", "PYTEST_")
# Not torch.distributed.run: `-m torch.distributed.run` must find it not yet imported.
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.multiprocessing",
           "torch.utils.data", "numpy")  # fmt: skip
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)  # fmt: skip
# The grader and the course's tools start cold: a submission looking up its ancestors'
# command lines finds them as they are (see the top of this file), and they are few.
COLD_MODULES = ("pytest", "course")
HEADER = struct.Struct("!I")
MAX_FDS = 250
_START_ENV: dict[str, str] = {}  # the zygote's environment, as it started


def key(env) -> dict[str, str]:
    """The part of an environment that must match the zygote's: all of it but PER_LAUNCH.
    (Thread counts, CPU kernels, TORCH_DISTRIBUTED_DEBUG, the PYTHONPATH... are read
    once, when torch or Python starts.)"""
    return {
        k: v
        for k, v in sorted(env.items())
        if k not in PER_LAUNCH and not k.startswith(PER_LAUNCH_PREFIXES)
    }


def allowed(env=os.environ) -> bool:
    return (
        sys.platform.startswith("linux")
        and hasattr(socket, "send_fds")
        and env.get(SWITCH_ENV, "1") != "0"
        and not env.get("COURSE_CHILD_USER")
        and not os.path.exists("/dev/nvidiactl")
    )


def _send(sock: socket.socket, message: dict, fds=()) -> None:
    data = json.dumps(message).encode()
    socket.send_fds(sock, [HEADER.pack(len(data)) + data], list(fds))


def _receive(sock: socket.socket, with_fds: bool = False):
    """One message (and the descriptors that came with it), or None at end of stream."""
    data, fds, _, _ = socket.recv_fds(sock, 1 << 16, MAX_FDS if with_fds else 0)
    if len(data) < HEADER.size:
        return (None, fds) if with_fds else None
    (size,) = HEADER.unpack_from(data)
    data = data[HEADER.size :]
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            return (None, fds) if with_fds else None
        data += more
    message = json.loads(data)
    return (message, fds) if with_fds else message


# ---------------------------------------------------------------------------- the client


def hand_off() -> None:
    """In a starting process (sitecustomize): let the zygote run this program, and exit
    as it exits. Returns, and the program starts cold, when the zygote says no or is
    not there."""
    path = os.environ.get(SOCKET_ENV)  # kept: what this program starts may be warm too
    if not path:
        return
    fds = sorted(int(n) for n in os.listdir("/proc/self/fd"))
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect(path)
    except OSError:
        return
    fds = [fd for fd in fds if fd != sock.fileno() and _is_open(fd)][:MAX_FDS]
    import resource

    mask = os.umask(0o22)
    os.umask(mask)
    request = {
        "argv": list(sys.orig_argv),
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "flags": list(sys.flags),
        "xoptions": sys._xoptions,
        "warnoptions": sys.warnoptions,
        "umask": mask,
        "fds": fds,
        "inheritable": [os.get_inheritable(fd) for fd in fds],
        "limits": {
            name: resource.getrlimit(getattr(resource, name))
            for name in ("RLIMIT_CORE", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_AS")
        },
    }
    try:
        _send(sock, request, fds)
    except OSError:  # not sent whole: the zygote forks nothing
        sock.close()
        return
    # Sent: from now on only the zygote's answer says whether a child runs the program, so
    # no deadline here (the launch's own deadline bounds it). No answer at all means the
    # zygote died, and a child it had made died with it (PR_SET_PDEATHSIG).
    sock.settimeout(None)
    try:
        reply = _receive(sock)
    except (OSError, ValueError):
        reply = None
    if not reply or not reply.get("pid"):
        sock.close()
        return  # not served: start cold
    try:  # from here on the program runs there: this process never runs it itself
        _wait(sock, reply["pid"])
    finally:
        os._exit(1)


def _wait(sock: socket.socket, child: int) -> None:
    """Forward signals to the child until it ends, then end as it did."""

    def forward(signum, frame):
        try:
            os.killpg(child, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    sock.settimeout(None)
    try:
        done = _receive(sock)
    except (OSError, ValueError):
        done = None
    if done is None:
        os.write(2, b"course: the warm interpreter that ran this process died\n")
        os._exit(1)
    status = done["status"]
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        if signum != signal.SIGKILL:
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    os._exit(os.waitstatus_to_exitcode(status))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


# ---------------------------------------------------------------------------- the zygote


def _program(argv: list[str]):
    """("script", path, args) / ("module", name, args) / ("code", text, args) from a
    Python command line, or None when it is something only a fresh interpreter runs."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-c", "-m") and i + 1 < len(argv):
            kind = "code" if arg == "-c" else "module"
            return kind, argv[i + 1], argv[i + 2 :]
        if arg in ("-W", "-X"):
            i += 2
            continue
        if arg == "-" or arg == "--" or (arg.startswith("-") and set(arg[1:]) & set("cmWX-")):
            return None
        if not arg.startswith("-"):
            return "script", arg, argv[i + 1 :]
        i += 1
    return None


def cold_reason(argv: list[str]) -> str | None:
    """Why a command line starts cold whatever its environment, or None."""
    program = _program(argv)
    if program is None:
        return "not a script, -m or -c"
    kind, what, _ = program
    if (kind == "module" and what.split(".")[0] in COLD_MODULES) or (
        kind == "script" and os.path.basename(what) in COLD_MODULES  # their console scripts
    ):
        return "the course's tools and pytest start cold"
    return None


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
                _send(conn, {"status": status})
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
                request, fds = _receive(conn, with_fds=True)
            except (OSError, ValueError):
                conn.close()
                continue
            if request and "drain" in request:  # procs.run, after a launch: end its children
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
    if os.path.basename(folder).startswith("course-warm-"):  # procs made it for us alone
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def _reply(conn: socket.socket, message: dict) -> None:
    try:
        _send(conn, message)
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
        _send(conn, {"pid": pid})
    except OSError:
        _kill(pid)
        conn.close()
        return None
    return pid


def drain(path: str, launch: str, timeout: float = 30) -> int | None:
    """Kill and wait for every child of the launch `launch` (course.procs.run calls it
    after the launch's group was killed: their clients are gone, the children may not be
    yet). The number of children ended, None when the zygote did not answer."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            _send(sock, {"drain": launch})
            reply = _receive(sock)
    except (OSError, ValueError):
        return None
    return None if reply is None else reply.get("drained")


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

    kind, what, args = _program(request["argv"])
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
