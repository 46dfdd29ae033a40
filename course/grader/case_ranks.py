"""The ranks a case script starts (`Cases.spawn`, course/grader/cases.py): forked (CPU) or
spawned (CUDA) by torch.multiprocessing, each writing its own error and stderr to a file,
waited for by their exit codes; and, when one fails, the one line that says why (a rank
that timed out, a rank that aborted in C++).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path


def _noting_errors(rank: int, target: Callable, errors: str, *args) -> None:
    """A rank of Cases.spawn: target(rank, *args), its exception also written to a file,
    and its stderr (C++ included: gloo's abort messages) to errors/rank<R>.err."""
    stderr = os.open(Path(errors, f"rank{rank}.err"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(stderr, 2)
    try:
        target(rank, *args)
    except BaseException as err:
        Path(errors, f"rank{rank}.txt").write_text(f"{type(err).__name__}: {err}"[:2000])
        raise


def _rank_process(rank: int, target: Callable, errors: str, *args) -> None:
    """The entry point of a rank process of Cases.spawn (never called in a test's own
    process, whose later calls of destroy_process_group must not end it)."""
    _renew_thread_pool()
    _leave_once_destroyed()
    _noting_errors(rank, target, errors, *args)


def _renew_thread_pool() -> None:
    """Replace the intra-op thread pool a fork inherits, now, while this rank has one thread.
    torch rebuilds it at its first use after a fork; left to then, the first backward's
    autograd worker threads each set the thread count as they start, and one may find the
    pool gone while another rebuilds it: "pool INTERNAL ASSERT FAILED ... Invalid thread
    pool!" and SIGABRT (lesson 10's FSDP2 case, graded alone with `-k`, 3 times in 4 on
    torch 2.14.1)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(torch.get_num_threads())


def _leave_once_destroyed() -> None:
    """Make this rank leave as soon as its work is done: when the case's rank function
    destroys the default group with no exception in flight (its last statement, in a
    `finally`), flush the output and exit 0, as multiprocessing would next, without
    freeing the function's objects. Freeing DDP frees gloo's process group, whose destructor
    joins gloo's worker threads while holding the GIL; on PyTorch 2.8 under load a rank hung
    there after its work was done (lesson 04's and lesson 08's gradings, about one in seven
    beside a busy loop: one rank gone, the other stopped in this frame's call of the rank
    function, until the case's deadline). A group destroyed while an exception propagates
    is left to the exception: the rank fails as before."""
    import torch.distributed as dist

    original = dist.destroy_process_group

    def destroy_then_leave(group=None):
        original(group)
        if group is None and sys.exc_info()[0] is None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    dist.destroy_process_group = destroy_then_leave


# What a rank that aborts in C++ leaves on stderr: std::terminate's "what():" line,
# gloo's "[enforce fail at ...]".
_NATIVE = re.compile(r"(terminate called|what\(\)|enforce fail|\bError\b)")
_STACK_LINES = ("frame #", "Exception raised from")
# gloo's check that a received message fits its buffer (transport/tcp/pair.cc).
_SIZE_MISMATCH = ("op.preamble.length <= op.nbytes", "op.nbytes")


def native_error(err: BaseException, errors: Path) -> str | None:
    """For a rank that died of a signal (SIGABRT): the line it printed as it aborted, and the
    cause when that line names one; None when no such line was written."""
    found = re.search(r"process (\d+) terminated with signal (\w+)", str(err))
    if not found:
        return None
    rank, signal_name = found.groups()
    path = Path(errors, f"rank{rank}.err")
    lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
    # A C++ exception's message comes before its stack ("frame #0: c10::Error::Error(...)"),
    # whose frames name Error too: they are not what the rank said.
    said = [line.strip() for line in lines
            if _NATIVE.search(line) and not line.lstrip().startswith(_STACK_LINES)]  # fmt: skip
    if not said:
        return None
    text = f"rank {rank} died of {signal_name}; its last error line: {said[-1][:300]}"
    if any(sign in said[-1] for sign in _SIZE_MISMATCH):
        text += (
            ". gloo received a message larger than the buffer posted for it: a send and its "
            "receive have different sizes (a chunk of the wrong length or index, or a message "
            "from a rank that was not expected to send one)"
        )
    return text


def timeout_among(err: BaseException, errors: Path) -> str | None:
    """None if no rank timed out; "" if `err` (the rank mp.spawn reports) says it did;
    else the line of a rank whose own error, written by _noting_errors, says so."""
    if "timed out" in str(err).lower():
        return ""
    for path in sorted(Path(errors).glob("rank*.txt")):
        text = path.read_text().strip()
        if "timed out" in text.lower():
            return f"rank {path.stem.removeprefix('rank')}: {text}"
    return None


def _cause(codes: list[int | None]) -> int | None:
    """The rank to report among those that ended badly (exit codes, None: still running):
    one killed by a signal first. gloo aborts a rank (SIGABRT) that receives a message too
    large for its buffer, and its peer then raises "Connection reset by peer": under load
    both have ended by the next look (every 20 ms), and the peer, the lower rank, would be
    reported with the symptom instead of the cause (seen in a CI run, 2026-12-04)."""
    failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
    return min(failed, key=lambda i: (codes[i] >= 0, i)) if failed else None


def start_and_wait(args: tuple, world: int, method: str) -> None:
    """torch.multiprocessing.start_processes(_rank_process, args, world), waited for by the
    ranks' exit codes, and raising as its join() does when a rank fails.

    Its join() waits on each rank's sentinel, a pipe that every process the rank forks
    inherits: a submission that forks a process of its own at import (a daemon that
    outlives the rank) would hold the join until that process exits. An exit code is
    the rank's own, whatever it forked."""
    import pickle
    import signal
    import time

    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

    context = mp.start_processes(
        _rank_process, args=args, nprocs=world, start_method=method, join=False
    )
    processes = context.processes
    while True:
        codes = [p.exitcode for p in processes]  # waitpid(WNOHANG)
        failed = _cause(codes)
        if failed is not None or None not in codes:
            break
        time.sleep(0.02)
    if failed is None:
        return
    for p in processes:  # as join() does: SIGTERM, then SIGKILL after 30 s
        if p.exitcode is None:
            p.terminate()
    deadline = time.monotonic() + 30
    while any(p.exitcode is None for p in processes) and time.monotonic() < deadline:
        time.sleep(0.02)
    for p in processes:
        if p.exitcode is None:
            p.kill()
            p.join()
    code, pid, path = codes[failed], processes[failed].pid, context.error_files[failed]
    if not os.access(path, os.R_OK) or os.path.getsize(path) == 0:
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"<Unknown signal {-code}>"
            raise ProcessExitedException(
                f"process {failed:d} terminated with signal {name}",
                error_index=failed, error_pid=pid, exit_code=code, signal_name=name,
            )  # fmt: skip
        raise ProcessExitedException(
            f"process {failed:d} terminated with exit code {code:d}",
            error_index=failed, error_pid=pid, exit_code=code,
        )  # fmt: skip
    with open(path, "rb") as fh:
        trace = pickle.load(fh)
    message = f"\n\n-- Process {failed:d} terminated with the following error:\n{trace}"
    raise ProcessRaisedException(message, failed, pid)
