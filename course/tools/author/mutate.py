"""The grader measured by a mutation engine: `python -m course mutate NN [--jobs N] [--seeds K]`.

    python -m course mutate 12 --jobs 16 --seeds 3 --only ring.py   # --list: no grading

The engine is cosmic-ray (its operators, its mutation of a file and its test run), with the
course's own operators as its plugin (course/tools/author/mutation_operators.py). It
mutates only what a student writes: the lines between `### BEGIN SOLUTION` and
`### END SOLUTION` of the lesson's solution files (and a debugging exercise's fix, between
`### FIX` and `### END BUG`), in copies of solutions/ (one a job). Each
mutant's test command grades it (`python -m course.tools.author.mutant_grade`): the tests
that read its file, stopping at the first failure, once per grading seed. A mutant is
killed only if the grade rejects it at every seed; one seed that passes it is a survivor.

It writes docs/results/grading/mutation-NN.json: the engine and its version, the operators,
each solution file's hash and last commit, the seeds, and each mutant with its outcome:
killed, survived, equivalent (tests/mutants/equivalents.py, with the reason) or timeout.
CI checks only that each record matches today's solutions; the engine never runs there.

Over 300 lines, on purpose: making the mutants, grading them, the record and its triage
are one flow over one record's fields; split, each part would import the others.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import queue
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

from course import REPO_ROOT, atomic, registry

FOLDER = REPO_ROOT / "docs" / "results" / "grading"
KIND = "course-mutation"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
FIX, END_BUG = "### FIX", "### END BUG"  # a debugging exercise: the fix is the student's

# cosmic-ray's own operators that make a student's mistakes (a boundary, a sign, a flipped
# condition, a number's neighbour, a loop that never runs), and the course's plugin.
OPERATORS = (
    *(f"core/ReplaceComparisonOperator_{a}_{b}" for a, b in (
        ("Lt", "LtE"), ("LtE", "Lt"), ("Gt", "GtE"), ("GtE", "Gt"), ("Eq", "NotEq"),
        ("NotEq", "Eq"), ("Is", "IsNot"), ("IsNot", "Is"))),
    *(f"core/ReplaceBinaryOperator_{a}_{b}" for a, b in (
        ("Add", "Sub"), ("Sub", "Add"), ("Mul", "Div"), ("Div", "Mul"), ("FloorDiv", "Div"),
        ("Div", "FloorDiv"))),
    "core/ReplaceUnaryOperator_Delete_USub", "core/ReplaceUnaryOperator_Delete_Not",
    "core/ReplaceTrueWithFalse", "core/ReplaceFalseWithTrue", "core/ReplaceAndWithOr",
    "core/ReplaceOrWithAnd", "core/AddNot", "core/NumberReplacer", "core/ZeroIterationForLoop",
    "core/ReplaceBreakWithContinue",
    "course/DeleteStatement", "course/DropCall", "course/DropKeyword", "course/SwapArguments",
)  # fmt: skip


def engine():
    """cosmic-ray, with the course's operators registered (as its entry point does when the
    course is installed): the module, or a ValueError that says how to install it."""
    try:
        import cosmic_ray
        import cosmic_ray.plugins
    except ImportError:
        raise ValueError(
            "the mutation engine is cosmic-ray: pip install 'cosmic-ray>=8.7,<9'"
        ) from None
    from course.tools.author import mutation_operators

    cosmic_ray.plugins.OPERATOR_PROVIDERS.setdefault("course", mutation_operators.Provider())
    return cosmic_ray


def solution_lines(source: str) -> set[int]:
    """The line numbers (1-based) a student writes: between each BEGIN and END SOLUTION
    marker, and between each FIX and END BUG marker (a debugging exercise's fix; the bug
    above its FIX is what the starter keeps)."""
    lines, inside = set(), False
    for number, line in enumerate(source.splitlines(), 1):
        if line.strip().startswith((BEGIN, FIX)):
            inside = True
        elif line.strip().startswith((END, END_BUG)):
            inside = False
        elif inside:
            lines.add(number)
    return lines


def mutants(path: Path) -> list[dict]:
    """Every mutation OPERATORS make of the solution lines of `path`, in cosmic-ray's order
    (its occurrence numbers count the whole file, as its mutation of a file does)."""
    cr = engine()
    from cosmic_ray.ast import ast_nodes, get_ast_from_path
    from cosmic_ray.mutating import mutate_code

    source = path.read_text()
    inside, found = solution_lines(source), []
    tree = get_ast_from_path(path)
    for name in OPERATORS:
        operator = cr.plugins.get_operator(name)()
        positions = [p for node in ast_nodes(tree) for p in operator.mutation_positions(node)]
        for occurrence, (start, end) in enumerate(positions):
            if start[0] not in inside or end[0] not in inside:
                continue
            mutated = mutate_code(source, operator, occurrence)
            if mutated is None or mutated == source:
                continue
            before, after = _changed(source, mutated)
            found.append({"operator": name, "occurrence": occurrence, "line": start[0],
                          "span": [*start, *end], "before": before, "after": after})  # fmt: skip
    return found


def _changed(old: str, new: str) -> tuple[str, str]:
    """The first changed line, before and after (stripped), for the record."""
    pairs = zip(old.splitlines(), new.splitlines(), strict=False)
    return next(((x.strip(), y.strip()) for x, y in pairs if x != y), ("", ""))


def blob(path: Path) -> str:
    """The file's git blob hash (what `git hash-object` prints), computed without git."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def last_commit(path: Path) -> str:
    try:
        words = ["git", "log", "-1", "--format=%H", "--", str(path)]
        out = subprocess.run(words, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        return out.stdout.strip()
    except OSError:
        return ""


def _test_command(lesson, impl: Path, file: str, seeds: list[int], deadline: float) -> str:
    words = [sys.executable, "-m", "course.tools.author.mutant_grade", lesson.number,
             str(impl), file, ",".join(map(str, seeds)), f"{deadline:.0f}"]  # fmt: skip
    return shlex.join(words)


def _grade_one(copies: queue.Queue, lesson, case: dict, seeds, deadline) -> dict:
    from cosmic_ray.mutating import mutate_and_test
    from cosmic_ray.work_item import MutationSpec

    impl = copies.get()
    try:
        path = impl / lesson.slug / case["file"]
        spec = MutationSpec(module_path=path, operator_name=case["operator"],
                            operator_args={}, occurrence=case["occurrence"],
                            start_pos=tuple(case["span"][:2]),
                            end_pos=tuple(case["span"][2:]))  # fmt: skip
        start = time.monotonic()
        command = _test_command(lesson, impl, case["file"], seeds, deadline)
        result = mutate_and_test([spec], command, timeout=deadline * len(seeds) + 60)
        seconds = round(time.monotonic() - start, 1)
    finally:
        copies.put(impl)
    verdict = _verdict(result.output or "")
    return {**case, **verdict, "seconds": seconds}


def _verdict(output: str) -> dict:
    """What mutant_grade printed last: its JSON line."""
    for line in reversed(output.splitlines()):
        if line.startswith("course-mutant: "):
            return json.loads(line.removeprefix("course-mutant: "))
    return {"outcome": "error", "detail": output.strip().splitlines()[-1:] or ["no output"]}


def run(number: str, jobs: int, seeds: list[int], only: list[str] | None = None,
        limit: int = 0, equivalents: dict | None = None, save=None,
        again: dict | None = None, rest: dict | None = None) -> dict:  # fmt: skip
    """Mutate and grade lesson `number`; the record. `save(record)` is called after each
    mutant with the record so far (a run stopped halfway keeps what it graded). With
    `again` (a record), only its mutants that were not killed are graded, the others kept;
    with `rest` (a record of a stopped run), only the mutants it never reached."""
    engine()
    lesson = registry.get(number)
    files = [f for f in (lesson.exercises or (lesson.script,)) if not only or f in only]
    cases = [
        {"file": f, **m} for f in files for m in mutants(REPO_ROOT / "solutions" / lesson.slug / f)
    ]
    random.Random(seeds[0]).shuffle(cases)  # a run stopped halfway: a fair sample
    cases = cases[:limit] if limit else cases
    kept: list[dict] = []
    if again is not None:
        kept = [r for r in again["mutants"] if r["outcome"] in ("killed", "equivalent")]
        done = {_id(r) for r in kept}
        graded = {_id(r) for r in again["mutants"]}
        cases = [c for c in cases if _id(c) in graded and _id(c) not in done]
    if rest is not None:
        kept, graded = list(rest["mutants"]), {_id(r) for r in rest["mutants"]}
        cases = [c for c in cases if _id(c) not in graded]
    before = again if again is not None else rest
    equivalents = equivalents or {}
    deadline = _deadline(lesson)
    planned = before["planned"] if before is not None else len(cases)
    marked = [*before["seeds"], *seeds] if before is not None else seeds  # the record's seeds
    rerun = (seeds, "--again" if again is not None else "--rest") if before else None
    with tempfile.TemporaryDirectory(prefix="course-mutate-") as tmp:
        copies: queue.Queue = queue.Queue()
        for k in range(jobs):
            shutil.copytree(REPO_ROOT / "solutions", Path(tmp) / f"w{k}", dirs_exist_ok=True)
            copies.put(Path(tmp) / f"w{k}")
        results: list[dict] = []
        with ThreadPoolExecutor(jobs) as pool:
            todo = [pool.submit(_grade_one, copies, lesson, c, seeds, deadline)
                    for c in cases if _key(c) not in equivalents]  # fmt: skip
            for i, future in enumerate(todo, 1):
                r = future.result()
                results.append(r)
                print(f"[{i}/{len(todo)}] {r['outcome']:<9} {r['file']}:{r['line']} "
                      f"{r['operator']}: {r['after'][:60]}", flush=True)  # fmt: skip
                if save is not None:
                    save(record(lesson, files, marked, kept + results, planned, rerun))
    for c in cases:
        if _key(c) in equivalents:
            results.append({**c, "outcome": "equivalent", "reason": equivalents[_key(c)]})
    return record(lesson, files, marked, kept + results, planned, rerun)


def declared(number: str) -> dict[str, str]:
    """The mutants of lesson `number` declared equivalent, {key: the one-line reason}:
    tests/mutants/equivalents.py's EQUIVALENT (they name the answers: kept with the mutants)."""
    from course.tools.author import mutants as known

    path = known.MUTANT_DIR / "equivalents.py"
    return known.load(path).EQUIVALENT.get(number, {}) if path.exists() else {}


def _key(case: dict) -> str:
    return f"{case['file']}:{case['before']} -> {case['after']}"


def _id(case: dict) -> tuple:
    """One mutant, wherever it was made: its file, operator, occurrence and line."""
    return case["file"], case["operator"], case["occurrence"], case["line"]


def _deadline(lesson) -> float:
    """Seconds one grading of the lesson may take before the mutant counts as a timeout: 4
    times the reference's measured grading on this kind of machine, at least 120."""
    from course.tools.instructor.grading_cost import measured_seconds

    return max(120.0, 4 * (measured_seconds(lesson.number) or 60))


def scored(results: list[dict]) -> tuple[dict, float | None]:
    """The outcomes counted, and the killed share of the graded (equivalents aside)."""
    counts = {o: sum(r["outcome"] == o for r in results)
              for o in ("killed", "survived", "equivalent", "timeout", "error")}  # fmt: skip
    graded = len(results) - counts["equivalent"]
    return counts, round(100 * counts["killed"] / graded, 1) if graded else None


def triage(doc: dict, equivalents: dict[str, str]) -> dict:
    """A record with the mutants now declared equivalent marked so, with their reasons."""
    for m in doc["mutants"]:
        if m["outcome"] != "killed" and _key(m) in equivalents:
            m["outcome"], m["reason"] = "equivalent", equivalents[_key(m)]
    doc["counts"], doc["score"] = scored(doc["mutants"])
    return doc


def record(lesson, files, seeds, results, planned: int, again: tuple | None = None) -> dict:
    """The record; `again`: (the seeds, the flag) of a run that graded only the survivors
    of one before, or only what it never reached (the record's seeds are then both runs')."""
    counts, score = scored(results)
    return {
        "kind": KIND,
        "lesson": lesson.number,
        "engine": "cosmic-ray",
        "version": metadata.version("cosmic-ray"),
        "operators": list(OPERATORS),
        "files": {
            f: {"blob": blob(path), "commit": last_commit(path)}
            for f in files
            for path in [REPO_ROOT / "solutions" / lesson.slug / f]
        },
        "seeds": seeds,
        "counts": counts,
        "planned": planned,  # mutants made; fewer in `mutants` where the run was stopped
        "score": score,
        "mutants": sorted(results, key=lambda r: (r["file"], r["line"], r["operator"])),
        "provenance": provenance(lesson.number, *(again or (seeds, ""))),
    }


def provenance(number: str, seeds: list[int], flag: str = "") -> dict:
    import course

    # flag: the last run graded only the survivors of the one before, or what it never reached
    command = f"python -m course mutate {number} {flag + ' ' if flag else ''}--seeds {len(seeds)}"
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": command,
            "cpus": str(os.cpu_count()), "torch": metadata.version("torch"),
            "python": sys.version.split()[0], "course": course.__version__}  # fmt: skip


