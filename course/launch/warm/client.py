"""The starting process's half: hand the program to the zygote, then wait and mirror it."""

from __future__ import annotations

import os
import signal
import socket
import sys

from course.launch.warm.protocol import FORWARDED, MAX_FDS, SOCKET_ENV, receive, send


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
        send(sock, request, fds)
    except OSError:  # not sent whole: the zygote forks nothing
        sock.close()
        return
    # Sent: from now on only the zygote's answer says whether a child runs the program, so
    # no deadline here (the launch's own deadline bounds it). No answer at all means the
    # zygote died, and a child it had made died with it (PR_SET_PDEATHSIG).
    sock.settimeout(None)
    try:
        reply = receive(sock)
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
        done = receive(sock)
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
