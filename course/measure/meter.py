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
The reading is course.memory.Allocated's, which lesson 12 prints too; the grader always
reads the profiler's events, on CUDA as well, and counts a block from before freed inside.
"""

from __future__ import annotations

from course.memory import Allocated


class Meter(Allocated):
    def __init__(self, device: str = "cpu"):
        super().__init__(device, profile=True)

    @staticmethod
    def count(sizes: list[int]) -> tuple[int, int]:
        """Every allocation and free, a block from before freed inside too: what the
        lesson 10 bounds were measured with."""
        held = peak = 0
        for size in sizes:
            held += size
            peak = max(peak, held)
        return peak, held
