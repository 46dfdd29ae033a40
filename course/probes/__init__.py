"""What the grader and `course bench` observe inside a lesson's processes.

course/probes/_site/sitecustomize.py runs `install()` at the start of every Python
process that has course/probes/_site on its PYTHONPATH (course.launch puts it there
for everything it launches). Each probe is armed by its environment variable
and costs nothing otherwise; those that hook into torch wait until the process
imports it (`after_torch_import`):

    COURSE_STEP_LOG     step timestamps for `course bench` (course/probes/step_clock.py)
    COURSE_WRITE_LOG    which rank wrote which file (course/probes/write_log.py)
    COURSE_REPLICA_LOG  a fingerprint of each rank's weights after every step
                        (course/probes/weight_log.py)
    COURSE_BATCH_LOG    the sample indices of every batch each rank loads
                        (course/probes/batch_log.py)
    COURSE_DDP_LOG      DDP's all-reduces per optimizer step, counted by a
                        communication hook, and its options (course/probes/ddp_log.py)
    COURSE_COMM_LOG     every collective and point-to-point op of each rank, seen by the
                        grading kit's recorder (course/probes/comm_log.py)
    COURSE_OPTIMIZER_LOG  the classes of the optimizers that step (course/probes/optimizer_log.py)
    COURSE_RANK_LOG_DIR each rank's output in a file of its own (course/probes/rank_output.py)
    COURSE_CONNECT_LOG  every TCP connect attempt, timed (course/probes/connect_log.py)
    COURSE_READY_LOG    when the process finished importing torch (and torch._dynamo):
                        a time.time() written to the file (course.launch.run's `ready`: a
                        deadline that does not count a slow start)
    COURSE_KILL_*       faults injected on purpose (course/probes/chaos.py), and
    COURSE_SWAP_ALL_REDUCE  a rank's first all_reduce swapped for a broadcast (the same)
    COURSE_LATE_ALL_REDUCE  a rank's first all_reduce started late (the same)
    COURSE_SLOW_STORE_READ  a rank's TCPStore reads slowed (the same)

The lessons never call any of this: a student's own way of writing the same
behaviour is observed the same way.
"""

from __future__ import annotations

import os

ENVIRONMENT = (
    "COURSE_STEP_LOG",
    "COURSE_WRITE_LOG",
    "COURSE_REPLICA_LOG",
    "COURSE_BATCH_LOG",
    "COURSE_DDP_LOG",
    "COURSE_COMM_LOG",
    "COURSE_OPTIMIZER_LOG",
    "COURSE_RANK_LOG_DIR",
    "COURSE_CONNECT_LOG",
    "COURSE_READY_LOG",
    "COURSE_KILL_AT_STEP",
    "COURSE_KILL_IN_SAVE",
    "COURSE_SWAP_ALL_REDUCE",
    "COURSE_LATE_ALL_REDUCE",
    "COURSE_SLOW_STORE_READ",
)


def install() -> None:
    if not any(os.environ.get(name) for name in ENVIRONMENT):
        return  # the common case: a plain run, nothing to watch
    if os.environ.get("COURSE_WRITE_LOG"):
        from course.probes import write_log

        write_log.install(os.environ["COURSE_WRITE_LOG"])
    if os.environ.get("COURSE_RANK_LOG_DIR"):
        from course.probes import rank_output

        rank_output.install()
    if os.environ.get("COURSE_CONNECT_LOG"):
        from course.probes import connect_log

        connect_log.install()
    # The others hook into torch: armed once the process imports it, never before. Every
    # lesson process imports torch first thing; the processes that never do (the
    # resource tracker beside each mp.spawn, helpers) would import it only for the
    # probes, 2 s of CPU each.
    after_torch_import(_install_torch_probes)


def _install_torch_probes() -> None:
    if os.environ.get("COURSE_STEP_LOG"):
        from course.probes import step_clock

        step_clock.install()
    if os.environ.get("COURSE_BATCH_LOG"):
        from course.probes import batch_log

        batch_log.install()
    if os.environ.get("COURSE_DDP_LOG"):
        from course.probes import ddp_log

        ddp_log.install()
    if os.environ.get("COURSE_COMM_LOG"):
        from course.probes import comm_log

        comm_log.install()
    if os.environ.get("COURSE_OPTIMIZER_LOG"):
        from course.probes import optimizer_log

        optimizer_log.install()
    if os.environ.get("COURSE_REPLICA_LOG"):
        from course.probes import weight_log

        weight_log.install()
    from course.probes import chaos

    chaos.install()
    if os.environ.get("COURSE_READY_LOG"):  # last: the other probes are armed by now
        import time

        _startup_imports()
        with open(os.environ["COURSE_READY_LOG"], "w") as f:
            f.write(repr(time.time()))


def _startup_imports() -> None:
    """What a distributed lesson imports right after torch, before it does anything:
    torch.distributed, and torch._dynamo (course.ranks imports it on purpose, the first
    optimizer or DDP anyway). That is about 2.3 s of CPU more (PyTorch 2.14.1), which seven
    processes starting at once on two cores stretched past 10 s: a CI run killed lesson
    09's rendezvous launches 15 s after `import torch`, each having printed the right
    error in time. COURSE_READY_LOG's moment comes after them, so that `after_import`
    bounds what the submission does, not how slowly the machine starts it."""
    import importlib
    import importlib.util

    for name in ("torch.distributed", "torch._dynamo"):
        if importlib.util.find_spec(name) is not None:  # a stand-in torch in the tests has none
            importlib.import_module(name)


def after_torch_import(callback) -> None:
    """Run `callback` now if torch is imported, else right after `import torch` finishes
    (before the importer's next statement)."""
    import sys

    if "torch" in sys.modules:
        callback()
        return
    import importlib.abc
    import importlib.util

    class _TorchImported(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != "torch":
                return None
            sys.meta_path.remove(self)  # once; the real finders locate torch
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                callback()

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _TorchImported())
