"""Support package for the multi-GPU training course.

It holds what every lesson shares and the grader, so that a lesson file can
stay about its one idea. One module per concern; no module imports a lesson.
Where to add a helper:

  used by the lessons      options     the command line every lesson shares
                           data        data sets, loaders, the resumable sampler
                           models      the models (--model, --norm)
                           metrics     printed epoch lines and the metrics JSON
                           checkpoint  atomic save/load, random-generator state
                           ranks       process-group helpers: ports, timeouts,
                                       CPU shares, means over ranks, launch checks
                           train_utils seeding, device choice, one-line errors
  the grader               grading     the pytest plugin: points, table, JSON
                           calls       calling a lesson's functions in a child
                           judge       evaluating saved weights
  probes (inside every     probes      installs the ones the environment arms:
  launched process)                    write_log, batches, ddp_log, replicas, rank_logs,
                                       chaos, step_clock
  tools                    cli, hints, record, bench, bandwidth, sizes, release,
                           lessons (the registry), procs (processes, deadlines)
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

__all__ = ["REPO_ROOT"]
