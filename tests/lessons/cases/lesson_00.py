"""Lesson 00's functions, called in a child process (course/grader/cases.py).

Run by tests/lessons/test_00_environment.py as `python lesson_00.py LESSON_FILE OUT_DIR`.
The CUDA-present cases pretend GPUs exist (unittest.mock), so they run anywhere;
the `real_*` cases use this machine as it is.
"""

from __future__ import annotations

import contextlib
import io
from unittest import mock

import torch
import torch.distributed as dist

from course.grader.cases import Cases, exits

cases = Cases()
FUNCTIONS = ("cuda_device_count", "library_report", "pick_backend", "device_for", "main")


@contextlib.contextmanager
def fake_gpus(count: int, nccl: bool = True):
    """Pretend this machine has `count` usable GPUs (0 = CUDA unusable)."""
    with (
        mock.patch.object(torch.cuda, "is_available", lambda: count > 0),
        # A device count without a usable CUDA: what a broken driver looks like.
        mock.patch.object(torch.cuda, "device_count", lambda: count or 2),
        mock.patch.object(dist, "is_nccl_available", lambda: nccl),
    ):
        yield


for count in (0, 1, 4):

    def device_count(lesson, count=count):
        with fake_gpus(count):
            return lesson.cuda_device_count()

    device_count.__name__ = f"device_count_{count}"
    cases.case(device_count)

for count, nccl in ((2, True), (1, True), (0, True), (2, False)):

    def backend(lesson, count=count, nccl=nccl):
        with fake_gpus(count, nccl):
            return lesson.pick_backend()

    backend.__name__ = f"pick_backend_{count}_{'nccl' if nccl else 'no_nccl'}"
    cases.case(backend)


@cases.case
def device_for_no_gpu(lesson):
    with fake_gpus(0):
        return [str(lesson.device_for(rank)) for rank in (0, 3)]


@cases.case
def device_for_two_gpus(lesson):
    with fake_gpus(2):
        return [str(lesson.device_for(rank)) for rank in (0, 1)]


for rank in (-1, 2):

    def rejects(lesson, rank=rank):
        with fake_gpus(2):
            try:
                device = lesson.device_for(rank)
            except ValueError as err:
                return {"raised": "ValueError", "message": str(err)}
            return {"raised": None, "returned": str(device)}

    rejects.__name__ = f"device_for_rank_{rank}"
    cases.case(rejects)


@cases.case
def library_report(lesson):
    return lesson.library_report()


@cases.case
def main_json(lesson):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exits(lesson.main, ["--json"])
    return out.getvalue()


@cases.case
def real_gpus(lesson):
    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    device = lesson.device_for(count - 1)
    return {
        "count": lesson.cuda_device_count(),
        "backend": lesson.pick_backend(),
        "device": str(device),
        "sum": torch.ones(2, device=device).sum().item(),
    }


if __name__ == "__main__":
    cases.run(requires=FUNCTIONS)
