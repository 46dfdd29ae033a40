"""Call a submission's functions in a child process; only plain data comes back.

The grading process never imports a submission: imported there, it could
rewrite pytest's reports, the comparisons or the grade. Function-level tests
therefore go through a *case script* of the grader (tests/cases/lesson_NN.py)
that runs in a child process. It imports the lesson file, calls its functions
in named cases and writes one JSON document, plus one file of tensors when a
case returns some. The parent reads them with `json.loads` and
`torch.load(weights_only=True)`, neither of which can run code, and makes
every comparison itself.

One child per lesson runs every case (importing torch once), so the cost is a
few seconds per lesson, not per test.

Child side (a case script):

    cases = Cases()                      # argv: LESSON_FILE OUT_DIR

    @cases.case
    def pick_backend_no_gpu(lesson):     # runs with the imported lesson
        return lesson.pick_backend()

    cases.run(requires=("pick_backend",))

Parent side (a test module):

    outcome = run_cases(CASES / "lesson_00.py", lesson_path, tmp_path)
    assert outcome.value("pick_backend_no_gpu") == "gloo"

Over 300 lines, on purpose: both halves of one protocol, the parent that starts a
case and reads its files and the child that runs it, so that they cannot drift.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = "cases.json"
TENSORS = "tensors.pt"
ONLY_ENV = "COURSE_CASES"  # comma-separated: run only these cases (the tests selected need)


# --- the child ----------------------------------------------------------------------


@dataclass
class Tensors:
    """A case's return value that holds tensors: {name: tensor}, saved weights-only."""

    tensors: dict
    extra: dict = field(default_factory=dict)


@dataclass
class Exit:
    """What a call that exits (argparse's errors) left: exit code and stderr."""

    code: int | str | None
    stderr: str


def exits(function: Callable, *args) -> Exit | object:
    """Call `function(*args)`; if it raises SystemExit, return an Exit instead."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return function(*args)
    except SystemExit as stop:
        return Exit(stop.code, err.getvalue())


def raised(function: Callable, *args, kind: type[BaseException] = ValueError) -> dict:
    """Call `function(*args)` expecting it to refuse: {"raised": "ValueError", "message": ...},
    or {"raised": None} when it returned (other exceptions propagate: the case failed)."""
    try:
        function(*args)
    except kind as err:
        return {"raised": kind.__name__, "message": str(err)}
    return {"raised": None}


# mp.spawn's ProcessRaisedException carries a rank's whole traceback as its message.
_RANK_FAILED = re.compile(
    r"-- Process (\d+) terminated with the following error:\n(Traceback.*)", re.S
)
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')
_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): ?(.*)$")


def _rank_error(message: str, lesson_file: Path) -> dict | None:
    """The exception a spawned rank raised, from its traceback text: its type, its own
    message and the submission's line, instead of the whole traceback (or None)."""
    found = _RANK_FAILED.search(message)
    if not found:
        return None
    rank, text = found.group(1), found.group(2).split("\n\nDuring handling")[0]
    lines, where, last_frame = text.splitlines(), None, -1
    for number, line in enumerate(lines):
        if frame := _FRAME.match(line):
            last_frame = number
            if Path(frame.group(1)).resolve() == lesson_file.resolve():
                where = f"{lesson_file.name}:{frame.group(2)}"
    raised = next((m for line in lines[last_frame + 1 :] if (m := _RAISED.match(line))), None)
    if raised is None:
        return None
    kind = raised.group(1).rsplit(".", 1)[-1]
    return {"type": kind, "message": f"on rank {rank}: {raised.group(2)}", "where": where}


def _error(err: BaseException, lesson_file: Path) -> dict:
    """One line about an exception, with the submission's line that raised it (for a rank
    that mp.spawn started, the rank's exception and line)."""
    if rank := _rank_error(str(err), lesson_file):
        return rank
    frames = traceback.extract_tb(err.__traceback__)
    own = [f for f in frames if Path(f.filename).resolve() == lesson_file.resolve()]
    where = f"{lesson_file.name}:{own[-1].lineno}" if own else None
    return {"type": type(err).__name__, "message": str(err), "where": where}


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


def _native_error(err: BaseException, errors: Path) -> str | None:
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


