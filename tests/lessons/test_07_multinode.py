"""Grades lesson 07: a launcher per node (lessons/07_multinode/launch.py).

The grader's job (tests/lessons/cases/lesson_07_job.py) is started through the student's launcher,
never imported here. Launches, started together and shared by the tests (once per
backend):
- two: two launchers on this machine act as two nodes of one process each, meeting at a
  c10d rendezvous on loopback. Node 1's launcher starts STAGGER seconds before node 0's,
  as happens on real machines: it must wait for node 0, not give up. With nccl each
  "node" sees one GPU of its own (CUDA_VISIBLE_DEVICES), as two machines would.
- one: one launcher with 2 processes, the same job.
- wrong: node 1 alone, pointed at a port where nothing listens, with --connect-timeout 5.
- fails: one launcher, one process of a job that exits with code 3
  (tests/lessons/cases/lesson_07_fails.py): torchrun then exits 1, and so must the launcher.
The job records what torchrun told every process and trains 5 DDP steps; both jobs see the
same 2 ranks and the same data, so their weights must be identical.
"""

from __future__ import annotations

import json
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from course import registry
from course.grader.launches import needed, shared
from course.probes import connect_log
from course.ranks import free_port

LESSON = registry.get("07")
JOB = Path(__file__).with_name("cases") / "lesson_07_job.py"
FAILS = JOB.with_name("lesson_07_fails.py")
TORCHRUN_FAILED = 1  # torchrun's exit code when a process of its job failed (ChildFailedError)
STAGGER = 2.0  # seconds node 1's launcher runs before node 0's
WRONG_TIMEOUT = 5  # --connect-timeout of the wrong-endpoint launch
WRONG_LIMIT = WRONG_TIMEOUT + 25  # the launch must have ended by then (start-up included)

_runs: dict = {}


def launcher_command(impl, *args, delay: float = 0.0) -> list[str]:
    start = [sys.executable, str(LESSON.path(impl))]
    if delay:  # the same launcher, started `delay` seconds later
        code = (
            "import os, sys, time; time.sleep(float(sys.argv[1])); "
            "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
        )
        start = [sys.executable, "-c", code, str(delay), str(LESSON.path(impl))]
    return [*start, *map(str, args)]


@pytest.fixture
def runs(impl, backend, tmp_path_factory, request, launcher):
    def launch():
        folders = {
            name: tmp_path_factory.mktemp(f"{name}-{backend}")
            for name in ("two", "one", "wrong", "fails")
        }
        jobs = {}
        endpoint = f"127.0.0.1:{free_port()}"
        for node in (0, 1):
            args = ["--nnodes", 2, "--node-rank", node, "--endpoint", endpoint, "--job-id", "two"]
            args += ["--", JOB, folders["two"], backend]
            gpu = {"CUDA_VISIBLE_DEVICES": str(node)} if backend == "nccl" else {}
            delay = STAGGER if node == 0 else 0.0
            jobs[f"node{node}"] = dict(
                args=launcher_command(impl, *args, delay=delay),
                timeout=120,
                cwd=folders["two"],
                env=gpu,
                log_dir=folders["two"] / "ranks",  # a failure shows every rank's last lines
            )
        args = ["--nproc-per-node", 2, "--endpoint", f"127.0.0.1:{free_port()}", "--job-id", "one"]
        jobs["one"] = dict(
            args=launcher_command(impl, *args, "--", JOB, folders["one"], backend),
            timeout=120,
            cwd=folders["one"],
            log_dir=folders["one"] / "ranks",
        )
        args = ["--nnodes", 2, "--node-rank", 1, "--endpoint", f"127.0.0.1:{free_port()}"]
        args += ["--connect-timeout", WRONG_TIMEOUT, "--", JOB, folders["wrong"], backend]
        jobs["wrong"] = dict(
            args=launcher_command(impl, *args),
            timeout=WRONG_LIMIT,
            cwd=folders["wrong"],
            env={connect_log.LOG_ENV: str(folders["wrong"] / "connects.jsonl")},
        )
        args = ["--endpoint", f"127.0.0.1:{free_port()}", "--job-id", "fails", "--", FAILS]
        jobs["fails"] = dict(args=launcher_command(impl, *args), timeout=60, cwd=folders["fails"])
        want = needed(request, tuple(jobs))
        # The two nodes are one job: when one fails, the other stops at once instead of
        # waiting for its peer until the deadline. `one` and `wrong` run beside them.
        pair = {name: jobs[name] for name in ("node0", "node1") if name in want}
        rest = {name: jobs[name] for name in ("one", "wrong", "fails") if name in want}
        with ThreadPoolExecutor(max_workers=2) as pool:
            two = pool.submit(launcher.run_all, pair, fail_fast=True)
            others = pool.submit(launcher.run_all, rest)
        return {**two.result(), **others.result()}, folders

    return shared(_runs, backend, launch)


