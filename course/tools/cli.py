"""The course's command line: python -m course VERB ..., its verbs by who runs them.

For students, beside the lessons:
python -m course list                      # lessons, titles, levels
python -m course run 00                    # run a lesson (your version in lessons/)
python -m course run 03 --nproc 2 --backend gloo -- --max-steps 20
python -m course run 04 --nproc 2 --max-restarts 1 -- --snapshot runs/04/snap.pt
python -m course run 09 -- hang --diagnose # lesson 09: name the exercise first
python -m course grade 00 01               # grade your lessons, print the table
python -m course grade --impl path/to/submission --grade-json results.json
python -m course hint 03 [2]               # hint 2 of your next unsolved TODO in lesson 03
python -m course hint 10 fsdp [2]          # ... in one script of a lesson with several
python -m course doctor                    # the reference environment report
python -m course bench [--amp bf16 --channels-last]   # time lessons 01-04, 06 side by side
python -m course clock SCRIPT [ARGS]       # a script's steps and its data-wait fraction
python -m course spy SCRIPT [ARGS]         # the stack of every rank of a stuck job (py-spy)
python -m course timeline --out t.json     # backward and DDP's all-reduces on one time axis
python -m course memory [--nproc 2]        # lesson 10's sharding ways: bytes predicted, counted
python -m course find-unused               # lesson 09: what find_unused_parameters=True costs
python -m course bandwidth [--nproc 2]     # all_reduce bandwidth by message size (lesson 05)
python -m course plan --model llama-8b --gpus 256 --gpu h100-80gb   # lesson 15: plan a run
For instructors, grading a class:
python -m course grading-cost [--out F]    # seconds and CPU seconds of grading each lesson
python -m course grade-class submissions/ --out grades.csv   # a folder of students' folders
python -m course autograder --out a.zip    # a Gradescope autograder zip
python -m course classroom                 # a GitHub Classroom workflow
For the course's authors:
python -m course release [--check]         # regenerate lessons/ from solutions/
python -m course record [NAME ...]         # re-record the outputs the pages show
python -m course figures [--run]           # every figure the site shows, made again
python -m course tolerances [NN ...]       # measure the tests' bounds over many seeds
python -m course durations runs/suite.xml  # the suite's seconds by file and kind (--junitxml)
python -m course schedules --out s.json    # lesson 11's schedules, measured, and the bubble
python -m course compositions --out c.json # lesson 14's meshes: curves, collectives by axis
python -m course sizes                     # code lines of each solution, lines changed
python -m course mutate 12 --jobs 8        # the mutation engine on a lesson's grading

Each verb is one entry of VERBS below: its name, who runs it, the module that does its work
(in course/tools/{student,instructor,author}/, by who runs it) and its line of --help; the
parser, the dispatch and --help are built from it (course/tools/verbs.py).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Callable

import course
from course import REPO_ROOT, launch, registry
from course.launch.warm import pool  # noqa: F401 - the tools' launches start warm
from course.tools.author import release
from course.tools.verbs import AUTHOR, INSTRUCTOR, STUDENT, Verb, arg, parser


def _run(args) -> int:
    lesson = registry.get(args.lesson)
    impl = args.impl
    command = registry.command(
        lesson, impl, args.nproc, args.backend, args.extra, args.max_restarts
    )
    if args.backend == "nccl":  # one line here, not the lesson's error inside torchrun's report
        from course import ranks

        ranks.backend_and_world_size("nccl", args.nproc)
    print("$", " ".join(command), flush=True)
    if args.backend != "nccl":
        from course.tools.author.record import say_capability

        say_capability()
    # The student's own thread settings: each lesson shares the CPU itself.
    return subprocess.call(command, env=launch.child_env(one_thread=False))


def _grade(args) -> int:
    from course.grader.grading import of_lessons

    grading = of_lessons(args.lessons, args.impl, args.grade_json, args.workers,
                         keyword=args.keyword)  # fmt: skip
    # One pytest, its launches forked from it (course/grader/warm.py), or xdist's workers.
    return subprocess.call(grading.warm_command(), cwd=REPO_ROOT, env=launch.child_env())


def _list(_args) -> int:
    wide = max(len(lesson.title) for lesson in registry.LESSONS) + 2  # the longest title fits
    print(f"{'lesson':<8}{'title':<{wide}}{'level':<14}{'launch':<10}folder")
    for lesson in registry.LESSONS:
        print(
            f"{lesson.number:<8}{lesson.title:<{wide}}{lesson.level:<14}{lesson.launcher:<10}"
            f"{lesson.slug}"
        )
    return 0


def _hint(args) -> int:
    from course.tools.student import hints

    script, number = hints.parse_which(args.which)
    impl = args.impl
    print(hints.hint(registry.get(args.lesson), number, impl, script))
    return 0


def _doctor(_args) -> int:
    script = registry.get("00").path(REPO_ROOT / "solutions")
    if not script.is_file():
        raise FileNotFoundError(
            "the reference solutions are not installed here (a graded class ships without "
            "them); run your own `python lessons/00_environment/env_check.py` instead"
        )
    return subprocess.call([sys.executable, str(script)], env=launch.child_env())


def _release(args) -> int:
    if args.check:
        stale = release.stale()
        for path in stale:
            print(f"lessons/{path} is out of date with solutions/{path}")
        if stale:
            print("run `python -m course release` to regenerate them")
        return 1 if stale else 0
    for path in release.release():
        print(f"wrote lessons/{path}")
    return 0


def _sizes(args) -> int:
    from course.tools.author import sizes

    return sizes.main(["--impl", str(args.impl)])


def _bad_input() -> tuple[type[Exception], ...]:
    """The errors that become a one-line message; the others are bugs, and keep their
    traceback. Looked up per command: a reloaded registry has a new UnknownLesson."""
    return (registry.UnknownLesson, FileNotFoundError, ValueError, release.ReleaseError)


LESSON = arg("lesson", help="lesson number, e.g. 03")
IMPL = arg(
    "--impl",
    default="lessons",
    type=registry.impl_argument,
    help="lessons (default), solutions or a folder",
)

# Every verb of python -m course, once: --help lists them in this order, by audience.
VERBS = (
    Verb("list", STUDENT, "cli", "list the lessons", run=_list),
    Verb("run", STUDENT, "cli", "run a lesson's script the way its page shows", run=_run,
         arguments=(
             LESSON, IMPL,
             arg("--nproc", type=int, help="processes (ranks) for a distributed lesson"),
             arg("--backend", choices=("gloo", "nccl"), help="for a distributed lesson"),
             arg("--max-restarts", type=int,
                 help="torchrun lessons: restarts of a failed group (default 0)"),
         ),
         epilog="Arguments after `--` are passed to the lesson's script. A lesson of several "
         "exercises (09) takes the exercise first: python -m course run 09 -- hang --diagnose"),
    Verb("grade", STUDENT, "cli", "grade lessons and print the points table", run=_grade,
         arguments=(
             arg("lessons", nargs="*", help="lesson numbers (default: all)"), IMPL,
             arg("--grade-json", metavar="PATH", help="write Gradescope-style results here"),
             arg("-n", "--workers", type=int, default=0, help="parallel pytest workers"),
             arg("-k", dest="keyword", metavar="EXPRESSION",
                 help="only the tests whose names match (pytest's -k), e.g. one exercise: -k hang"),
         )),
    Verb("hint", STUDENT, "student.hints", "a hint for the next unsolved TODO of a lesson",
         run=_hint, arguments=(
             LESSON,
             arg("which", nargs="*", metavar="[SCRIPT] [N]",
                 help="one script of the lesson (e.g. fsdp), then which hint (default 1)"),
             arg("--impl", default="lessons", type=registry.impl_argument,
                 help="lessons (default) or a folder"),
         )),
    Verb("doctor", STUDENT, "cli", "print the environment report (lesson 00's reference)",
         run=_doctor),
    Verb("bench", STUDENT, "student.bench", "time the lessons' own training side by side"),
    Verb("clock", STUDENT, "student.clock", "a script's steps and data-wait fraction",
         errors=FileNotFoundError),
    Verb("spy", STUDENT, "student.spy", "where each rank of a stuck job waits (py-spy)",
         errors=FileNotFoundError),
    Verb("bandwidth", STUDENT, "student.bandwidth", "all_reduce bandwidth by message size",
         errors=ValueError),
    Verb("timeline", STUDENT, "student.timeline", "one DDP step's backward and all-reduces",
         errors=ValueError),
    Verb("memory", STUDENT, "student.sharding_memory",
         "lesson 10: bytes per rank, predicted and counted",
         errors=(FileNotFoundError, ValueError)),
    Verb("plan", STUDENT, "student.planning",
         "lesson 15: step times predicted, measured; meshes planned",
         errors=(FileNotFoundError, ValueError)),
    Verb("find-unused", STUDENT, "student.find_unused",
         "lesson 09: what find_unused_parameters=True costs", errors=()),
    Verb("grade-class", INSTRUCTOR, "instructor.grade_class",
         "grade a folder of students' folders into a CSV", errors=()),
    Verb("autograder", INSTRUCTOR, "instructor.autograder", "write a Gradescope autograder zip",
         errors=()),
    Verb("classroom", INSTRUCTOR, "instructor.classroom", "write a GitHub Classroom workflow",
         errors=()),
    Verb("grading-cost", INSTRUCTOR, "instructor.grading_cost",
         "seconds and CPU seconds of grading each lesson"),
    Verb("release", AUTHOR, "author.release", "regenerate the starters in lessons/ from solutions/",
         run=_release, arguments=(
             arg("--check", action="store_true", help="only report stale starters"),
         )),
    Verb("sizes", AUTHOR, "author.sizes",
         "code lines of each solution and lines changed per lesson", run=_sizes, arguments=(
             arg("--impl", default="solutions", type=registry.impl_argument,
                 help="solutions (default) or a folder"),
         )),
    Verb("record", AUTHOR, "author.record", "record the reference outputs the site shows",
         errors=(ValueError, RuntimeError)),
    Verb("figures", AUTHOR, "author.figures",
         "every figure the site shows, and the command that makes it",
         errors=ValueError),  # figures.UnknownFigure is one
    Verb("tolerances", AUTHOR, "author.measure_tolerances",
         "measure the lesson tests' bounds over many seeds", errors=ValueError),
    Verb("durations", AUTHOR, "author.durations",
         "the test suite's seconds by file and kind, from a JUnit file", errors=()),
    Verb("schedules", AUTHOR, "author.schedules",
         "lesson 11: GPipe and 1F1B measured, and the bubble", errors=(ValueError, RuntimeError)),
    Verb("compositions", AUTHOR, "author.compositions",
         "lesson 14: four meshes' curves, a resume, collectives by axis",
         errors=(ValueError, RuntimeError)),
    Verb("mutate", AUTHOR, "author.mutate",
         "the mutation engine on a lesson, each mutant at K seeds",
         errors=(ValueError, RuntimeError, LookupError)),
)  # fmt: skip
BY_NAME = {verb.name: verb for verb in VERBS}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verb = BY_NAME.get(argv[0]) if argv else None
    if verb and verb.run is None:  # a tool with its own parser: it gets the rest
        tool = importlib.import_module(f"course.tools.{verb.module}")
        return _one_line_errors(verb, tool.main, argv[1:])
    # Everything after `--` belongs to the lesson script, not to us.
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    args = parser(VERBS, __doc__.splitlines()[0], f"course {course.__version__}").parse_args(argv)
    args.extra = extra
    verb = BY_NAME[args.command]
    return _one_line_errors(verb, verb.run, args)


def _one_line_errors(verb: Verb, work: Callable, argument) -> int:
    """work(argument), its expected errors (verb.errors, else _bad_input()) in one line."""
    caught = _bad_input() if verb.errors is None else verb.errors
    try:
        return work(argument)
    except caught as err:
        print(f"python -m course {verb.name}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
