"""The grading kit (course/grader/: comm, meter, tripwires, draws), tested on its own: what
lessons 10 and 11 (and every later lesson) assert through it must be what happened."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from course import REPO_ROOT
from course.measure import comm, draws, tripwires
from course.measure.meter import Meter

RANKS = textwrap.dedent(
    """
    import json, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    from course import ranks
    from course.measure.comm import CommRecorder

    def rank(r, port, out):
        ranks.join_local(r, 2, "gloo", port)
        recorder = CommRecorder()
        with recorder:
            t = torch.ones(4)
            with recorder.during("positional"):
                dist.all_reduce(t)
                dist.all_gather_into_tensor(torch.empty(8), t)
            with recorder.during("keyword"):
                dist.all_gather_into_tensor(output_tensor=torch.empty(8), input_tensor=t,
                                            async_op=True).wait()
                dist.reduce_scatter_tensor(output=torch.empty(2), input=torch.ones(4))
                dist.broadcast(tensor=t.double(), src=1)
            with recorder.during("p2p"):
                if r == 0:
                    dist.isend(torch.ones(3, dtype=torch.bfloat16), dst=1).wait()
                else:
                    dist.irecv(torch.empty(3, dtype=torch.bfloat16), src=0).wait()
            sub = dist.new_group([1])
            if r == 1:
                with recorder.during("subgroup"):
                    dist.all_reduce(torch.ones(2), group=sub)
        if r == 0:
            keep = ("op", "phase", "bytes", "received", "dtypes", "group", "peer")
            rows = [{k: x[k] for k in keep} for x in recorder.records]
            open(out, "w").write(json.dumps(rows))
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(rank, args=(ranks.free_port(), sys.argv[1]), nprocs=2)
    """
)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("comm")
    (folder / "ranks.py").write_text(RANKS)
    run = subprocess.run([sys.executable, str(folder / "ranks.py"), str(folder / "out.json")],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads((folder / "out.json").read_text())


def _of(records, phase):
    return [(r["op"], r["bytes"], r["received"], r["dtypes"], r["peer"]) for r in records
            if r["phase"] == phase]  # fmt: skip


def test_the_recorder_sees_positional_and_keyword_calls_alike(recorded):
    """The same collectives, called with positional or keyword arguments, are recorded with
    the bytes this rank sends and receives, the dtype, and the root of a broadcast."""
    f32 = ["torch.float32"]
    assert _of(recorded, "positional") == [("all_reduce", 16, 0, f32, None),
                                           ("all_gather", 16, 32, f32, None)]  # fmt: skip
    assert _of(recorded, "keyword") == [
        ("all_gather", 16, 32, f32, None), ("reduce_scatter", 16, 8, f32, None),
        ("broadcast", 32, 0, ["torch.float64"], 1),
    ]  # fmt: skip
    assert {tuple(r["group"]) for r in recorded if r["phase"] != "p2p"} == {(0, 1)}


def test_the_recorder_sees_messages_with_their_peer(recorded):
    """An isend is a send of 3 bfloat16 values to rank 1; rank 0 took part in no subgroup
    collective (its group's records list global ranks)."""
    assert _of(recorded, "p2p") == [("send", 6, 0, ["torch.bfloat16"], 1)]
    assert _of(recorded, "subgroup") == []


def test_the_meter_counts_what_a_call_held_on_the_way():
    """A call that allocates 4 MB, frees it and returns a view of a 1 MB tensor peaked at 5
    MB or more and still holds 1 MB: storage, not the view's 4 bytes."""

    def call():
        big = torch.ones(1024, 1024)  # 4 MiB
        kept = torch.zeros(256 * 1024)  # 1 MiB, kept through a one-element view
        del big
        return kept[:1]

    with Meter() as meter:
        view = call()
    assert view.numel() == 1
    assert 5 * 2**20 <= meter.peak < 6 * 2**20, meter.peak
    assert 2**20 <= meter.net < 2**20 + 4096, meter.net


def test_tripwires_note_the_library_and_still_run_it(tmp_path):
    """A tripwired class still builds what it built (a subclass: isinstance holds); its use
    is noted, logged and named; removed, the original is back."""
    from torch.distributed import optim as dist_optim

    original = dist_optim.ZeroRedundancyOptimizer
    log = tmp_path / "rank0.tripwires"
    with tripwires.Tripwires("ZeroRedundancyOptimizer", log=log) as wires:
        wired = dist_optim.ZeroRedundancyOptimizer
        assert wired is not original and issubclass(wired, original)
        with pytest.raises(Exception):  # noqa: B017 - no process group: torch's own error
            wired([torch.nn.Parameter(torch.ones(1))], torch.optim.SGD, lr=0.1)
        assert wires.used == ["ZeroRedundancyOptimizer"]
    assert dist_optim.ZeroRedundancyOptimizer is original
    assert tripwires.used_in(tmp_path) == ["ZeroRedundancyOptimizer"]
    line = tripwires.refused(["ZeroRedundancyOptimizer"], "ShardedOptimizer")
    assert "ShardedOptimizer used ZeroRedundancyOptimizer" in line
    with pytest.raises(ValueError, match="no tripwire"):
        tripwires.Tripwires("not_a_library_piece")


def test_the_recorder_ticks_the_matrix_products_when_asked():
    """CommRecorder(matmuls=True) notes a tick for each matrix product (what attention
    computes with), on the clock its records and marks share; without it, none."""
    a = torch.ones(2, 3, 4)
    recorder = comm.CommRecorder(matmuls=True)
    with recorder:
        before = recorder.mark("before")
        a @ a.transpose(-2, -1)  # one bmm
        (a + 1).sum()  # no product
        after = recorder.mark("after")
    assert len(recorder.matmuls) == 1 and before < recorder.matmuls[0] < after
    plain = comm.CommRecorder()
    with plain:
        a @ a.transpose(-2, -1)
    assert plain.matmuls is None and plain.records == []


def test_a_tripwire_on_an_autograd_function_notes_its_apply():
    """torch.utils.checkpoint.CheckpointFunction.apply, called directly, is the library's
    checkpoint too: the wire notes it, and the result is the original's."""
    import torch.utils.checkpoint as tuc

    original = tuc.CheckpointFunction
    layer = torch.nn.Linear(3, 3)
    x = torch.ones(2, 3, requires_grad=True)
    with tripwires.Tripwires("CheckpointFunction") as wires:
        out = tuc.CheckpointFunction.apply(layer, True, x)
        out.sum().backward()
        assert wires.used == ["CheckpointFunction"]
    assert tuc.CheckpointFunction is original
    assert torch.allclose(out, layer(torch.ones(2, 3))) and x.grad is not None


def test_draws_replay_from_the_seed_and_vary_across_seeds(monkeypatch):
    """The same seed draws the same everywhere; over 50 seeds every option comes up."""
    picks = {}
    for seed in range(1, 51):
        monkeypatch.setenv(draws.SEED_ENV, str(seed))
        picks[seed] = draws.draw("kit.stages", (3, 4, 5))
        assert draws.draw("kit.stages", (3, 4, 5)) == picks[seed]
        assert sorted(draws.shuffled("kit.order", range(4))) == [0, 1, 2, 3]
    assert set(picks.values()) == {3, 4, 5}
    monkeypatch.setenv(draws.SEED_ENV, "twelve")
    with pytest.raises(SystemExit, match="not an integer"):
        draws.grade_seed()
