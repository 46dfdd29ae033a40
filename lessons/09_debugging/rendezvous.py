"""Lesson 09, exercise 4 - a job that cannot start: say why, within seconds, in one line.

Run it (one process per rank; torchrun sets the same four variables):
    export MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 WORLD_SIZE=2
    RANK=0 python lessons/09_debugging/rendezvous.py &
    RANK=1 python lessons/09_debugging/rendezvous.py
Then break one setting at a time: RANK=1 alone (nobody at the address), a MASTER_PORT that
another program holds, WORLD_SIZE=3 on one rank only, GLOO_SOCKET_IFNAME=nope0.
    python -m course grade 09 -k rendezvous                   # grade your fix
"""

import faulthandler
import os
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from course import options

# A silent wait with an exact end (wait_until polls ready() every 0.1 s until a deadline)
# and a one-second TCP probe (port_answers): TCPStore's own retries print C++ frames.
from course.ranks import from_environment, port_answers, say, wait_until
from course.runtime import exit_with_one_line


def parse_args(argv=None):
    p = options.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--timeout", type=options.positive_float, default=10,
                   help="seconds to wait for the others")  # fmt: skip
    p.add_argument("--give-up", type=options.positive_float, default=60, metavar="S",
                   help="safety net: after S seconds, print where it waits and exit")  # fmt: skip
    return p.parse_args(argv)


def interface_problem(backend: str) -> str | None:
    """What is wrong with the network interface the environment names for `backend`, or None."""
    variable = "GLOO_SOCKET_IFNAME" if backend == "gloo" else "NCCL_SOCKET_IFNAME"
    wanted = os.environ.get(variable, "")
    here = [name for _, name in socket.if_nameindex()]
    for name in filter(None, wanted.split(",")):
        if name.startswith("^"):  # NCCL: an interface to avoid, not one to use
            continue
        # gloo wants exact names; NCCL matches a prefix unless the name starts with "=".
        exact = backend == "gloo" or name.startswith("=")
        name = name.removeprefix("=")
        if not any(have == name if exact else have.startswith(name) for have in here):
            return f"{variable}={wanted}: no interface {name!r} here (only {', '.join(here)})"
    return None


def join(backend: str, timeout: float) -> tuple[int, int]:
    """Join the group that RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT describe; returns
    (rank, world size). A setting that cannot work raises a one-line ValueError or
    ConnectionError within about `timeout` seconds."""
    rank, world_size, addr, port = from_environment()  # one line if one is wrong
    # TODO: PyTorch's defaults wait up to 30 minutes, then print a wall of C++ frames, or
    # fail at once with an error that does not say which setting is wrong. Check each
    # setting, wait at most `timeout` seconds for the others, and raise one line that
    # names the cause: a missing network interface, nobody listening at the address, a
    # port another program holds, ranks started with different world sizes.
    dist.init_process_group(backend)  # env://: the defaults read the four variables
    return dist.get_rank(), dist.get_world_size()


def main(argv=None):
    args = parse_args(argv)
    # The safety net of the broken version: faulthandler prints every thread's stack (where
    # it waits), then exits 1. A fixed join() has failed long before.
    faulthandler.dump_traceback_later(args.give_up, exit=True)
    rank, world_size = join(args.backend, args.timeout)
    if args.backend == "nccl":  # one GPU per rank, as many ranks per machine as GPUs
        torch.cuda.set_device(rank % torch.cuda.device_count())
    ones = torch.ones(1, device="cuda" if args.backend == "nccl" else "cpu")  # the current GPU
    dist.all_reduce(ones)  # the group works: every rank adds its 1
    say(f"rank {rank}: joined {world_size} ranks; all_reduce of ones gave {ones.item():g}")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(exit_with_one_line(main))