def _timeout_among(err: BaseException, errors: Path) -> str | None:
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


def _start_and_wait(args: tuple, world: int, method: str) -> None:
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


class Cases:
    def __init__(self, argv: list[str] | None = None):
        argv = sys.argv[1:] if argv is None else argv
        self.lesson_file, self.out = Path(argv[0]), Path(argv[1])
        self.cases: dict[str, Callable] = {}
        self.hung: str | None = None  # what timed out in an earlier spawn (see spawn)

    def case(self, function: Callable) -> Callable:
        self.cases[function.__name__] = function
        return function

    def spawn(
        self, target: Callable, world: int, *args, what: str, cuda: bool = False, ddp: bool = False
    ) -> None:
        """Run target(rank, world, port, *args) in `world` ranks, on a free port.

        CPU ranks are forked from this process, which has imported torch and the lesson
        already: a spawned rank imports both again (1.5-3 s of CPU each, most of a case's
        cost). CUDA ranks (`cuda`) are spawned: CUDA does not survive a fork.

        Ranks that deadlock wait for the process-group timeout, half the grader's deadline
        for the case script: after one such case the others would not fit in the rest, so
        every later call raises at once, naming `what` timed out. ddp: the ranks build
        DistributedDataParallel, whose constructor imports torch._dynamo (2 s of CPU):
        imported here once, before the fork, instead of once in every rank. Which rank's error
        mp.spawn reports is a race: the first rank to time out leaves, and its peer may
        fail first with "connection closed". Each rank therefore writes its own error, and
        a timeout on any rank is reported as the case's."""
        import tempfile

        from course import ranks

        if self.hung:
            raise RuntimeError(f"not run: the {self.hung} timed out (see that test)")
        errors = Path(tempfile.mkdtemp(prefix="rank-errors-", dir=self.out.parent))
        if ddp and not cuda:
            import torch._dynamo  # noqa: F401 - inherited by the forked ranks
        try:
            args = (target, str(errors), world, ranks.free_port(), *args)
            _start_and_wait(args, world, "spawn" if cuda else "fork")
        except Exception as err:
            timed_out = _timeout_among(err, errors)
            if timed_out is None:
                native = _native_error(err, errors)
                if native is not None:
                    raise RuntimeError(native) from None
                raise
            self.hung = what
            if timed_out:  # another rank's: say so, rather than its peer's symptom
                raise RuntimeError(f"the {what} timed out: {timed_out[:400]}") from None
            raise
        finally:  # what the ranks wrote to stderr, in this process's output as before
            for path in sorted(errors.glob("rank*.err")):
                sys.stderr.write(path.read_text(errors="replace"))
            sys.stderr.flush()

    def run(self, requires: tuple[str, ...] = ()) -> None:
        from course.grader import submission

        results: dict = {"cases": {}}
        tensors: dict = {}
        try:
            lesson = submission.load(self.lesson_file, requires=requires)
        except submission.LessonError as err:
            results["load_error"] = str(err)
            lesson = None
        only = set(filter(None, os.environ.get(ONLY_ENV, "").split(",")))
        chosen = {n: f for n, f in self.cases.items() if not only or n in only}
        for name, function in chosen.items() if lesson is not None else ():
            try:
                value = function(lesson)
            except BaseException as err:  # noqa: BLE001 - the submission's failure, recorded
                results["cases"][name] = {"error": _error(err, self.lesson_file)}
                continue
            if isinstance(value, Tensors):
                keys = []
                for key, tensor in value.tensors.items():
                    tensors[f"{name}/{key}"] = tensor.detach().cpu().clone()
                    keys.append(key)
                value = {"tensors": keys, **value.extra}
            elif isinstance(value, Exit):
                value = {"exit": value.code, "stderr": value.stderr}
            results["cases"][name] = {"value": value}
        self.out.mkdir(parents=True, exist_ok=True)
        if tensors:
            import torch

            torch.save(tensors, self.out / TENSORS)
        (self.out / RESULTS).write_text(json.dumps(results, default=repr))


# --- the parent ---------------------------------------------------------------------


class CaseFailed(AssertionError):
    pass


