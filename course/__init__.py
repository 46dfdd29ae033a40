"""Support package for the multi-GPU training course.

It holds what every lesson shares, the grader, the probes and the tools, so
that a lesson file can stay about its one idea. The folders are the concerns;
where a new helper goes:

  course/            what the lessons import, and the modules every other folder
                     stands on. Imports nothing from grader/, probes/ or tools/.
    options          the command line every lesson shares
    data             data sets, loaders, the resumable sampler
    models           the models (--model, --norm)
    metrics          printed epoch lines and the metrics JSON
    checkpoint       checkpoints and the random-generator state a resumed run needs
    atomic           the one atomic file writer (checkpoints, metrics, results, records)
    ranks            process groups: ports, timeouts, CPU shares, means over ranks
    runtime          seeding, device choice, one-line errors
    lessons          the registry: each lesson's number, folder, script, launcher, and
                     the command that starts it
    procs            processes with deadlines: launch, kill the group, collect rank logs
    warmstart        a launch's Python processes forked from a zygote that imported torch

  course/grader/     everything that grades a submission (python -m course grade)
    plugin           the pytest plugin: its hooks, wiring the parts below into pytest
    gradebook        the grade book: points, the table per lesson, the Gradescope JSON
    rules            the grading rules read from the tests (points, markers, titles),
                     for the plugin, the site's grading tables and the mutation tests
    imports          the import check: each lesson file imported in a child before its
                     first test; a file that hangs or fails there fails its tests at once
    launches         the launches a lesson's tests share (needed, shared), and -n
                     scheduling by test file
    cases            a lesson's functions called in a child by its case script
                     (tests/lessons/cases/): the protocol and the child's side; case_ranks: the
                     ranks a case starts; case_runs: the grader's side, what came back
    submission       loading a submission's lesson file, each failure in one line
    judge            numbers the grader computes itself: accuracy of saved weights,
                     the reference weights a run must end with
    warm             a warm grading server: one fork per grading
    tolerances       bounds declared by the tests, measured by `course tolerances`
    the grading kit, how a by-hand exercise is done (docs/contributing.md):
    comm             every collective and message a rank issues, below the Python API
    meter            the most bytes a rank's allocator held during a call
    tripwires        library shortcuts (ZeroRedundancyOptimizer, fully_shard, ...) noted
    draws            rank counts, stages, orders drawn from the printed grading seed

  course/probes/     inside every launched process, armed by COURSE_* variables;
                     they import nothing heavy at start-up (_site/sitecustomize.py
                     installs them: course.launch puts _site on PYTHONPATH)
    write_log, batch_log, weight_log, ddp_log, connect_log: what a rank did
    comm_log         every collective and message of each rank (grader's recorder)
    rank_output      each rank's stdout and stderr in a file of its own
    chaos            faults on purpose: kill a rank at a step, or mid-write
    step_clock       when each optimizer step ended, and how long the next batch took
                     to arrive (for the benchmarks and `course clock`)
    lines            how they append to their logs: one O_APPEND write a line

  course/tools/      the command-line tools, by who runs them
    cli              python -m course: VERBS, each verb once (name, who, module, help)
    verbs            what a verb is; the parser and --help built from the table
    student/         hints, clock, spy, bandwidth, timeline, sharding_memory
                     (course memory), find_unused, bench/
    instructor/      grade_class, autograder, classroom, grading_cost
    author/          release, sizes, record (runs recording_catalogue), figures,
                     measure_tolerances (course tolerances) and tolerance_store (its
                     record), mutants, durations, schedules, zero_stages

The rules are tested (tests/course/test_layout.py): lessons import only the
top level; the top level imports nothing below it; probes import nothing heavy
when they load; no import cycles.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# The course's version (pyproject.toml reads it from here): `python -m course --version`,
# every results file and every record made from now on carry it. CHANGELOG.md says what
# each version changed.
__version__ = "0.2.0"

__all__ = ["REPO_ROOT", "__version__"]
