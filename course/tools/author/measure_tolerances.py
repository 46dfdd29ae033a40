"""Measure every bound the lesson tests allow: `python -m course tolerances`.

    python -m course tolerances                  # every declared bound, on solutions/
    python -m course tolerances 03 10.fsdp2      # one lesson's bounds, or one bound
    python -m course tolerances 09 --seeds 2     # each bound's first 2 seeds only: a try
    python -m course tolerances --list           # the declared bounds, and what is recorded
    python -m course tolerances 10 --mistakes    # where the known mistakes land instead

A lesson test declares each bound it grades with (course/grader/tolerances.py). This command
runs the test that measures a bound on the reference solution once per seed of the bound,
collects what the test saw, and writes the distribution with its provenance to
docs/results/tolerances/cpu.json (bounds not measured this time keep their entries). The
pages quote that record, and tests/course/grader/test_tolerances.py checks that every declared
bound is
measured there with its current value, and has room above the worst value the reference
reached. Run it after changing a bound, a test's recipe or a lesson's reference.

With --mistakes it measures the other side: each mutant of tests/mutants/ (a mistake a
student makes) whose `caught_by` picks a bounded test runs that test once, at its own seed,
and the record keeps, beside the reference's values, the value each mistake reached.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from course import REPO_ROOT, atomic, launch, registry
from course.grader import tolerances
from course.grader.grading import Grading
from course.tools.author import mutants
from course.tools.author.tolerance_store import (
    RECORD,
    entry,
    extremes,
    farthest,
    load,
    nearest_mistake,
    problems,
    provenance,
    worst,
)

DEADLINE_S = 600  # one test at one seed; scaled by COURSE_TIMEOUT_SCALE


def declared(root: Path = REPO_ROOT) -> dict[str, tolerances.Tolerance]:
    """Every bound the lesson tests declare, by key (their modules imported, not run)."""
    for path in registry.tests(None, root):
        name = path.stem
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    found = tolerances.declared()
    for t in found.values():
        module = sys.modules[Path(t.file).stem]
        missing = [name for name in t.test.split() if not callable(getattr(module, name, None))]
        if missing:
            raise ValueError(f"{t.file}: bound {t.key} names tests it lacks: {missing}")
    return found


def chosen(found: dict, wanted: list[str]) -> list[tolerances.Tolerance]:
    if not wanted:
        return list(found.values())
    picked = [t for t in found.values() if any(t.key == w or t.lesson == w for w in wanted)]
    unknown = [w for w in wanted if not any(t.key == w or t.lesson == w for t in found.values())]
    if unknown:
        raise ValueError(f"no declared bound {', '.join(unknown)} (`--list` shows them)")
    return picked


@contextlib.contextmanager
def busy_loops(count: int):
    """`count` processes that spin on a core each, for a timing bound's measurement: what the
    CI's two pytest workers do to a lesson's timing. Killed on the way out."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                 start_new_session=True) for _ in range(count)]  # fmt: skip
    try:
        yield
    finally:
        for spinner in spinning:
            spinner.kill()
            spinner.wait()


def measure(picked: list[tolerances.Tolerance], impl: Path, limit: int | None,
            root: Path = REPO_ROOT) -> dict[str, dict]:  # fmt: skip
    """Run each (test file, test) once per seed; what note() saw, by key and seed."""
    groups: dict[tuple, list[tolerances.Tolerance]] = {}  # by file and load: a pytest a seed
    for t in picked:
        groups.setdefault((t.file, t.busy), []).append(t)
    seen: dict[str, dict[str, list[float]]] = {t.key: {} for t in picked}
    failed: dict[str, list[int]] = {t.key: [] for t in picked}

    def seeds_of(t):
        return t.seeds[:limit] if limit else t.seeds

    for (file, busy), members in groups.items():
        for s in sorted({s for t in members for s in seeds_of(t)}):
            tests = dict.fromkeys(n for t in members if s in seeds_of(t) for n in t.test.split())
            nodes = [f"{root / file}::{name}" for name in tests]
            with tempfile.TemporaryDirectory() as tmp:
                log = Path(tmp) / "notes.jsonl"
                command = Grading(tuple(nodes), str(impl)).command()
                env = {tolerances.SEED_ENV: str(s), tolerances.LOG_ENV: str(log), "TMPDIR": tmp}
                with busy_loops(busy):
                    run = launch.run(command, timeout=DEADLINE_S, cwd=root, env=env)
                lines = log.read_text().splitlines() if log.is_file() else []
            notes = [json.loads(line) for line in lines]
            for t in members:
                if s not in seeds_of(t):
                    continue
                values = [n["seen"] for n in notes
                          if n["key"] == t.key and n.get("backend") in (None, "gloo")]  # fmt: skip
                seen[t.key][str(s)] = extremes(t, values)
                if not run.ok:
                    failed[t.key].append(s)
                shown = f"{worst(t, values):.3g}" if values else "nothing noted"
                verdict = "" if run.ok else f"  (failed: {_last_line(run)})"
                print(f"{t.key:<22} seed {s:>3}: {shown}  [{run.seconds:.0f} s]{verdict}",
                      flush=True)  # fmt: skip
            if not run.ok:  # which tests failed, and pytest's first lines of why
                why = [line for line in run.output.splitlines() if line.startswith("FAILED ")]
                print("\n".join(f"    {line[:200]}" for line in why[:4]), flush=True)
    return {key: {"seen": seen[key], "failed_seeds": failed[key]} for key in seen}