def args_of(result, flag: str) -> str:
    return result.args[result.args.index(flag) + 1]


def ranks_seen(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))]


def finished(runs, *names):
    """The folders, once every launch in `names` succeeded; else the test fails with the
    story of the failed one, and for a failed node of the two-node job, of both nodes:
    the launcher that failed first is often the one left waiting for the other."""
    results, folders = runs
    for name in names:
        if results[name].ok:
            continue
        if name in ("node0", "node1"):
            if results["node0"].reported or results["node1"].reported:
                pytest.fail(results[name].failure(), pytrace=False)  # said once, earlier
            story = [f"--- launcher {n} ---\n{results[n].failure()}" for n in ("node0", "node1")]
            pytest.fail("the two-node job failed:\n" + "\n".join(story), pytrace=False)
        pytest.fail(f"launch {name}: {results[name].failure()}", pytrace=False)
    return folders


@pytest.mark.core
@pytest.mark.points(3)
@pytest.mark.needs("node0", "node1", "one")
def test_two_launchers_make_one_job_of_two_ranks(runs, backend):
    """Two launchers, one process each: world size 2, ranks 0 and 1, LOCAL_RANK 0 on both."""
    folders = finished(runs, "node0", "node1")
    seen = ranks_seen(folders["two"])
    summary = [{k: r[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE")} for r in seen]
    assert len(seen) == 2 and all(r["WORLD_SIZE"] == 2 for r in seen), (
        f"expected 2 processes in one job of world size 2, saw {summary}. Likely cause: the "
        "torchrun command does not pass --nnodes, or the two nodes use different --rdzv_id "
        "or --rdzv_endpoint and form two jobs"
    )
    assert sorted(r["RANK"] for r in seen) == [0, 1], summary
    assert sorted(r["GROUP_RANK"] for r in seen) == [0, 1], (
        f"expected one process on each of 2 nodes (GROUP_RANK 0 and 1), saw {summary}"
    )
    assert all(r["LOCAL_RANK"] == 0 and r["LOCAL_WORLD_SIZE"] == 1 for r in seen), (
        f"each node runs one process, so LOCAL_RANK is 0 on both while RANK is 0 and 1; "
        f"saw {summary}. Likely cause: --nproc_per_node is not 1 (--nproc-per-node)"
    )
    one = ranks_seen(finished(runs, "one")["one"])
    assert sorted((r["GROUP_RANK"], r["LOCAL_RANK"]) for r in one) == [(0, 0), (0, 1)], (
        f"one launcher with --nproc-per-node 2: expected LOCAL_RANK 0 and 1 on node 0, saw {one}"
    )


@pytest.mark.core
@pytest.mark.points(2)
@pytest.mark.needs("node0", "node1", "one")
def test_two_nodes_train_exactly_like_one_node_with_two_processes(runs, backend):
    """A job of 2 nodes x 1 process ends with the same bits as 1 node x 2 processes."""
    folders = finished(runs, "node0", "node1", "one")
    two, one = (torch.load(folders[n] / "final.pt", weights_only=True) for n in ("two", "one"))
    worst = max((two[k] - one[k]).abs().max().item() for k in one)
    assert worst == 0, (
        f"the 2-node job's weights differ from the 1-node job's by {worst:.3g}; the same "
        "2 ranks on the same data should give the same bits"
    )


@pytest.mark.core
@pytest.mark.points(2)
@pytest.mark.needs("wrong")
def test_a_wrong_endpoint_fails_fast_in_one_line(runs, backend):
    """Nothing listens at the endpoint: the launcher gives up after --connect-timeout 5."""
    results, folders = runs
    result = results["wrong"]
    port = int(args_of(result, "--endpoint").rsplit(":", 1)[1])
    tries = [a for a in connect_log.read(folders["wrong"] / "connects.jsonl") if a["port"] == port]
    if result.timed_out:
        seen = (
            f"It tried the endpoint {len(tries)} times over "
            f"{tries[-1]['t'] - tries[0]['t']:.0f} s and kept trying: it must give up after "
            f"--connect-timeout {WRONG_TIMEOUT} s"
            if tries
            else "It never tried the endpoint itself (no TCP connection from the launcher "
            "was seen): expected it to test the endpoint before starting torchrun, whose "
            "rendezvous waits for many minutes"
        )
        pytest.fail(
            f"a node pointed at an endpoint where nothing listens was still running after "
            f"{WRONG_LIMIT} s (--connect-timeout {WRONG_TIMEOUT}). {seen}\n{result.describe()}",
            pytrace=False,
        )
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.returncode != 0 and lines, result.describe()
    last = lines[-1]
    assert "Traceback" not in result.output and "127.0.0.1" in last, (
        f"expected one line that names the endpoint, got:\n{result.output[-1500:]}"
    )
    # Measured from the launcher's first attempt (course/probes/connect_log.py), not from its
    # start: on a loaded machine the imports alone can take longer than the timeout.
    assert tries, (
        f"the launcher gave up without opening a TCP connection to {port} (none was seen "
        "from inside it): it must try node 0's endpoint, and keep trying, before giving up"
    )
    kept = result.started + result.seconds - tries[0]["t"]
    assert kept >= WRONG_TIMEOUT - 0.5, (
        f"gave up {kept:.1f} s after its first attempt ({len(tries)} attempts), before "
        f"--connect-timeout {WRONG_TIMEOUT}: node 0 may start a little later than the "
        "others, so a node must keep trying"
    )


@pytest.mark.points(1)
@pytest.mark.needs("fails")
def test_a_failed_job_fails_its_launcher(runs, backend):
    """A scheduler (Slurm, a Kubernetes Job, a CI step) knows a job failed only from the
    launcher's exit code: it must be torchrun's, not 0."""
    results, _ = runs
    result = results["fails"]
    assert not result.timed_out, result.describe()
    assert "exits with code 3" in result.output, (
        "the job's process never printed its line: torchrun did not start it\n" + result.describe()
    )
    assert result.returncode == TORCHRUN_FAILED, (
        f"the job's only process exited with code 3, so torchrun exited {TORCHRUN_FAILED}; "
        f"the launcher exited {result.returncode}. Likely cause: main() does not return "
        "torchrun's exit code (subprocess.call's result)\n" + result.describe()
    )


@pytest.mark.points(1)
def test_dry_run_prints_the_torchrun_command_of_every_option(impl, tmp_path, launcher):
    """--dry-run prints the command and starts nothing; every option, at a value that is
    not its default, reaches it, as torchrun's own parser reads the command."""
    from torch.distributed.run import get_args_parser

    args = ["--dry-run", "--nnodes", "3", "--node-rank", "1", "--nproc-per-node", "4"]
    args += ["--endpoint", "10.1.2.3:29555", "--job-id", "dry", "--max-restarts", "3"]
    result = launcher.python(LESSON.path(impl), *args, "--", "job.py", "--lr", "0.1", timeout=30)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.returncode == 0 and len(lines) == 1, (
        f"expected exit 0 and one line, the torchrun command\n{result.describe()}"
    )
    command = shlex.split(lines[0])
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"], (
        f"expected the command to start with this Python's -m torch.distributed.run: {lines[0]}"
    )
    seen = get_args_parser().parse_args(command[3:])
    got = {
        "nnodes": seen.nnodes,
        "nproc_per_node": seen.nproc_per_node,
        "rdzv_endpoint": seen.rdzv_endpoint,
        "rdzv_id": seen.rdzv_id,
        "max_restarts": seen.max_restarts,
        "script": [seen.training_script, *seen.training_script_args],
    }
    want = {
        "nnodes": "3",
        "nproc_per_node": "4",
        "rdzv_endpoint": "10.1.2.3:29555",
        "rdzv_id": "dry",
        "max_restarts": 3,
        "script": ["job.py", "--lr", "0.1"],
    }
    wrong = {key: (got[key], want[key]) for key in want if got[key] != want[key]}
    assert not wrong, f"torchrun would read (got, expected): {wrong} from {lines[0]}"
    assert seen.rdzv_backend == "c10d", f"expected the c10d rendezvous, got {seen.rdzv_backend}"


@pytest.mark.points(1)
@pytest.mark.parametrize(
    "args, words",
    [
        (["--nnodes", "2", "--node-rank", "2", "job.py"], "--node-rank 2"),
        (["--endpoint", "node0", "job.py"], "HOST:PORT"),
        (["--endpoint", "node0:http", "job.py"], "HOST:PORT"),
        (["no_such_job.py"], "no such script"),
    ],
)
def test_bad_arguments_are_one_line(impl, tmp_path, args, words, launcher):
    """Wrong launcher arguments (a node rank past --nnodes, an endpoint without a numeric
    port, a script that is not there) stop with one line."""
    result = launcher.python(LESSON.path(impl), *args, timeout=30, cwd=tmp_path)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and words in lines[0], result.describe()
