"""course/probes/ddp_log.py: DDP's all-reduces counted from inside a process by a comm hook.

Each case runs a one-rank gloo DDP in a child process (the probe patches DDP's
class, which must not happen inside the test process), with COURSE_DDP_LOG
armed the way the grader arms it.
"""

from __future__ import annotations

import sys
import textwrap

from course import launch, ranks
from course.probes import ddp_log
from course.probes.ddp_log import LOG_ENV

SCRIPT = """
import contextlib, os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 2))
model = DDP(net, bucket_cap_mb={cap}, static_graph={static})
calls = []
if {own_hook}:
    def own(state, bucket):
        calls.append(bucket.index())
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    model.register_comm_hook(None, own)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(6):
    last = i % {k} == {k} - 1
    with contextlib.nullcontext() if last else model.no_sync():
        model(torch.randn(8, 64)).sum().backward()
    if last:
        optimizer.step()
        optimizer.zero_grad()
print("own hook calls", len(calls), flush=True)
dist.destroy_process_group()
os._exit(0)  # DDP keeps the group alive: skip its teardown at interpreter exit (can abort)
"""


def run(tmp_path, cap=25, static=False, k=1, own_hook=False):
    code = SCRIPT.format(port=ranks.free_port(), cap=cap, static=static, k=k, own_hook=own_hook)
    (tmp_path / "log").mkdir()
    result = launch.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        timeout=60,
        env={LOG_ENV: str(tmp_path / "log")},
    )
    assert result.ok, result.describe()
    return ddp_log.read(tmp_path / "log"), result.output


def test_one_round_per_step_whatever_the_buckets(tmp_path):
    lines, _ = run(tmp_path, cap=0.01, k=3)
    assert [line["steps"] for line in lines] == [1, 2]
    assert ddp_log.per_step(lines) == [1, 1]  # two steps of 3 micro-batches: 1 round each
    later = ddp_log.per_step(lines, "allreduces")[-1]
    assert later > 1, "0.01 MB buckets split the gradients into several all-reduces"
    assert lines[-1]["bucket_cap_mb"] == 0.01 or abs(lines[-1]["bucket_cap_mb"] - 0.01) < 1e-4
    assert lines[-1]["gradient_as_bucket_view"] is False and lines[-1]["static_graph"] is False


def test_every_synchronised_backward_is_a_round(tmp_path):
    lines, _ = run(tmp_path, k=1)
    assert ddp_log.per_step(lines) == [1] * 6
    assert ddp_log.per_step(lines, "allreduces") == [1] * 6  # 25 MB: one bucket


def test_a_lessons_own_comm_hook_still_runs_behind_the_counter(tmp_path):
    lines, output = run(tmp_path, k=2, own_hook=True)
    assert ddp_log.per_step(lines) == [1, 1, 1]
    assert "own hook calls 3" in output


def test_static_graph_is_recorded(tmp_path):
    lines, _ = run(tmp_path, static=True, k=1)
    assert lines[-1]["static_graph"] is True


def test_static_graph_cannot_start_inside_no_sync():
    """Lesson 08's page and its --static-graph/--accumulate refusal rest on this PyTorch
    behaviour: DDP records a static graph in its first iteration, which must synchronise."""
    code = f"""
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{ranks.free_port()}", rank=0,
                        world_size=1)
model = DDP(torch.nn.Linear(8, 2), static_graph=True)
try:
    with model.no_sync():
        model(torch.randn(4, 8)).sum().backward()
    model(torch.randn(4, 8)).sum().backward()
    print("no error")
except RuntimeError as err:
    print("refused:", str(err).splitlines()[0])
dist.destroy_process_group()
"""
    result = launch.run([sys.executable, "-c", textwrap.dedent(code)], timeout=60)
    assert result.ok, result.describe()
    assert "refused: expect_autograd_hooks_ INTERNAL ASSERT FAILED" in result.output, (
        "this PyTorch accepts static_graph with a first iteration inside no_sync(): update "
        "lesson 08's page and its --static-graph/--accumulate check\n" + result.output
    )
