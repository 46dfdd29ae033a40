"""The grading kit's communication recorder: every collective and point-to-point op a rank
issues, seen below the Python API.

`torch.distributed`'s functions, DTensor's redistributions and FSDP2's gathers all end in
an operator of the dispatcher's `c10d` or `_c10d_functional` namespaces (`c10d::allreduce_`,
`c10d::_allgather_base_`, `c10d::send`, `_c10d_functional::all_gather_into_tensor`...).
A TorchDispatchMode sees each of them once, whatever Python call made it: positional or
keyword arguments, `all_gather_into_tensor` or `all_gather_single`, a library's own
wrapper. Autograd carries the mode into its backward threads, so a collective that a
backward hook issues is seen too.

In a rank of a case script:

    recorder = CommRecorder()
    with recorder:
        with recorder.during("forward"):
            out = model(x)
        with recorder.during("backward"):
            out.sum().backward()
    recorder.records   # [{"op": "all_gather", "phase": "forward", "group": [0, 1],
                       #   "bytes": 4096, "dtypes": ["torch.bfloat16"], "peer": None, ...}]

`bytes` and `dtypes` are what this rank sends: the input of a gather, a reduce-scatter or
an all-to-all, the tensors of an all-reduce, a broadcast or a send; for a receive, what it
receives. `received` is the size of the output where the op has one (a gather's whole
buffer). `group` lists the global ranks of the op's group; `peer` is the global rank of a
send's destination, a receive's source, or a broadcast's, reduce's, gather's or scatter's
root. `tick` orders the records and the marks a case
makes with `mark()`; with `CommRecorder(matmuls=True)` the ticks of the matrix products
too (`matmuls`), and `watch_waits()` notes when each isend's or irecv's Work was waited
for (a record's `waited`): what travelled while the rank computed.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd", "c10d_functional")
# Operator names, without the namespace and a trailing underscore, to one name per kind.
KINDS = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allgather": "all_gather", "_allgather_base": "all_gather",
    "allgather_coalesced": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor_out": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all", "all_to_all_single": "all_to_all",
    "barrier": "barrier", "monitored_barrier": "barrier",
    "send": "send", "recv": "recv", "recv_any_source": "recv",
}  # fmt: skip
IGNORED = ("wait_tensor", "_wrap_tensor_autograd")  # not communication of their own
POINT_TO_POINT = ("send", "recv")
ROOTED = ("broadcast", "reduce", "gather", "scatter")  # the int after the group: the root
ASYNC = ("isend", "irecv", "batch_isend_irecv")  # what returns Work a rank waits for later


def _matmul_ops() -> set:
    """The matrix products: what attention and linear layers compute with."""
    names = (
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_attention_math",
    )
    return {op for name in names if (op := getattr(torch.ops.aten, name, None)) is not None}


def _tensors(value) -> list[torch.Tensor]:
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _group(value):
    """The ProcessGroup behind an operator's argument (a boxed ProcessGroup, or a group's
    name for the functional collectives), or None."""
    from torch._C._distributed_c10d import ProcessGroup

    if isinstance(value, ProcessGroup):
        return value
    if isinstance(value, torch.ScriptObject):
        try:
            return ProcessGroup.unbox(value)
        except (RuntimeError, TypeError):
            return None
    if isinstance(value, str):
        from torch.distributed import distributed_c10d

        try:
            return distributed_c10d._resolve_process_group(value)
        except (RuntimeError, KeyError, ValueError):
            return None
    return None


def describe(func, args: tuple, kwargs: dict) -> dict | None:
    """One record (without phase and tick) for a call of operator `func`, or None when it
    is not communication."""
    namespace = getattr(func, "namespace", "")
    if namespace not in NAMESPACES:
        return None
    name = func._schema.name.split("::")[-1].rstrip("_")
    if name in IGNORED:
        return None
    import torch.distributed as dist

    values = [*args, *kwargs.values()]
    where = next((i for i, v in enumerate(values) if _group(v) is not None), None)
    group = _group(values[where]) if where is not None else None
    before = [v for v in values[: where if where is not None else len(values)] if _tensors(v)]
    sent, received = [], []
    if namespace == "c10d":  # (tensors, group, ...) or (outputs, inputs, group, ...)
        sent = _tensors(before[-1]) if before else []
        received = _tensors(before[0]) if len(before) > 1 else []
    else:  # functional: the input is the first tensor argument
        sent = _tensors(before[0]) if before else []
    ranks = dist.get_process_group_ranks(group) if group is not None else []
    peer = None
    kind = KINDS.get(name, name)
    rooted = kind in ROOTED and namespace == "c10d"
    if (kind in POINT_TO_POINT or rooted) and where is not None and name != "recv_any_source":
        local = next((v for v in values[where + 1 :] if type(v) is int), None)
        if local is not None and group is not None:
            peer = dist.get_global_rank(group, local) if ranks else local
    return {
        "op": kind, "operator": f"{namespace}::{name}", "group": ranks,
        "bytes": _nbytes(sent), "received": _nbytes(received),
        "dtypes": sorted({str(t.dtype) for t in sent}),
        "shapes": [list(t.shape) for t in sent], "peer": peer,
    }  # fmt: skip


class CommRecorder(TorchDispatchMode):
    """Records every c10d operator issued while it is active (see the module's doc)."""

    def __init__(self, matmuls: bool = False):
        super().__init__()
        self.records: list[dict] = []
        self.marks: list[tuple[int, str]] = []
        self.matmuls: list[int] | None = [] if matmuls else None  # their ticks, if asked
        self.phase = "other"
        self._clock = 0
        self._lock = threading.Lock()

    def tick(self) -> int:
        with self._lock:
            self._clock += 1
            return self._clock

    def mark(self, what: str) -> int:
        """A moment the case notes between the records (a layer finished, say)."""
        tick = self.tick()
        self.marks.append((tick, what))
        return tick

    @contextlib.contextmanager
    def during(self, phase: str):
        """Label the records made inside with `phase` (forward, backward, step, save...)."""
        before, self.phase = self.phase, phase
        try:
            yield self
        finally:
            self.phase = before

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        record = describe(func, args, kwargs)
        if record is not None:
            record |= {"phase": self.phase, "tick": self.tick()}
            self.records.append(record)
        elif self.matmuls is not None and func.overloadpacket in _matmul_ops():
            self.matmuls.append(self.tick())
        return func(*args, **kwargs)

    def watch_waits(self, names=ASYNC) -> None:
        """Wrap torch.distributed's functions `names` (isend, irecv, batch_isend_irecv):
        each Work they return notes, when first waited for, the tick on the records its
        call made ("waited"). In distributed_c10d too, where P2POp checks its op is isend
        or irecv. Call before the submission is loaded (`from x import y` binds)."""
        import torch.distributed as dist

        for name in names:
            original = getattr(dist.distributed_c10d, name, None)
            if original is not None:
                wrapped = self._watched(original)
                setattr(dist, name, wrapped)
                setattr(dist.distributed_c10d, name, wrapped)

    def _watched(self, original):
        recorder = self

        class Watched:
            def __init__(self, work, made: list[dict]):
                self._work, self._made = work, made

            def wait(self, *args, **kwargs):
                tick = recorder.tick()
                for record in self._made:
                    record.setdefault("waited", tick)
                return self._work.wait(*args, **kwargs)

            def __getattr__(self, name):
                return getattr(self._work, name)

        def watched(*args, **kwargs):
            first = len(recorder.records)
            work = original(*args, **kwargs)
            made = recorder.records[first:]
            if isinstance(work, list):  # batch_isend_irecv: one Work a message
                return [Watched(w, made) for w in work]
            return work if work is None else Watched(work, made)

        return watched

    def of(self, op: str | None = None, phase: str | None = None) -> list[dict]:
        """The records of kind `op` and phase `phase` (None: any)."""
        return [
            r
            for r in self.records
            if (op is None or r["op"] == op) and (phase is None or r["phase"] == phase)
        ]

    def since(self, index: int) -> list[dict]:
        return self.records[index:]
