"""The course's command line: python -m course {list,run,grade,doctor,release}.

python -m course list                      # lessons, titles, levels
python -m course run 00                    # run a lesson (your version in lessons/)
python -m course run 03 --nproc 2 --backend gloo -- --max-steps 20
python -m course run 04 --nproc 2 --max-restarts 1 -- --snapshot runs/04/snap.pt
python -m course grade 00 01               # grade your lessons, print the table
python -m course grade --impl path/to/submission --grade-json results.json
python -m course bench [--amp bf16 --channels-last]   # time lessons 01-04, 06 side by side
python -m course run 09 -- hang --diagnose # lesson 09: name the exercise first
python -m course hint 03 [2]               # hint 2 of your next unsolved TODO in lesson 03
python -m course hint 10 fsdp [2]          # ... in one script of a lesson with several
python -m course doctor                    # the reference environment report
python -m course release [--check]         # regenerate lessons/ from solutions/
python -m course record [NAME ...]         # re-record the outputs the pages show
python -m course grading-cost [--out F]    # seconds and CPU seconds of grading each lesson
python -m course figures [--run]          # every figure the site shows, made again
python -m course tolerances [NN ...]       # measure the tests' bounds over many seeds
python -m course durations runs/suite.xml  # the suite's seconds by file and kind (--junitxml)
python -m course timeline --out t.json     # backward and DDP's all-reduces on one time axis
python -m course schedules --out s.json    # lesson 11's schedules, measured, and the bubble
python -m course clock SCRIPT [ARGS]       # a script's steps and its data-wait fraction
python -m course spy SCRIPT [ARGS]         # the stack of every rank of a stuck job (py-spy)
python -m course memory [--nproc 2]        # lesson 10's sharding ways: bytes predicted, counted
python -m course find-unused               # lesson 09: what find_unused_parameters=True costs

Over 300 lines, on purpose: every verb's parser is here, so that `--help` lists them all
and each verb is found in one place; the work of each lives in its own module.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import course
from course import REPO_ROOT, lessons, procs
from course.tools import release


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line, not a usage dump: the student should see what to fix.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m course", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"course {course.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sub.add_parser("list", help="list the lessons")

    run = sub.add_parser("run", help="run a lesson's script the way its page shows")
    run.add_argument("lesson", help="lesson number, e.g. 03")
    run.add_argument("--impl", default="lessons", help="lessons (default), solutions or a folder")
    run.add_argument("--nproc", type=int, help="processes (ranks) for a distributed lesson")
    run.add_argument("--backend", choices=("gloo", "nccl"), help="for a distributed lesson")
    run.add_argument(
        "--max-restarts", type=int, help="torchrun lessons: restarts of a failed group (default 0)"
    )
    run.epilog = (
        "Arguments after `--` are passed to the lesson's script. A lesson of several "
        "exercises (09) takes the exercise first: python -m course run 09 -- hang --diagnose"
    )

    grade = sub.add_parser("grade", help="grade lessons and print the points table")
    grade.add_argument("lessons", nargs="*", help="lesson numbers (default: all)")
    grade.add_argument("--impl", default="lessons", help="lessons (default), solutions or a folder")
    grade.add_argument("--grade-json", metavar="PATH", help="write Gradescope-style results here")
    grade.add_argument("-n", "--workers", type=int, default=0, help="parallel pytest workers")
    grade.add_argument(
        "-k", dest="keyword", metavar="EXPRESSION",
        help="only the tests whose names match (pytest's -k), e.g. one exercise: -k hang",
    )  # fmt: skip

    # Parsed by course.tools.grade_class itself; listed here for --help.
    sub.add_parser("grade-class", help="grade a folder of students' folders into a CSV",
                   add_help=False)  # fmt: skip
    sub.add_parser("autograder", help="write a Gradescope autograder zip", add_help=False)
    sub.add_parser("classroom", help="write a GitHub Classroom workflow", add_help=False)
    hint = sub.add_parser("hint", help="a hint for the next unsolved TODO of a lesson")
    hint.add_argument("lesson", help="lesson number, e.g. 03")
    hint.add_argument(
        "which",
        nargs="*",
        metavar="[SCRIPT] [N]",
        help="one script of the lesson (e.g. fsdp), then which hint (default 1)",
    )
    hint.add_argument("--impl", default="lessons", help="lessons (default) or a folder")

    sub.add_parser("doctor", help="print the environment report (lesson 00's reference)")
    # Parsed by course.tools.bench itself (python -m course bench --help); listed here for --help.
    sub.add_parser("bench", help="time the lessons' own training side by side", add_help=False)
    sub.add_parser("record", help="record the reference outputs the site shows", add_help=False)
    sub.add_parser("bandwidth", help="all_reduce bandwidth by message size", add_help=False)
    sub.add_parser("timeline", help="one DDP step's backward and all-reduces", add_help=False)
    sub.add_parser("schedules", help="lesson 11: GPipe and 1F1B measured, and the bubble",
                   add_help=False)  # fmt: skip
    sub.add_parser("clock", help="a script's steps and data-wait fraction", add_help=False)
    sub.add_parser("spy", help="where each rank of a stuck job waits (py-spy)", add_help=False)
    sub.add_parser("memory", help="lesson 10: bytes per rank, predicted and counted",
                   add_help=False)  # fmt: skip
    sub.add_parser("find-unused", help="lesson 09: what find_unused_parameters=True costs",
                   add_help=False)  # fmt: skip
    sub.add_parser(
        "durations", help="the test suite's seconds by file and kind, from a JUnit file",
        add_help=False,
    )  # fmt: skip
    sub.add_parser("grading-cost", help="seconds and CPU seconds of grading each lesson",
                   add_help=False)  # fmt: skip
    sub.add_parser("tolerances", help="measure the lesson tests' bounds over many seeds",
                   add_help=False)  # fmt: skip
    sub.add_parser("figures", help="every figure the site shows, and the command that makes it",
                   add_help=False)  # fmt: skip
    sizes = sub.add_parser("sizes", help="code lines of each solution and lines changed per lesson")
    sizes.add_argument("--impl", default="solutions", help="solutions (default) or a folder")

    rel = sub.add_parser("release", help="regenerate the starters in lessons/ from solutions/")
    rel.add_argument("--check", action="store_true", help="only report stale starters")
    return parser


def _run(args) -> int:
    lesson = lessons.get(args.lesson)
    impl = lessons.resolve_impl(args.impl)
    command = lessons.lesson_command(
        lesson, impl, args.nproc, args.backend, args.extra, args.max_restarts
    )
    if args.backend == "nccl":  # one line here, not the lesson's error inside torchrun's report
        from course import ranks

        ranks.backend_and_world_size("nccl", args.nproc)
    print("$", " ".join(command), flush=True)
    if args.backend != "nccl":
        from course.tools.record import say_capability

        say_capability()
    # The student's own thread settings: each lesson shares the CPU itself.
    return subprocess.call(command, env=procs.child_env(one_thread=False))


def grade_command(
    numbers, impl, grade_json=None, workers=0, root=REPO_ROOT, keyword=None
) -> list[str]:
    """The pytest command that grades lessons `numbers` (all when empty) of `impl`,
    with the tests of the course at `root`; with `keyword`, only the tests it selects."""
    chosen = [lessons.get(n) for n in numbers] or list(lessons.LESSONS)
    files = []
    for lesson in chosen:
        found = lessons.test_files(lesson, root)
        if not found:
            raise FileNotFoundError(f"lesson {lesson.number} has no tests in tests/")
        files += [str(f) for f in found]
    command = [sys.executable, "-m", "pytest", *files, f"--impl={impl}", "-p", "no:cacheprovider"]
    command += ["-q", "--no-header", "-rN"]
    if grade_json:
        command.append(f"--grade-json={grade_json}")
    if keyword:
        command += ["-k", keyword]
    return command + (["-n", str(workers)] if workers else ["-p", "no:xdist"])


def _grade(args) -> int:
    impl = lessons.resolve_impl(args.impl)
    command = grade_command(args.lessons, impl, args.grade_json, args.workers, keyword=args.keyword)
    if not args.workers:  # one pytest: its launches fork from it (course/grader/warm.py)
        from course.grader import warm

        command = warm.one_process(command)
    return subprocess.call(command, cwd=REPO_ROOT, env=procs.child_env())


def _list(_args) -> int:
    wide = max(len(lesson.title) for lesson in lessons.LESSONS) + 2  # the longest title fits
    print(f"{'lesson':<8}{'title':<{wide}}{'level':<14}{'launch':<10}folder")
    for lesson in lessons.LESSONS:
        print(
            f"{lesson.number:<8}{lesson.title:<{wide}}{lesson.level:<14}{lesson.launcher:<10}"
            f"{lesson.slug}"
        )
    return 0


def _hint(args) -> int:
    from course.tools import hints

    script, number = hints.parse_which(args.which)
    impl = lessons.resolve_impl(args.impl)
    print(hints.hint(lessons.get(args.lesson), number, impl, script))
    return 0


def _doctor(_args) -> int:
    script = lessons.get("00").path(REPO_ROOT / "solutions")
    if not script.is_file():
        raise FileNotFoundError(
            "the reference solutions are not installed here (a graded class ships without "
            "them); run your own `python lessons/00_environment/env_check.py` instead"
        )
    return subprocess.call([sys.executable, str(script)], env=procs.child_env())


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
    from course.tools import sizes

    return sizes.main(["--impl", args.impl])


def _bad_input() -> tuple[type[Exception], ...]:
    """The errors that become a one-line message; the others are bugs, and keep their
    traceback. Looked up when caught: a reloaded registry has a new UnknownLesson."""
    return (lessons.UnknownLesson, FileNotFoundError, ValueError, release.ReleaseError)


# The verbs whose tools parse their own arguments: (module in course/tools, the errors
# that become a one-line message).
TOOLS = {
    "record": ("record", (ValueError, RuntimeError)),
    "bandwidth": ("bandwidth", ValueError),
    "timeline": ("timeline", ValueError),
    "schedules": ("schedules", (ValueError, RuntimeError)),
    "clock": ("clock", FileNotFoundError),
    "memory": ("memory", (FileNotFoundError, ValueError)),
    "find-unused": ("find_unused", ()),
    "spy": ("spy", FileNotFoundError),
    "autograder": ("autograder", ()),
    "classroom": ("classroom", ()),
    "grade-class": ("grade_class", ()),
    "grading-cost": ("grading_cost", None),
    "figures": ("figures", ValueError),  # figures.UnknownFigure is one
    "tolerances": ("tolerances", ValueError),
    "durations": ("durations", ()),
    "bench": ("bench", None),  # None: _bad_input()
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in TOOLS:  # a tool with its own parser: it gets the rest
        import importlib

        module, errors = TOOLS[argv[0]]
        tool = importlib.import_module(f"course.tools.{module}")
        caught = _bad_input() if errors is None else errors
        try:
            return tool.main(argv[1:])
        except caught as err:
            print(f"python -m course {argv[0]}: error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130
    # Everything after `--` belongs to the lesson script, not to us.
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    args = _parser().parse_args(argv)
    args.extra = extra
    handler = {
        "list": _list,
        "run": _run,
        "grade": _grade,
        "hint": _hint,
        "doctor": _doctor,
        "release": _release,
        "sizes": _sizes,
    }
    try:
        return handler[args.command](args)
    except _bad_input() as err:
        print(f"python -m course {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
