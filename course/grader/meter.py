"""The grading kit's memory high-water meter: the most bytes a rank's tensors held *during*
a call (a step, a backward, a save), not what is left after it.

What a rank holds at rest can hide what it held on the way: an optimizer that steps every
parameter and then drops the state it does not own ends with a shard and peaked at the
whole. The meter reads PyTorch's own allocator, through the profiler's memory events
(every allocation and free of the CPU or CUDA allocator, with its size), so it counts
storage, not element counts: a view of a whole tensor is the whole tensor, and a tensor
allocated and freed inside the call counts while it lived.

    with Meter() as meter:
        optimizer.step()
    meter.peak     # the high-water mark, bytes above what was held when the call began
    meter.net      # bytes still held at the end, of those allocated inside

Measure the grader's own reference the same way (torch's AdamW over the whole model, say)
and bound the submission's peak by a share of it: both then count the same temporaries.
"""

from __future__ import annotations

import contextlib
import os

import torch


@contextlib.contextmanager
def _quiet():
    """The profiler's start and stop write lines of their own to stderr (kineto's "USDT:
    profiler_start", "gpuGetDeviceCount failed" on a machine without GPUs): not the
    rank's output, which a failure report shows."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


class Meter:
    def __init__(self, device: str = "cpu"):
        self.device = device
        self.peak = self.net = 0
        self.events = 0
        self._profile = None

    def __enter__(self) -> Meter:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.device != "cpu":
            activities.append(ProfilerActivity.CUDA)
        self._profile = profile(activities=activities, profile_memory=True)
        with _quiet():
            self._profile.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        with _quiet():
            self._profile.__exit__(*exc)
        kind = torch.autograd.DeviceType.CPU if self.device == "cpu" else None
        events = [
            e for e in self._profile.profiler.kineto_results.events()
            if e.name() == "[memory]" and (kind is None or e.device_type() == kind)
        ]  # fmt: skip
        events.sort(key=lambda e: e.start_ns())
        held = peak = 0
        for event in events:
            held += event.nbytes()
            peak = max(peak, held)
        self.peak, self.net, self.events = peak, held, len(events)
