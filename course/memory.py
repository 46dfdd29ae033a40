"""Memory a lesson can measure on any device: the activations autograd keeps for backward.

A CUDA out-of-memory error is mostly about activations: the tensors that forward
saves so that backward can compute the gradients. `torch.autograd.graph.
saved_tensors_hooks` sees each of them as it is saved, so their bytes can be
counted on a CPU as well as on a GPU, where `torch.cuda.max_memory_allocated`
counts everything at once (weights, gradients, optimizer state, the allocator's
caching). SavedTensors counts what is alive at each moment and keeps the peak:

    with memory.SavedTensors(model, budget=8 << 20) as meter:
        loss = model(x).sum()
        loss.backward()
    meter.peak  # bytes

A tensor is counted once per storage (ReLU(inplace=True) saves the same storage
twice), and the model's own parameters are not counted: they are in memory
anyway. With `budget`, saving more than that raises torch.OutOfMemoryError as
the CUDA allocator would, so lesson 09's out-of-memory exercise fails on any machine.

What saved-tensor hooks cannot see, the allocator can: `torch.utils.checkpoint` keeps its
inputs in a closure and selective checkpointing caches its outputs outside the hooks.
Allocated reads the allocator itself (CUDA's counters; on the CPU, the profiler's memory
events), so it counts whatever a region allocates and still holds (lesson 12):

    with memory.Allocated("cpu") as held:
        loss = model(x).sum()
    held.net, held.peak  # bytes still held at the end, and the most held on the way
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import nn

MIB = 1 << 20


class _Held:
    """What autograd keeps instead of a saved tensor: the tensor, and the meter to tell
    when autograd lets go of it (after backward, or when the graph is dropped)."""

    __slots__ = ("tensor", "key", "meter")

    def __init__(self, tensor, key, meter):
        self.tensor, self.key, self.meter = tensor, key, meter

    def __del__(self):
        self.meter._release(self.key)


class SavedTensors:
    def __init__(
        self, model: nn.Module | None = None, budget: int | None = None, parameters: bool = True
    ):
        self.budget, self.parameters = budget, parameters
        self.skip = set()
        if model is not None:
            self.skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.live = self.peak = 0
        self._count: dict[int, list[int]] = {}  # storage -> [holders, bytes]
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor):
        if not self.parameters and isinstance(tensor, nn.Parameter):
            return tensor
        storage = getattr(tensor, "_local_tensor", tensor).untyped_storage()  # a DTensor's own
        key = storage.data_ptr()
        if key in self.skip:
            return tensor
        entry = self._count.setdefault(key, [0, storage.nbytes()])
        if entry[0] == 0:
            if self.budget is not None and self.live + entry[1] > self.budget:
                del self._count[key]
                raise torch.OutOfMemoryError(
                    f"out of memory: backward would keep more than {self.budget / MIB:g} MiB "
                    f"of activations (already {self.live / MIB:.1f} MiB saved, "
                    f"{entry[1] / MIB:.1f} MiB more asked)"
                )
            self.live += entry[1]
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        return _Held(tensor, key, self)

    @staticmethod
    def _unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def _release(self, key: int) -> None:
        entry = self._count.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self._count[key]

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        return False


@contextlib.contextmanager
def _quiet():
    """The profiler's start and stop write lines of their own to stderr (kineto's "USDT:
    profiler_start", "gpuGetDeviceCount failed" on a machine without GPUs)."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


class Allocated:
    """The bytes the allocator handed out inside the block: `peak` (the high-water mark
    above what was held when it began) and `net` (what is still held at the end). On
    CUDA the caching allocator's counters; on the CPU, or with profile=True on any
    device, every allocation and free the profiler sees (a few times slower)."""

    def __init__(self, device="cpu", profile: bool | None = None):
        self.device = torch.device(device)
        self.profile = self.device.type == "cpu" if profile is None else profile
        self.peak = self.net = self.events = 0
        self._profiler = None

    def __enter__(self):
        if not self.profile:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            return self
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._profiler = profile(activities=activities, profile_memory=True)
        with _quiet():
            self._profiler.__enter__()
        return self

    def __exit__(self, *exc):
        if not self.profile:
            torch.cuda.synchronize(self.device)
            self.net = torch.cuda.memory_allocated(self.device) - self._start
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._start
            return False
        with _quiet():
            self._profiler.__exit__(*exc)
        kind = torch.autograd.DeviceType.CPU if self.device.type == "cpu" else None
        events = [
            e for e in self._profiler.profiler.kineto_results.events()
            if e.name() == "[memory]" and (kind is None or e.device_type() == kind)
        ]  # fmt: skip
        events.sort(key=lambda e: e.start_ns())
        self.peak, self.net = self.count([e.nbytes() for e in events])
        self.events = len(events)
        return False

    @staticmethod
    def count(sizes: list[int]) -> tuple[int, int]:
        """(peak, net) of allocations (+bytes) and frees (-bytes) in order, counting only
        the blocks allocated inside: a free that no block of its size allocated inside
        and still live explains is a block from before (a graph or a library's cache let
        go of at this moment; the allocator reports its size if it was allocated while
        an earlier profile ran), and would make the count fall below what is held."""
        live: dict[int, int] = {}
        held = peak = 0
        for size in sizes:
            if size < 0 and not live.get(-size):
                continue
            live[abs(size)] = live.get(abs(size), 0) + (1 if size > 0 else -1)
            held += size
            peak = max(peak, held)
        return peak, held
