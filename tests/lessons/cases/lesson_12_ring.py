"""Lesson 12's ring attention, in gloo ranks forked from a child process (course/grader/cases.py).

Run by tests/lessons/test_12_long_sequences.py as `python lesson_12_ring.py LESSON_FILE OUT_DIR`.
Case `pieces` calls chunks_of and merge in the child. Cases `ring` and `gather` start
WORLD ranks (2, 3 or 4, drawn from the grading seed); each takes the grader's q, k, v and
output gradient (tests/lessons/cases/lesson_12_models.py), keeps the chunks the
submission's chunks_of gives it, and runs the submission's RingAttention (zig-zag, then
plain) or gathered_attention, forward and backward. Each rank writes its output and
gradients, and what the grading kit saw: every message or collective below
torch.distributed, by phase (peer, bytes, dtype), and the matmul FLOPs of its forward.
The test puts the ranks' pieces back in sequence order and compares them with causal
attention over the whole sequence, computed in float64 in the grading process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
import lesson_12_models as m  # noqa: E402

from course.grader.cases import Cases, Tensors  # noqa: E402
from course.grader.tolerances import seed  # noqa: E402
from course.measure.comm import CommRecorder  # noqa: E402
from course.measure.draws import draw  # noqa: E402

cases = Cases()
REQUIRES = ("chunks_of", "merge", "RingAttention", "gathered_attention")
WORLD = draw("12.ring_ranks", m.RING_RANKS)
SEED = seed(11)  # the q, k, v drawn; `course tolerances 12` measures over many


def _rank(rank, world, port, out, lesson_file, how):
    from torch.utils.flop_counter import FlopCounterMode

    from course import ranks
    from course.grader import submission

    torch.set_num_threads(1)
    waits = CommRecorder()  # only its wrappers: each split's recorder takes the records
    waits.watch_waits()  # before the lesson loads: when each isend's Work is waited for
    lesson = submission.load(Path(lesson_file), requires=REQUIRES)
    ranks.join_local(rank, world, "gloo", port)
    tensors, found = {}, {}
    try:
        q, k, v, dout = m.qkv(world, SEED)
        splits = ("zigzag", "plain") if how == "ring" else ("zigzag",)
        for split in splits:
            chunks = list(lesson.chunks_of(rank, world, split))
            parts = world * len(chunks) if chunks else 1
            local = [m.pieces(t, chunks, parts).requires_grad_() for t in (q, k, v)]
            recorder = CommRecorder(matmuls=True)
            waits.records, waits.tick = recorder.records, recorder.tick  # one clock
            with recorder, FlopCounterMode(display=False) as flops:
                with recorder.during("forward"):
                    if how == "ring":
                        output = lesson.RingAttention.apply(*local, split)
                    else:
                        output = lesson.gathered_attention(*local, split)
                forward_flops = flops.get_total_flops()
            matmuls = list(recorder.matmuls)  # the forward's
            with recorder, recorder.during("backward"):
                output.backward(m.pieces(dout, chunks, parts))
            tensors |= {f"{split}/out": output.detach(), f"{split}/dq": local[0].grad,
                        f"{split}/dk": local[1].grad, f"{split}/dv": local[2].grad}  # fmt: skip
            found[split] = {
                "chunks": chunks, "flops": forward_flops, "kv_bytes": 2 * local[1].nbytes,
                "records": [{k: r.get(k) for k in ("op", "phase", "peer", "bytes", "received",
                                                   "dtypes", "tick", "waited")}
                            for r in recorder.records],
                "matmuls": matmuls,
            }  # fmt: skip
        torch.save(tensors, Path(out) / f"rank{rank}.pt")
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(found))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(how: str):
    out = cases.out / how
    out.mkdir(parents=True, exist_ok=True)
    cases.spawn(_rank, WORLD, str(out), str(cases.lesson_file), how,
                what=f"{WORLD} gloo ranks running {how} attention")  # fmt: skip
    tensors, found = {}, {"world": WORLD}
    for rank in range(WORLD):
        got = torch.load(out / f"rank{rank}.pt", weights_only=True)
        tensors |= {f"rank{rank}/{k}": v for k, v in got.items()}
        found[str(rank)] = json.loads((out / f"rank{rank}.json").read_text())
    return Tensors(tensors, found)


@cases.case
def pieces(lesson):
    """chunks_of for 2 to 4 ranks, both splits; merge of the grader's partial attentions."""
    chunks = {f"{world}/{split}": [list(lesson.chunks_of(r, world, split)) for r in range(world)]
              for world in (2, 3, 4) for split in ("zigzag", "plain")}  # fmt: skip
    a, b, la, lb = m.merge_inputs(torch.Generator().manual_seed(m.RING_PIECES_SEED))
    out, lse = lesson.merge(a, la, b, lb)
    empty = torch.zeros_like(a), torch.full_like(la, -torch.inf)
    first, first_lse = lesson.merge(*empty, b, lb)  # the first block merged into nothing
    return Tensors({"out": out, "lse": lse, "first": first, "first_lse": first_lse},
                   {"chunks": chunks})  # fmt: skip


@cases.case
def ring(lesson):
    return _spawn("ring")


@cases.case
def gather(lesson):
    return _spawn("gather")


if __name__ == "__main__":
    cases.run(requires=REQUIRES)
