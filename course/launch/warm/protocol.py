"""What a client and its zygote say to each other (one JSON message with a length header,
descriptors passed alongside), and which launches a zygote may serve."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

# The protocol's variables, named where every child's environment is made (see pool.drain)
from course.launch.environment import WARM_LAUNCH_ENV as LAUNCH_ENV  # noqa: F401
from course.launch.environment import WARM_SOCKET_ENV as SOCKET_ENV  # noqa: F401

SWITCH_ENV = "COURSE_WARM_START"
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


def key(env) -> dict[str, str]:
    """The part of an environment that must match the zygote's: all of it but PER_LAUNCH.
    (Thread counts, CPU kernels, TORCH_DISTRIBUTED_DEBUG, the PYTHONPATH... are read
    once, when torch or Python starts.)"""
    return {
        k: v
        for k, v in sorted(env.items())
        if k not in PER_LAUNCH and not k.startswith(PER_LAUNCH_PREFIXES)
    }


def allowed(env=os.environ, gpus_present: bool | None = None) -> bool:
    """Whether processes with environment `env` may start warm. Not where a GPU is
    present and visible to them: a zygote whose imports touched the driver must never be
    forked. With CUDA_VISIBLE_DEVICES="" (or -1: every grading of a mutant, every CPU
    recording) no process of the launch can reach a GPU, and on a GPU box they start warm
    as on a laptop. Cold, each pays 3 s or more of imports: a grading of lesson 09's hang
    exercise took 50 s cold and 18 s warm (2 cores, 2026-12-07)."""
    if gpus_present is None:
        gpus_present = os.path.exists("/dev/nvidiactl")
    return (
        sys.platform.startswith("linux")
        and hasattr(socket, "send_fds")
        and env.get(SWITCH_ENV, "1") != "0"
        and not env.get("COURSE_CHILD_USER")
        and (not gpus_present or env.get("CUDA_VISIBLE_DEVICES") in ("", "-1"))
    )


def send(sock: socket.socket, message: dict, fds=()) -> None:
    data = json.dumps(message).encode()
    socket.send_fds(sock, [HEADER.pack(len(data)) + data], list(fds))


def receive(sock: socket.socket, with_fds: bool = False):
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


def parse_command(argv: list[str]):
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
    program = parse_command(argv)
    if program is None:
        return "not a script, -m or -c"
    kind, what, _ = program
    if (kind == "module" and what.split(".")[0] in COLD_MODULES) or (
        kind == "script" and os.path.basename(what) in COLD_MODULES  # their console scripts
    ):
        return "the course's tools and pytest start cold"
    return None
