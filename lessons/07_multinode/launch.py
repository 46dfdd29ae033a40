"""Lesson 07 - more than one machine: one launcher per node, meeting at node 0's rendezvous.

Run it, one line per node (here two shells on one machine; on two machines use node 0's
address instead of 127.0.0.1, the same on both):
    python lessons/07_multinode/launch.py --nnodes 2 --node-rank 0 --endpoint 127.0.0.1:29400 \\
        -- lessons/04_torchrun/train.py --backend gloo --epochs 1
    python lessons/07_multinode/launch.py --nnodes 2 --node-rank 1 --endpoint 127.0.0.1:29400 \\
        -- lessons/04_torchrun/train.py --backend gloo --epochs 1
    python -m course grade 07                                          # grade your version
"""

import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

from course import options
from course.runtime import exit_with_one_line


def parse_args(argv=None):
    p = options.ArgumentParser(prog="launch.py", description=__doc__.splitlines()[0])
    p.add_argument("--nnodes", type=options.positive_int, default=1, help="machines in the job")
    p.add_argument("--node-rank", type=options.non_negative_int, default=0, help="0: the host")
    p.add_argument("--nproc-per-node", type=options.positive_int, default=1, help="e.g. GPUs")
    p.add_argument("--endpoint", default="127.0.0.1:29400", help="node 0's HOST:PORT")
    p.add_argument("--job-id", default="course", help="the same on every node of one job")
    p.add_argument(
        "--connect-timeout", type=options.positive_float, default=60.0,
        help="seconds a node waits for node 0's endpoint to answer",
    )  # fmt: skip
    p.add_argument("--max-restarts", type=options.non_negative_int, default=0)
    p.add_argument("--dry-run", action="store_true", help="print the torchrun command, run nothing")
    p.add_argument("script", help="the training script torchrun starts on every process")
    p.add_argument("script_args", nargs="*", default=[], help="its arguments (after --)")
    args = p.parse_args(argv)
    if args.node_rank >= args.nnodes:
        p.error(f"--node-rank {args.node_rank}: must be below --nnodes {args.nnodes}")
    try:
        args.host, args.port = split_endpoint(args.endpoint)
    except ValueError as err:
        p.error(str(err))
    if not args.dry_run and not Path(args.script).is_file():  # before torchrun starts a group
        p.error(f"{args.script}: no such script")
    return args


# --8<-- [start:endpoint]
def split_endpoint(endpoint: str) -> tuple[str, int]:
    """'host:port' or '[ipv6]:port' -> (host, port); ValueError, in one line, for anything else."""
    host, sep, port = endpoint.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--endpoint {endpoint}: expected HOST:PORT, e.g. 10.0.0.1:29400")
    return host, int(port)


def wait_for_endpoint(host: str, port: int, timeout: float) -> float:
    """Wait until something accepts TCP connections at host:port; returns the seconds waited.

    Raises ConnectionError after `timeout` seconds with the likely causes, instead of
    letting torchrun wait for a rendezvous that cannot happen."""
    start = time.monotonic()
    # TODO: try to open a TCP connection to host:port until one succeeds (node 0 may start
    # a little later than this node), and give up after `timeout` seconds with a
    # ConnectionError that names the endpoint and the likely causes. Without it, a node
    # with a wrong address waits in torchrun for many minutes and says nothing useful.
    raise NotImplementedError("TODO at 07_multinode/launch.py:70 is not done yet")


# --8<-- [end:endpoint]


# --8<-- [start:command]
def torchrun_command(args) -> list[str]:
    """The torchrun command line that starts this node's share of the job."""
    # TODO: the torchrun command for this node: --nnodes, --nproc-per-node, a c10d
    # rendezvous at --endpoint under --job-id, --max-restarts, then the script and its
    # arguments. Every node runs the same command; only where it runs differs.
    raise NotImplementedError("TODO at 07_multinode/launch.py:82 is not done yet")


# --8<-- [end:command]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        print(shlex.join(torchrun_command(args)))
        return 0
    if args.node_rank > 0:  # node 0 hosts the rendezvous; the others check they can reach it
        waited = wait_for_endpoint(args.host, args.port, args.connect_timeout)
        print(f"node {args.node_rank}: {args.endpoint} answered after {waited:.1f} s")
    command = torchrun_command(args)
    print(f"node {args.node_rank} of {args.nnodes}: {shlex.join(command)}", flush=True)
    # torchrun's exit code is the job's: 0 only if every process of this node succeeded.
    return subprocess.call(command)


if __name__ == "__main__":
    # A wrong flag or an unreachable endpoint prints one line and exits 2.
    sys.exit(exit_with_one_line(main))