@dataclass
class Outcome:
    """What the child sent back; `value` fails the calling test with one clear line."""

    run: object  # procs.RunResult
    data: dict | None
    tensor_file: Path
    _tensors: dict | None = field(default=None, repr=False)

    def value(self, name: str):
        if self.data is None:
            raise CaseFailed(
                "the grader's child process running this lesson's functions sent nothing back\n"
                + self.run.failure()
            )
        if "load_error" in self.data:
            raise CaseFailed(self.data["load_error"])
        case = self.data["cases"].get(name)
        if case is None:
            raise CaseFailed(f"case {name} did not run (the child stopped before it)")
        if "error" in case:
            err = case["error"]
            where = f" at {err['where']}" if err["where"] else ""
            raise CaseFailed(f"{err['type']}{where}: {err['message']}")
        return case["value"]

    def tensors(self, name: str) -> dict:
        """The tensors case `name` returned, read weights-only (no code can run)."""
        import torch

        keys = self.value(name)["tensors"]
        if self._tensors is None:  # one file for all cases: read it once
            self._tensors = torch.load(self.tensor_file, weights_only=True, map_location="cpu")
        return {key: self._tensors[f"{name}/{key}"] for key in keys}


def _fork_cases() -> bool:
    """Whether a case script may run in a fork of this process. Not where CUDA devices are
    visible: CUDA cannot be used in a fork of a process that has initialised it, and once
    this process has run a backward pass, autograd's device threads make backward fail in
    every fork ("Unable to handle autograd's threading in combination with fork-based
    multiprocessing", measured on an H200 with torch 2.11). There, a new interpreter."""
    from course import procs

    if not procs.can_fork():
        return False
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.device_count() == 0


def _case_child(script: Path, lesson_file: Path, out: Path, env: dict | None) -> int:
    """In a fork of the grader (procs.forked): the case script as `python script lesson out`
    would run it, with the environment procs gives every child."""
    import logging
    import runpy
    import warnings

    from course import procs

    # What pytest installed in this process is not the script's: its log handlers and
    # warning hook write to descriptors the fork closed, where the ranks' sockets and
    # files now are. Measured: a gloo rank of lesson 09's case script died of SIGBUS in
    # every run with them (torch 2.8, and 2.14 in an xdist worker), never without.
    for logger in [logging.root, *logging.root.manager.loggerDict.values()]:
        if isinstance(logger, logging.Logger):
            logger.handlers.clear()
    logging.root.setLevel(logging.WARNING)
    warnings.resetwarnings()
    warnings.showwarning = warnings._showwarning_orig
    environment = procs.child_env(env)
    os.environ.clear()
    os.environ.update(environment)
    if "torch" in sys.modules:  # OMP_NUM_THREADS is read once, at import: say it again
        sys.modules["torch"].set_num_threads(1)
    sys.argv = [str(script), str(lesson_file), str(out)]
    sys.path.insert(0, str(Path(script).parent))
    runpy.run_path(str(script), run_name="__main__")
    return 0


def run_cases(
    script: Path, lesson_file: Path, folder: Path, timeout: float = 90, only=None
) -> Outcome:
    """Run a case script on `lesson_file` in a child, in `folder` (only the cases named in
    `only`, when given); read what it sent."""
    from course import procs

    out = Path(folder) / "cases-out"
    env = {ONLY_ENV: ",".join(only)} if only is not None else None
    cancel = procs.current_cancel  # the lesson's file is known broken: launch nothing
    if _fork_cases() and not (cancel is not None and cancel.refuses([lesson_file])):
        # A fork of this process, which has imported torch and the course: 2-3 s of CPU
        # less than a new interpreter, for every case script of every grade.
        child = functools.partial(_case_child, script, lesson_file, out, env)
        args = [sys.executable, str(script), str(lesson_file), str(out)]
        result = procs.forked(child, args=args, timeout=timeout, cwd=folder)
    else:  # an xdist worker (threads), or children that run as another user
        result = procs.python(script, lesson_file, out, timeout=timeout, cwd=folder, env=env)
    try:
        data = json.loads((out / RESULTS).read_text())
        if not isinstance(data, dict) or not isinstance(data.get("cases"), dict):
            data = None
    except (OSError, ValueError):
        data = None
    return Outcome(result, data, out / TENSORS)
