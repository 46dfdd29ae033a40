"""Starting, watching and killing processes: what the grader, the tools and the probes'
entry point use to launch anything. Lessons never import it.

    from course import launch
    result = launch.run([sys.executable, "train.py"], timeout=60, cwd=folder)
    result.ok, result.output, result.describe()

One module per job:

    result       RunResult: what a launch ended as; the deadlines' scale; a hang's cause
    deadline     the one deadline-and-kill core (watch, end_group) and Cancel
    command      run(), python(), run_all(): a command in its own session, under a deadline
    fork         forked(): a Python function in a fork of this process, the same way
    torchrun     run_torchrun(): torchrun, launched again after its agent's own race
    environment  the child's environment, user and resource limits
    reaper       kill a process group; adopt and kill orphans that left it
    warm/        the optional speed-up: Python processes forked from a zygote that imported
                 torch once (protocol, client, zygote, pool). It builds on the launcher,
                 never the other way: a process that loads warm.pool gets warm launches

The names below are loaded on first use, so that a process that only hands itself to a
zygote (warm/client.py, from the sitecustomize of every child) imports none of this.
"""

from __future__ import annotations

import importlib

# name -> the module of this package that defines it
_EXPORTS = {
    "RunResult": "result", "timeout_scale": "result", "HANG_CAUSE": "result",
    "PG_TIMEOUT_SHARE": "result",
    "Cancel": "deadline",
    "run": "command", "python": "command", "run_all": "command",
    "forked": "fork", "can_fork": "fork", "child_exit": "fork",
    "run_torchrun": "torchrun", "torchrun_agent_raced": "torchrun",
    "child_env": "environment", "CHILD_USER_ENV": "environment", "RANK_LOG_ENV": "environment",
    "READY_ENV": "environment", "QUIET_ENV": "environment", "SAFE_GPU_ENV": "environment",
    "group_alive": "reaper", "kill_group": "reaper", "become_subreaper": "reaper",
    "descendants": "reaper", "kill_descendants": "reaper",
}  # fmt: skip

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'course.launch' has no attribute {name!r}")
    return getattr(importlib.import_module(f"course.launch.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return __all__
