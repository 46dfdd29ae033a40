"""The grading kit's library tripwires: while a by-hand exercise runs, the library class or
function that would do the exercise for the student is replaced by one that notes its use
and then does what the original does.

A shortcut then still runs (no crash to misread), and the grade says plainly which
library piece did the work:

    wires = Tripwires("ZeroRedundancyOptimizer", "fully_shard")
    wires.install()            # before the submission is imported: `from x import y` binds
    lesson = submission.load(path)
    ...
    wires.used                 # ["ZeroRedundancyOptimizer"]: used while the exercise ran

A class is replaced by a subclass of itself (isinstance and subclassing keep working), an
autograd Function by one whose `apply` notes its use, a function by a wrapper. Only the
modules of the names asked for are imported.

A shortcut often fails later for a reason of its own (a library optimizer whose state_dict
wants a call first). `Tripwires(..., log=folder / f"rank{rank}.tripwires")` also appends
each name to a file as it is first used, and `naming_shortcuts(folder, exercise)` around
the spawn turns any failure of ranks that used the library into the one line that says so.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from pathlib import Path

# name -> the modules that export it (the public one first).
LIBRARY = {
    "ZeroRedundancyOptimizer": ("torch.distributed.optim",
                                "torch.distributed.optim.zero_redundancy_optimizer"),
    "fully_shard": ("torch.distributed.fsdp", "torch.distributed._composable.fsdp",
                    "torch.distributed.fsdp._fully_shard._fully_shard",
                    "torch.distributed._composable.fsdp.fully_shard"),
    "FullyShardedDataParallel": ("torch.distributed.fsdp",
                                 "torch.distributed.fsdp.fully_sharded_data_parallel"),
    "DistributedDataParallel": ("torch.nn.parallel", "torch.nn.parallel.distributed"),
    "PipelineStage": ("torch.distributed.pipelining", "torch.distributed.pipelining.stage"),
    "ScheduleGPipe": ("torch.distributed.pipelining", "torch.distributed.pipelining.schedules"),
    "Schedule1F1B": ("torch.distributed.pipelining", "torch.distributed.pipelining.schedules"),
    "ScheduleInterleaved1F1B": ("torch.distributed.pipelining",
                                "torch.distributed.pipelining.schedules"),
    "pipeline": ("torch.distributed.pipelining",),
    "parallelize_module": ("torch.distributed.tensor.parallel",
                           "torch.distributed.tensor.parallel.api"),
    "checkpoint": ("torch.utils.checkpoint",),
    "checkpoint_sequential": ("torch.utils.checkpoint",),
    "CheckpointFunction": ("torch.utils.checkpoint",),  # the reentrant checkpoint's Function
    # Differentiable all-to-alls (MODULE:NAME where torch.distributed has a plain one too)
    "torch.distributed.nn.functional:all_to_all_single": ("torch.distributed.nn.functional",),
    "torch.distributed.nn.functional:all_to_all": ("torch.distributed.nn.functional",),
    "all_to_all_single_autograd": ("torch.distributed._functional_collectives",),
}  # fmt: skip
DIFFERENTIABLE_ALL_TO_ALL = ("torch.distributed.nn.functional:all_to_all_single",
                             "torch.distributed.nn.functional:all_to_all",
                             "all_to_all_single_autograd")  # fmt: skip
PIPELINING = ("PipelineStage", "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B",
              "pipeline")  # fmt: skip


def _autograd_function() -> type:
    import torch

    return torch.autograd.Function


class Tripwires:
    def __init__(self, *names: str, log: Path | str | None = None):
        unknown = sorted(set(names) - set(LIBRARY))
        if unknown:
            raise ValueError(f"no tripwire for {unknown}; known: {sorted(LIBRARY)}")
        self.names, self.log = names, log
        self.used: list[str] = []
        self._restore: list[tuple[object, str, object]] = []

    def _note(self, name: str) -> None:
        if name not in self.used:
            self.used.append(name)
            if self.log is not None:  # one O_APPEND write: whatever the rank does next
                fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                try:
                    os.write(fd, f"{name}\n".encode())
                finally:
                    os.close(fd)

    def _wired(self, name: str, original):
        if isinstance(original, type) and issubclass(original, _autograd_function()):
            wires = self

            def apply(cls, *args, **kwargs):  # a Function is used through its apply
                wires._note(name)
                return original.apply(*args, **kwargs)

            return type(original.__name__, (original,), {
                "apply": classmethod(apply), "__module__": original.__module__,
                "__qualname__": original.__qualname__, "__doc__": original.__doc__,
            })  # fmt: skip
        if isinstance(original, type):
            wires = self

            def __init__(self, *args, **kwargs):
                wires._note(name)
                original.__init__(self, *args, **kwargs)

            return type(original.__name__, (original,), {
                "__init__": __init__, "__module__": original.__module__,
                "__qualname__": original.__qualname__, "__doc__": original.__doc__,
            })  # fmt: skip

        @functools.wraps(original)
        def wired(*args, **kwargs):
            self._note(name)
            return original(*args, **kwargs)

        return wired

    def install(self) -> Tripwires:
        for name in self.names:
            replaced = {}
            for module_name in LIBRARY[name]:
                try:
                    module = importlib.import_module(module_name)
                except ImportError:
                    continue  # not in this PyTorch
                attribute = name.rsplit(":", 1)[-1]  # MODULE:NAME names one module's
                original = getattr(module, attribute, None)
                if original is None:
                    continue
                if id(original) not in replaced:
                    replaced[id(original)] = self._wired(name, original)
                self._restore.append((module, attribute, original))
                setattr(module, attribute, replaced[id(original)])
        return self

    def remove(self) -> None:
        for module, name, original in reversed(self._restore):
            setattr(module, name, original)
        self._restore.clear()

    def __enter__(self) -> Tripwires:
        return self.install()

    def __exit__(self, *exc) -> None:
        self.remove()


def refused(used: list[str], exercise: str) -> str:
    """The grade's line for a shortcut: which library piece did the exercise."""
    named = ", ".join(name.replace(":", ".") for name in used)
    return (
        f"{exercise} used {named} from PyTorch's library: the exercise asks for it "
        "by hand, so this part earns no points (the library's own version is graded in its "
        "own exercise)"
    )


def used_in(folder: Path | str) -> list[str]:
    """The library pieces any rank noted in `folder`'s *.tripwires logs."""
    names = [n for path in sorted(Path(folder).glob("*.tripwires"))
             for n in path.read_text().split()]  # fmt: skip
    return list(dict.fromkeys(names))


@contextlib.contextmanager
def naming_shortcuts(folder: Path | str, exercise: str):
    """Around a spawn of ranks with logged tripwires: if it fails and a rank used the
    library, raise the line that says so instead of the library's own failure."""
    try:
        yield
    except Exception:
        used = used_in(folder)
        if used:
            raise RuntimeError(refused(used, exercise)) from None
        raise
