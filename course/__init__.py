"""Support package for the multi-GPU training course.

It holds what every lesson shares, the grader, the probes and the tools, so
that a lesson file can stay about its one idea. The folders are the concerns;
where a new helper goes (tests/course/test_layout.py checks this map against the files):

  course/            what the lessons import, and the registry; imports nothing below it
    options          the command line every lesson shares
    data             data sets, loaders, the resumable sampler
    models           the models (--model, --norm)
    metrics          printed epoch lines and the metrics JSON
    checkpoint       checkpoints and the random-generator state a resumed run needs
    atomic           the one atomic file writer (checkpoints, metrics, results, records)
    ranks            process groups: ports, timeouts, CPU shares, means over ranks
    runtime          seeding, device choice, one-line errors
    memory           the saved-tensor meter (lesson 09), what the allocator holds (12)
    attention        attention one block at a time, and its backward (lesson 12)
    stages           lesson 11's watched pipeline stage and its bubble
    registry         the lessons, and their facts: tests(), command(), impl_folder()

  course/launch/     starting, watching and killing processes (never imported by lessons)
    result           RunResult, the deadlines' scale, a hang's likely cause
    deadline         the one deadline-and-kill core (watch, end_group) and Cancel
    command          run, python, run_all: a command in its own session, under a deadline
    fork             forked: a function in a fork of this process, the same way
    torchrun         run_torchrun: launched again after torchrun's agent race
    launcher         Launcher: launches bound to one Cancel (the grader's fixture)
    environment      the child's environment, user and resource limits
    reaper           kill a process group; adopt and kill orphans that left it
    warm/            the optional speed-up: Python processes forked from a zygote that
                     imported torch (protocol, client, zygote, child, pool)

  course/grader/     everything that grades a submission (python -m course grade)
    grading          one grading as data (tests, submission, options) and its commands
    plugin           the pytest plugin's hooks: options, setup, timeouts, reports
    fixtures         what the lesson tests use: impl, backend, launcher, run_script
    gradebook        the grade: points, the table, the Gradescope JSON
    imports          the import check: each lesson file imported in a child first
    launches         shared launches (needed, shared) and the -n scheduling by file
    rules            the grading rules read from the tests (points, markers, titles)
    cases            the case scripts' protocol (what a child sends back)
    case_runs        running a case script on a lesson file, reading what it sent
    case_ranks       the ranks a case starts, and their errors
    submission       loading a submission's lesson file, each failure in one line
    judge            numbers the grader computes itself (accuracy, reference weights)
    warm             a warm grading server: one fork per grading
    tolerances       bounds declared by the tests, measured by `course tolerances`

  course/measure/    the measuring kit, how a by-hand exercise is done (docs/contributing.md);
                     the grader, the probes and the tools use it, it uses none of them
    comm             every collective and message a rank issues, below the Python API
    meter            the most bytes a rank's allocator held during a call
    tripwires        library shortcuts (ZeroRedundancyOptimizer, fully_shard, ...) noted
    draws            rank counts, stages, orders drawn from the printed grading seed
    scale            one rank of a fake world of 64-1024, built, stepped and counted

  course/probes/     inside every launched process, armed by COURSE_* variables;
                     they import nothing heavy at start-up (_site/sitecustomize.py, the
                     entry point, installs them: course.launch puts _site on PYTHONPATH)
    write_log, batch_log, weight_log, ddp_log, connect_log: what a rank did
    optimizer_log    which optimizer classes stepped (a flag that picks one, seen working)
    comm_log         every collective and message of each rank (the kit's recorder)
    rank_output      each rank's stdout and stderr in a file of its own
    chaos            faults on purpose: kill a rank at a step, or mid-write, a late or
                     swapped collective, slow store reads
    step_clock       when each optimizer step ended, and how long the next batch took
    lines            how they append to their logs: one O_APPEND write a line

  course/tools/      the command-line tools (python -m course VERB), by who runs them
    cli              python -m course: VERBS, each verb once (name, who, module, help)
    verbs            what a verb is; the parser and --help built from the table
    student/         hints, clock, spy, bandwidth, timeline, sharding_memory
                     (course memory), find_unused, planning (course plan), plan_here
                     (this machine's side) and planner (presets, search), bench/
    instructor/      grade_class, autograder, classroom, grading_cost
    author/          release, sizes, record (runs recording_catalogue, recordings_late;
                     agreement: how its check compares figures), figures,
                     measure_tolerances (course tolerances) and tolerance_store (its
                     record), mutants, mutate (course mutate: cosmic-ray, with the
                     mutation_operators plugin, each mutant graded by mutant_grade),
                     durations, schedules, compositions, zero_stages

The rules are tested (tests/course/test_layout.py): lessons import only the top level;
the top level holds only what they import and the registry, and imports nothing below it;
the folders import down their layering only (top, measure, probes, launch, grader, tools);
launch/ is imported by the grader, the tools and the probes' entry point only; probes
import nothing heavy when they load; no import cycles; no module over 400 lines; no
module writes another's globals or shares mutable state across folders; no module names
another folder's module by string.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# The course's version (pyproject.toml reads it from here): `python -m course --version`,
# every results file and every record made from now on carry it. CHANGELOG.md says what
# each version changed.
__version__ = "0.2.0"

__all__ = ["REPO_ROOT", "__version__"]
