"""Grade a whole class on this machine: one folder per student, one CSV row per student.

    python -m course grade-class SUBMISSIONS --out grades.csv [--lessons 00 03] [--jobs N]

SUBMISSIONS holds one folder per student, each laid out like lessons/ (00_environment/,
03_ddp_spawn/, ...). Each student is graded by `python -m course grade` in a process of
its own, with its own working folder, temporary folder and deadline; what that grading
started is killed when it ends (the grader is a child subreaper, docs/threat-model.md).
So a hung submission costs its own deadline, and a hostile one cannot outlive its own
grading. Grades are read from each grading's results file as soon as it ends, kept
here, and written once at the end: grades.csv (a row per student, a column per lesson)
and grades/<student>.json (Gradescope's results.json shape).

With --jobs above 1, submissions graded at the same time run as the same user as each
other and as this command; for a class you do not trust, run one at a time or set
COURSE_CHILD_USER (docs/threat-model.md).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from course import atomic, launch, registry

# A deadline for one student's whole grading, per lesson graded: the grader's own
# deadlines end a hung launch well before (one lesson grades in under 45 s on 2 cores,
# a hang-at-import submission in under 60 s); this is the net under them.
SECONDS_PER_LESSON = 240


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m course grade-class", description=__doc__.split("\n")[0]
    )
    p.add_argument("submissions", type=Path, help="a folder with one folder per student")
    p.add_argument("--out", type=Path, default=Path("grades.csv"), help="the CSV to write")
    p.add_argument("--lessons", nargs="*", default=[], help="lesson numbers (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="students graded at once (default 1)")
    args = p.parse_args(argv)
    if not args.submissions.is_dir():
        p.error(f"{args.submissions}: not a folder")
    if args.jobs < 1:
        p.error(f"--jobs {args.jobs}: must be at least 1")
    try:
        args.lessons = [registry.get(n).number for n in args.lessons] or [
            lesson.number for lesson in registry.LESSONS
        ]
    except registry.UnknownLesson as err:
        p.error(str(err))
    return args


def students(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def grade_one(student: Path, numbers: list[str], scratch: Path) -> dict:
    """One student's grading, in a process of its own: {status, seconds, results}."""
    work = scratch / student.name
    (work / "tmp").mkdir(parents=True)
    results = work / "results.json"
    command = [sys.executable, "-m", "course", "grade", *numbers, "--impl", str(student.resolve())]
    command += ["--grade-json", str(results)]
    run = launch.run(
        command,
        timeout=SECONDS_PER_LESSON * len(numbers),
        cwd=work,
        env={"TMPDIR": str(work / "tmp")},
    )
    try:
        found = json.loads(results.read_text())  # read now: nothing of theirs is alive
        valid = isinstance(found, dict) and isinstance(found.get("tests"), list)
    except (OSError, ValueError):
        found, valid = None, False
    if run.timed_out:
        status = f"not finished within {run.timeout:.0f} s"
    elif not valid:
        status = f"no results (the grader exited with code {run.returncode})"
    else:
        status = "graded"
    return {"status": status, "seconds": run.seconds, "results": found if valid else None}


def by_lesson(results: dict | None, numbers: list[str]) -> dict[str, float]:
    points = dict.fromkeys(numbers, 0.0)
    for test in (results or {}).get("tests", []):
        if test.get("number") in points:
            points[test["number"]] += float(test.get("score", 0.0))
    return points


def progress(done: int, total: int, last: str) -> None:
    width = 30
    filled = width * done // max(total, 1)
    line = f"\rgrading [{'#' * filled}{'.' * (width - filled)}] {done}/{total}  {last}"
    end = "\n" if done == total or not sys.stderr.isatty() else ""
    print(line if sys.stderr.isatty() else line.lstrip("\r"), end=end, file=sys.stderr, flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    everyone = students(args.submissions)
    if not everyone:
        print(f"python -m course grade-class: error: no student folders in {args.submissions}",
              file=sys.stderr)  # fmt: skip
        return 2
    graded: dict[str, dict] = {}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="course-class-") as scratch:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            jobs = {
                pool.submit(grade_one, student, args.lessons, Path(scratch)): student.name
                for student in everyone
            }
            for future in as_completed(jobs):
                name = jobs[future]
                graded[name] = future.result()
                total = sum(by_lesson(graded[name]["results"], args.lessons).values())
                what = f"{name}: {total:g} points" if graded[name]["results"] else name
                progress(len(graded), len(everyone), f"{what} ({graded[name]['status']})")
    # Written once, at the end, from what was read as each grading ended.
    json_dir = args.out.with_suffix("")
    json_dir.mkdir(parents=True, exist_ok=True)
    header = ["student", *args.lessons, "total", "max", "status", "seconds"]
    rows = []
    for name in sorted(graded):
        found = graded[name]
        points = by_lesson(found["results"], args.lessons)
        possible = (found["results"] or {}).get("max_score", 0.0)
        rows.append([name, *(f"{points[n]:g}" for n in args.lessons),
                     f"{sum(points.values()):g}", f"{possible:g}", found["status"],
                     f"{found['seconds']:.1f}"])  # fmt: skip
        if found["results"] is not None:
            atomic.write_json(found["results"], json_dir / f"{name}.json")
    with tempfile.NamedTemporaryFile("w", dir=args.out.parent or ".", delete=False,
                                     suffix=".csv", newline="") as out:  # fmt: skip
        csv.writer(out).writerows([header, *rows])
    Path(out.name).replace(args.out)
    print(f"{len(rows)} students, lessons {' '.join(args.lessons)}, "
          f"{time.monotonic() - start:.0f} s: {args.out}, {json_dir}/")  # fmt: skip
    return 0
