"""Lesson 05's ring all-reduce, called in ranks started by a child process (course/grader/cases.py).

Run by tests/lessons/test_05_collectives.py as `python lesson_05.py LESSON_FILE OUT_DIR`. Each case
starts `world` gloo ranks with mp.spawn; every rank loads the lesson file, fills its tensor
with ring_input(world, size, rank) and calls the lesson's ring_all_reduce on it. The case
returns what each rank's tensor holds afterwards; the test computes the sums itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from course import launch, ranks
from course.grader.cases import Cases, Tensors

cases = Cases()
SIZES = (1, 5, 1000, 4099)  # fewer values than ranks, uneven splits, odd lengths
LARGE = 1 << 22  # 16 MB of float32


def ring_input(world: int, size: int, rank: int) -> torch.Tensor:
    """Integer-valued floats: their sums are exact in any order (the test has a copy)."""
    gen = torch.Generator().manual_seed(1000 * world + 7 * size + rank)
    return torch.randint(-1000, 1000, (size,), generator=gen).float()


COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "broadcast", "all_to_all", "all_to_all_single",
    "gather", "scatter",
)  # fmt: skip
POINT_TO_POINT = {"send": "dst", "isend": "dst", "recv": "src", "irecv": "src"}


class OpLog:
    """What the lesson calls from torch.distributed while `active`: each collective's
    name, and each point-to-point message's kind, peer and number of values. Patched
    before the lesson is loaded, so `from torch.distributed import isend` sees it too;
    batch_isend_irecv runs its ops through the patched isend and irecv."""

    def __init__(self):
        self.active, self.ops = False, []

    def patch(self) -> None:
        for name in (*COLLECTIVES, *POINT_TO_POINT):
            original = getattr(dist, name, None)
            if original is not None:
                wrapped = self._wrap(name, original)
                setattr(dist, name, wrapped)
                setattr(dist.distributed_c10d, name, wrapped)

    def _wrap(self, name, original):
        def call(*args, **kwargs):
            if self.active:
                if name in POINT_TO_POINT:
                    key = POINT_TO_POINT[name]
                    peer = args[1] if len(args) > 1 else kwargs.get(key, kwargs.get(f"group_{key}"))
                    tensor = args[0] if args else kwargs.get("tensor")
                    self.ops.append([name, peer, int(tensor.numel())])
                else:
                    self.ops.append([name, None, 0])
            return original(*args, **kwargs)

        return call


def _rank(rank, world, port, lesson_file, out, sizes, backend="gloo") -> None:
    from course.grader import submission

    device = ranks.join_local(rank, world, backend, port)
    log = OpLog()
    log.patch()  # before the lesson is loaded: its own imports see the logging functions
    try:
        lesson = submission.load(Path(lesson_file), requires=("ring_all_reduce",))
        results, ops = {}, {}
        for size in sizes:
            tensor = ring_input(world, size, rank).to(device)
            log.active, log.ops = True, []
            try:
                lesson.ring_all_reduce(tensor)
            finally:
                log.active = False
            results[str(size)], ops[str(size)] = tensor.cpu(), log.ops
        torch.save(results, Path(out) / f"ring-{world}-{rank}.pt")
        (Path(out) / f"ops-{world}-{rank}.json").write_text(json.dumps(ops))
        dist.barrier()
    finally:
        dist.destroy_process_group()


# A correct gloo ring never waits long in one send or receive: every case, 2-4 ranks and
# 16 MB, passed with a 0.3 s process-group timeout (twice, four busy loops on two cores,
# 2026-12-01). The ranks get 10 s, 30x that: a ring that deadlocks (blocking sends first)
# fails in 10 s instead of waiting out half the case script's deadline. Stretched, as every
# deadline, by COURSE_TIMEOUT_SCALE.
RING_PG_TIMEOUT_S = 10 * launch.timeout_scale()


def ring(world: int, sizes, backend: str = "gloo") -> Tensors:
    out = cases.out / f"ranks-{backend}"
    out.mkdir(parents=True, exist_ok=True)
    if backend == "gloo":  # the ranks read it in ranks.join_local (forked: they inherit it)
        os.environ["COURSE_PG_TIMEOUT"] = f"{RING_PG_TIMEOUT_S:g}"
    args = (str(cases.lesson_file), str(out), sizes, backend)
    cases.spawn(_rank, world, *args, what=f"{world}-rank ring", cuda=backend == "nccl")
    got, ops = {}, {}
    for rank in range(world):
        saved = torch.load(out / f"ring-{world}-{rank}.pt", weights_only=True)
        got |= {f"{size}/{rank}": saved[str(size)] for size in sizes}
        calls = json.loads((out / f"ops-{world}-{rank}.json").read_text())
        ops |= {f"{size}/{rank}": calls[str(size)] for size in sizes}
    return Tensors(got, extra={"ops": ops})


@cases.case
def ring_2(lesson):
    return ring(2, SIZES)


@cases.case
def ring_3(lesson):
    return ring(3, SIZES)


@cases.case
def ring_4(lesson):
    return ring(4, SIZES)


@cases.case
def ring_large(lesson):
    return ring(2, (LARGE,))


@cases.case
def ring_nccl(lesson):
    """On 2 GPUs only (tests/lessons/test_05_collectives.py marks its test gpus(2))."""
    if torch.cuda.device_count() < 2:
        return None
    return ring(2, SIZES, backend="nccl")


if __name__ == "__main__":
    cases.run(requires=("ring_all_reduce",))
