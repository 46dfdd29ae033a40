"""What grading one student costs, lesson by lesson: `python -m course grading-cost`.

    python -m course grading-cost                         # every lesson of solutions/
    python -m course grading-cost --lessons 00 03 --impl lessons
    python -m course grading-cost --out docs/results/grading/cpu-2.json

Each lesson is graded on its own, as `python -m course grade NN` does it (one pytest, no
xdist), and timed: wall seconds, and the CPU seconds of the grader and everything it
started. The record is what the "Adopting the course" page shows an instructor: how long a
class's grading takes on a machine like this one, and which lessons cost most.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import sys
import tempfile
from pathlib import Path

import course
from course import REPO_ROOT, atomic, launch, registry

KIND = "course-grading-cost"
FOLDER = REPO_ROOT / "docs" / "results" / "grading"
# One record a kind of machine: the CI's 2 cores, and a box with one GPU visible (where
# the gpus(1) tests run too, and the launches import CUDA).
RECORDS = {"cpu": FOLDER / "cpu-2.json", "gpu": FOLDER / "gpu-1.json"}
BUDGET_S = 45  # a lesson's grading, on two cores (docs/contributing.md)
DEADLINE_S = 300  # per lesson, scaled by COURSE_TIMEOUT_SCALE: a hung submission's cap


def _cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def grade_lesson(number: str, impl: Path) -> dict:
    from course.grader.grading import of_lessons

    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results.json"
        cpu = _cpu_seconds()
        run = launch.run(
            of_lessons([number], impl, results).warm_command(), timeout=DEADLINE_S, cwd=tmp,
            env={"TMPDIR": tmp},
        )  # fmt: skip
        cpu = _cpu_seconds() - cpu
        try:
            found = json.loads(results.read_text())
        except (OSError, ValueError):
            found = {}
    tests = found.get("tests", [])
    status = [t.get("status") for t in tests]
    return {
        "lesson": number,
        "title": registry.get(number).title,
        "seconds": round(run.seconds, 1),
        "cpu_seconds": round(cpu, 1),
        "tests": len(tests),
        "passed": status.count("passed"),
        "failed": status.count("failed"),
        "skipped": status.count("skipped"),
        "points": found.get("score", 0.0),
        "max_points": found.get("max_score", 0.0),
        "finished": not run.timed_out,
    }


def machine() -> str:
    """ "gpu" where this process sees a CUDA GPU, else "cpu": which record describes it."""
    from course.runtime import visible_gpus

    return "gpu" if visible_gpus() else "cpu"


def measured_seconds(number: str, kind: str | None = None) -> float | None:
    """Lesson `number`'s grading, in seconds, as measured on this kind of machine (or
    `kind`'s); None where no record has it. On a GPU box without its record: the CPU
    record's, times 3 (an H100 box, 16 cores, graded lesson 09 with a broken file in 135 s,
    past a limit set for 2 cores, 120 s: the gpus(1) tests run there too)."""
    kind = kind or machine()
    for path, times in ((RECORDS[kind], 1.0), (RECORDS["cpu"], 3.0)):
        try:
            rows = json.loads(path.read_text())["rows"]
        except (OSError, ValueError, KeyError):
            continue
        for row in rows:
            if row["lesson"] == number:
                return row["seconds"] * times
    return None


def provenance(argv: list[str]) -> dict:
    import torch

    from course.runtime import visible_gpus

    gpus = visible_gpus()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python -m course grading-cost", *argv]),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": str(os.cpu_count()),
        "device": torch.cuda.get_device_name(0) if gpus else "CPU",
        "gpu_count": str(gpus),
        "course": course.__version__,
    }


def table(doc: dict, markdown: bool = False) -> str:
    head = ["lesson", "title", "tests", "passed", "skipped", "seconds", "CPU seconds", "points"]
    rows = [
        [r["lesson"], r["title"], str(r["tests"]), str(r["passed"]), str(r["skipped"]),
         f"{r['seconds']:.0f}", f"{r['cpu_seconds']:.0f}", f"{r['points']:g}/{r['max_points']:g}"]
        for r in doc["rows"]
    ]  # fmt: skip
    total = {
        k: sum(r[k] for r in doc["rows"]) for k in doc["rows"][0] if k not in ("lesson", "title")
    }
    rows.append(["all", "", str(total["tests"]), str(total["passed"]), str(total["skipped"]),
                 f"{total['seconds']:.0f}", f"{total['cpu_seconds']:.0f}",
                 f"{total['points']:g}/{total['max_points']:g}"])  # fmt: skip
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    return "\n".join(
        "  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)).rstrip()
        for r in [head, *rows]
    )


def provenance_line(doc: dict) -> str:
    p = doc["provenance"]
    return (
        f"on {p['cpus']} CPU cores, torch {p['torch']}, course {p['course']}, {p['date']}, "
        f"grading {doc['impl']}"
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m course grading-cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--lessons", nargs="+", default=[], metavar="NN", help="default: all")
    p.add_argument(
        "--impl",
        default="solutions",
        type=registry.impl_argument,
        help="solutions (default), lessons or a folder",
    )
    p.add_argument("--out", type=Path, help="write the JSON record here")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    impl = args.impl
    numbers = [registry.get(n).number for n in args.lessons] or [x.number for x in registry.LESSONS]
    rows = []
    for number in numbers:
        rows.append(grade_lesson(number, impl))
        row = rows[-1]
        over = "" if row["seconds"] <= BUDGET_S else f"  (over the {BUDGET_S} s budget)"
        print(f"lesson {number}: {row['seconds']:.0f} s, {row['cpu_seconds']:.0f} CPU s, "
              f"{row['passed']}/{row['tests']} passed{over}", flush=True)  # fmt: skip
    doc = {
        "kind": KIND,
        "impl": registry.impl_name(args.impl),
        "rows": rows,
        "provenance": provenance(argv),
    }
    print(f"\nGrading one student {provenance_line(doc)}:\n{table(doc)}")
    unfinished = [r["lesson"] for r in rows if not r["finished"] or not r["tests"]]
    if unfinished:  # a cost without a grade is no figure: nothing is written
        said = f"lesson {', '.join(unfinished)} did not finish grading within {DEADLINE_S} s"
        print(f"python -m course grading-cost: error: {said} or wrote no results", file=sys.stderr)
        return 1
    if args.out:
        atomic.write_json(doc, args.out, indent=1)
        print(f"wrote {args.out}")
    return 0