def parser():
    from course.options import ArgumentParser

    p = ArgumentParser(prog="python -m course mutate", description=__doc__.split("\n")[0])
    p.add_argument("lesson", help="the lesson's number")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="mutants at once")
    p.add_argument("--seeds", type=int, default=2, help="grading seeds, each must reject")
    p.add_argument("--only", nargs="*", help="only these files of the lesson")
    p.add_argument("--limit", type=int, default=0, help="at most this many mutants")
    p.add_argument("--list", action="store_true", help="list the mutants, grade none")
    p.add_argument(
        "--triage",
        action="store_true",
        help="mark the record's mutants declared equivalent since; grade none",
    )
    p.add_argument(
        "--again",
        action="store_true",
        help="grade again only the record's mutants that were not killed (after new tests)",
    )
    p.add_argument(
        "--rest",
        action="store_true",
        help="grade only the mutants a stopped run never reached, keep the record's others",
    )
    p.add_argument("--out", help="the record (default docs/results/grading/mutation-NN.json)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = (p := parser()).parse_args(argv)
    lesson = registry.get(args.lesson)
    if args.seeds < 1 or args.jobs < 1:
        p.error("--seeds and --jobs must be at least 1")
    if args.list:
        for f in lesson.exercises or (lesson.script,):
            if not args.only or f in args.only:
                for m in mutants(REPO_ROOT / "solutions" / lesson.slug / f):
                    print(f"{f}:{m['line']} {m['operator']}: {m['before']}  ->  {m['after']}")
        return 0
    out = Path(args.out) if args.out else FOLDER / f"mutation-{lesson.number}.json"
    if args.triage:
        doc = triage(json.loads(out.read_text()), declared(lesson.number))
        atomic.write_json(doc, out, indent=1)
        print(f"wrote {out}: {doc['counts']}, score {doc['score']} %")
        return 0
    seeds = [random.randrange(1, 10**6) for _ in range(args.seeds)]
    print(f"lesson {lesson.number}: grading seeds {seeds} (COURSE_GRADE_SEED)", flush=True)

    def save(doc: dict) -> None:
        atomic.write_json(doc, out, indent=1)

    if args.again and args.rest:
        p.error("--again and --rest: one at a time")
    before = triage(json.loads(out.read_text()), declared(lesson.number)) if (
        args.again or args.rest) else None  # fmt: skip
    doc = run(lesson.number, args.jobs, seeds, args.only, args.limit, declared(lesson.number),
              save, before if args.again else None, before if args.rest else None)  # fmt: skip
    save(doc)
    print(f"wrote {out}: {doc['counts']}, score {doc['score']} %")
    return 0
