"""torchrun launches, and the one race of torchrun's agent that we launch again for."""

from __future__ import annotations

from collections.abc import Callable

from course.launch.command import run
from course.launch.result import RunResult

# torchrun's agent reads the error file of every worker that failed (the JSON
# that @record writes when a worker dies of an exception). When a rank dies,
# its peers fail too ("Connection reset by peer") and start writing theirs,
# while the agent SIGTERMs them. A worker stopped between opening its error
# file and writing it leaves it empty, and the agent itself then dies of a
# JSONDecodeError (ProcessFailure.__post_init__ in
# torch/distributed/elastic/multiprocessing/errors/__init__.py) instead of
# restarting the group or reporting the failure. A race inside PyTorch, rare
# (about one kill in a hundred here), that no training script can prevent.
TORCHRUN_AGENT_RACE = ("JSONDecodeError", "elastic/multiprocessing/errors")


def torchrun_agent_raced(result: RunResult) -> bool:
    """True when torchrun's own agent died of the error-file race above."""
    return not result.timed_out and all(sign in result.output for sign in TORCHRUN_AGENT_RACE)


def run_torchrun(*, fresh: Callable[[], None] | None = None, **kwargs) -> RunResult:
    """`run` a torchrun launch; if torchrun's agent died of its error-file race,
    call `fresh()` (put the run's folder back as it was) and launch once more.
    The result's output then starts with a line that says so."""
    result = run(**kwargs)
    if not torchrun_agent_raced(result):
        return result
    if fresh is not None:
        fresh()
    again = run(**kwargs)
    again.output = (
        "course: torchrun's agent died reading an empty error file (a PyTorch race, "
        "not the lesson's fault); launched once more\n" + again.output
    )
    return again