def _last_line(run: launch.RunResult) -> str:
    """pytest's summary line ("1 failed, 2 passed in 9.1s"), or why there is none."""
    if run.timed_out:
        return f"killed after {run.timeout:.0f} s"
    lines = [line for line in run.output.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {run.returncode}, no output"


def measure_mistakes(picked: list[tolerances.Tolerance], root: Path = REPO_ROOT,
                     only: list[str] | None = None) -> dict[str, dict]:  # fmt: skip
    """Each mutant whose `caught_by` picks a test that measures a picked bound: that test on
    the mutant, once, at its own seed; by key, what each mistake reached."""
    found: dict[str, dict] = {t.key: {} for t in picked}
    for number, file, case in mutants.cases("MUTANTS", root / "tests" / "mutants"):
        if only and case["name"] not in only:
            continue
        hit = {t: [n for n in t.test.split() if mutants.selects(case["caught_by"], n)]
               for t in picked if t.lesson == number}  # fmt: skip
        hit = {t: names for t, names in hit.items() if names}
        if not hit:
            continue
        nodes = dict.fromkeys(f"{root / t.file}::{n}" for t, names in hit.items() for n in names)
        with tempfile.TemporaryDirectory() as tmp:
            impl = mutants.apply(Path(tmp), file, case, root)
            log = Path(tmp) / "notes.jsonl"
            command = Grading(tuple(nodes), str(impl)).command()
            env = {tolerances.LOG_ENV: str(log), "TMPDIR": tmp}
            with busy_loops(max(t.busy for t in hit)):
                run = launch.run(command, timeout=DEADLINE_S, cwd=root, env=env)
            notes = [json.loads(line) for line in log.read_text().splitlines()] if (
                log.is_file()) else []  # fmt: skip
        for t in hit:
            values = [n["seen"] for n in notes
                      if n["key"] == t.key and n.get("backend") in (None, "gloo")]  # fmt: skip
            shown = f"{farthest(t, values):.3g}" if values else "nothing noted"
            print(f"{t.key:<22} {case['name']:<34} {shown}  [{run.seconds:.0f} s, "
                  f"{'passed' if run.ok else 'rejected'}]", flush=True)  # fmt: skip
            # None: the test stopped this mistake before it measured this bound
            value = float(f"{farthest(t, values):.3g}") if values else None
            found[t.key][case["name"]] = dict(value=value, why=case["why"], rejected=not run.ok)
    return found


def _table(found: dict, doc: dict) -> str:
    rows = [("bound", "allowed", "reference: min / median / max", "seeds", "nearest mistake",
             "problems")]  # fmt: skip
    for t in found.values():
        e = doc["tolerances"].get(t.key)
        spread = (f"{e['min']:.2g} / {e['median']:.2g} / {e['max']:.2g}"
                  if e and "min" in e else "-")  # fmt: skip
        seeds = str(len([s for s, v in e["seen"].items() if v])) if e else "0"
        mistake = nearest_mistake(t, e) if e else None
        shown = f"{mistake[1]:.2g} ({mistake[0]})" if mistake else "-"
        rows.append((t.key, t.bounds(), spread, seeds, shown, str(len(problems(t, e)))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)  # fmt: skip


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="python -m course tolerances", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    made.add_argument("bounds", nargs="*", metavar="NN|NN.name",
                      help="a lesson's bounds, or one bound (default: all)")  # fmt: skip
    made.add_argument("--seeds", type=int, default=None, metavar="N",
                      help="each bound's first N seeds only")  # fmt: skip
    made.add_argument(
        "--impl",
        default="solutions",
        type=registry.impl_argument,
        help="the folder measured (solutions)",
    )
    made.add_argument("--out", default=str(RECORD), help=f"the record ({RECORD})")
    made.add_argument("--list", action="store_true", help="the bounds and the record's state")
    made.add_argument(
        "--mistakes",
        action="store_true",
        help="measure the mutants (tests/mutants/) instead of the reference",
    )
    made.add_argument("--mutant", action="append", metavar="NAME",
                      help="with --mistakes: only this mutant (repeatable)")  # fmt: skip
    return made


def main(argv: list[str] | None = None) -> int:
    parser_ = parser()
    args = parser_.parse_args(argv)
    if args.seeds is not None and args.seeds < 1:
        parser_.error("--seeds must be at least 1")
    found = declared()
    picked = chosen(found, args.bounds)
    out = Path(args.out)
    doc = load(out if out.is_absolute() else REPO_ROOT / out)
    if args.list:
        print(_table({t.key: t for t in picked}, doc))
        return 0

    path = out if out.is_absolute() else REPO_ROOT / out
    if args.mistakes:
        return _mistakes(picked, doc, path, args, argv)
    if args.mutant:
        parser_.error("--mutant goes with --mistakes")
    impl = args.impl
    start = time.monotonic()
    measured = measure(picked, impl, args.seeds)
    # The record's command makes every entry again; each entry names the one that made it.
    prov = provenance(f"python -m course tolerances --out {args.out}")
    doc["provenance"] = prov
    ran = dict(prov, command=" ".join(["python -m course tolerances", *(argv or sys.argv[1:])]))
    for t in picked:
        kept = doc["tolerances"].get(t.key, {}).get("mistakes")  # --mistakes measures those
        doc["tolerances"][t.key] = entry(t, measured[t.key], ran)
        if kept:
            doc["tolerances"][t.key]["mistakes"] = kept
    doc["tolerances"] = dict(sorted(doc["tolerances"].items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(doc, path, indent=1)
    print(f"\n{_table({t.key: t for t in picked}, doc)}")
    print(f"\nwrote {out} in {time.monotonic() - start:.0f} s")
    wrong = [p for t in picked for p in problems(t, doc["tolerances"].get(t.key))]
    for p in wrong:
        print(f"problem: {p}")
    return 1 if wrong else 0


def _mistakes(picked: list, doc: dict, path: Path, args, argv) -> int:
    """--mistakes: each bound's entry gains what the mutants reached (the reference's values
    stay as they are); a bound the reference was never measured at is refused."""
    unmeasured = [t.key for t in picked if t.key not in doc["tolerances"]]
    if unmeasured:
        raise ValueError(f"measure the reference first: `python -m course tolerances "
                         f"{' '.join(unmeasured)}`")  # fmt: skip
    known = {case["name"] for _, _, case in mutants.cases("MUTANTS")}
    unknown = sorted(set(args.mutant or ()) - known)
    if unknown:
        raise ValueError(f"no mutant {', '.join(unknown)} in tests/mutants/")
    start = time.monotonic()
    found = measure_mistakes(picked, only=args.mutant)
    made = provenance(" ".join(["python -m course tolerances", *(argv or sys.argv[1:])]))
    for t in picked:
        e = doc["tolerances"][t.key]
        now = {name: dict(m, command=made["command"], date=made["date"], torch=made["torch"])
               for name, m in found[t.key].items()}  # fmt: skip
        mine = now if not args.mutant else {**e.get("mistakes", {}), **now}
        e["mistakes"] = dict(sorted(mine.items()))
    atomic.write_json(doc, path, indent=1)
    print(f"\n{_table({t.key: t for t in picked}, doc)}")
    print(f"\nwrote {args.out} in {time.monotonic() - start:.0f} s")
    return 0
