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
"""

from __future__ import annotations

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
    def __init__(self, model: nn.Module | None = None, budget: int | None = None):
        self.budget = budget
        self.skip = set()
        if model is not None:
            self.skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.live = self.peak = 0
        self._count: dict[int, list[int]] = {}  # storage -> [holders, bytes]
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor):
        key = tensor.untyped_storage().data_ptr()
        if key in self.skip:
            return tensor
        entry = self._count.setdefault(key, [0, tensor.untyped_storage().nbytes()])
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
