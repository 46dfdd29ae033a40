"""The zygote's child: takes over the client's descriptors, limits, folder and environment,
and runs its program (a script, -m module or -c code) as a fresh interpreter would."""

from __future__ import annotations

import os
import signal
import sys

from course.launch.warm.protocol import FORWARDED, SOCKET_ENV, parse_command


def become(request: dict, fds: list[int], zygote: int) -> int:
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
