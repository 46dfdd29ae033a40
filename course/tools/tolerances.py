"""Measure every bound the lesson tests allow: `python -m course tolerances`.

    python -m course tolerances                  # every declared bound, on solutions/
    python -m course tolerances 03 10.fsdp2      # one lesson's bounds, or one bound
    python -m course tolerances 09 --seeds 2     # each bound's first 2 seeds only: a try
    python -m course tolerances --list           # the declared bounds, and what is recorded

A lesson test declares each bound it grades with (course/grader/tolerances.py). This command
runs the test that measures a bound on the reference solution once per seed of the bound,
collects what the test saw, and writes the distribution with its provenance to
docs/results/tolerances/cpu.json (bounds not measured this time keep their entries). The
pages quote that record, and tests/test_tolerances.py checks that every declared bound is
measured there with its current value, and has room above the worst value the reference
reached. Run it after changing a bound, a test's recipe or a lesson's reference.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import course
from course import REPO_ROOT, atomic, procs
from course.grader import tolerances

KIND = "course-tolerances"
RECORD = Path("docs") / "results" / "tolerances" / "cpu.json"
DEADLINE_S = 600  # one test at one seed; scaled by COURSE_TIMEOUT_SCALE


def declared(root: Path = REPO_ROOT) -> dict[str, tolerances.Tolerance]:
    """Every bound the lesson tests declare, by key (their modules imported, not run)."""
    tests = root / "tests"
    for path in sorted(tests.glob("test_[0-9][0-9]_*.py")):
        name = path.stem
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    found = dict(sorted(tolerances.DECLARED.items()))
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


def load(path: Path) -> dict:
    if not path.is_file():
        return {"kind": KIND, "tolerances": {}}
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("kind") != KIND:
        raise ValueError(f"{path} is not a `course tolerances` record")
    return doc


def summary(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def extremes(t: tolerances.Tolerance, values: list[float]) -> list[float]:
    """What one run saw, as the record keeps it: the value nearest each bound (3 digits)."""
    if not values:
        return []
    kept = {max(values)} if t.low is None else {min(values)} if t.high is None else {
        min(values), max(values)}  # fmt: skip
    return sorted(float(f"{v:.3g}") for v in kept)


def worst(t: tolerances.Tolerance, values: list[float]) -> float:
    """The value nearest the bound: the largest under a `high`, the smallest over a `low`."""
    return min(values) if t.high is None else max(values)


def problems(t: tolerances.Tolerance, entry: dict | None) -> list[str]:
    """What is wrong with the record's entry for a declared bound ([] when nothing)."""
    if entry is None:
        return [f"{t.key}: not measured (run `python -m course tolerances {t.key}`)"]
    found = []
    for field in ("high", "low"):
        if entry.get(field) != getattr(t, field):
            found.append(f"{t.key}: the test allows {field} {getattr(t, field)}, the record "
                         f"measured against {entry.get(field)}: measure it again")  # fmt: skip
    if entry.get("failed_seeds"):
        found.append(f"{t.key}: its test failed on the reference at seeds {entry['failed_seeds']}")
    seeds = {int(s) for s, values in entry.get("seen", {}).items() if values}
    missing = sorted(set(t.seeds) - seeds)
    if missing:
        found.append(f"{t.key}: no value recorded at seeds {missing}")
    values = [v for vs in entry.get("seen", {}).values() for v in vs]
    if values:
        bad = [v for v in values if not t.holds(v)]
        if bad:
            found.append(f"{t.key}: the reference itself saw {bad[:3]}, outside {t.bounds()}")
        elif t.low is None and t.high < t.room * max(values):
            found.append(f"{t.key}: the bound {t.high:g} is less than {t.room:g} times the "
                         f"worst value the reference reached, {max(values):.2g}")  # fmt: skip
    return found


def provenance(command: str) -> dict:
    import torch

    return {
        "command": command,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": _processor(),
        "cpus": os.cpu_count(),
        "course": course.__version__,
    }


def _processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def measure(picked: list[tolerances.Tolerance], impl: Path, limit: int | None,
            root: Path = REPO_ROOT) -> dict[str, dict]:  # fmt: skip
    """Run each (test file, test) once per seed; what note() saw, by key and seed."""
    groups: dict[str, list[tolerances.Tolerance]] = {}  # by test file: one pytest a seed
    for t in picked:
        groups.setdefault(t.file, []).append(t)
    seen: dict[str, dict[str, list[float]]] = {t.key: {} for t in picked}
    failed: dict[str, list[int]] = {t.key: [] for t in picked}

    def seeds_of(t):
        return t.seeds[:limit] if limit else t.seeds

    for file, members in groups.items():
        for s in sorted({s for t in members for s in seeds_of(t)}):
            tests = dict.fromkeys(n for t in members if s in seeds_of(t) for n in t.test.split())
            nodes = [f"{root / file}::{name}" for name in tests]
            with tempfile.TemporaryDirectory() as tmp:
                log = Path(tmp) / "notes.jsonl"
                command = [sys.executable, "-m", "pytest", *nodes, f"--impl={impl}", "-q",
                           "--no-header", "-p", "no:cacheprovider", "-p", "no:xdist"]  # fmt: skip
                env = {tolerances.SEED_ENV: str(s), tolerances.LOG_ENV: str(log), "TMPDIR": tmp}
                run = procs.run(command, timeout=DEADLINE_S, cwd=root, env=env)
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


def _last_line(run: procs.RunResult) -> str:
    """pytest's summary line ("1 failed, 2 passed in 9.1s"), or why there is none."""
    if run.timed_out:
        return f"killed after {run.timeout:.0f} s"
    lines = [line for line in run.output.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {run.returncode}, no output"


def entry(t: tolerances.Tolerance, measured: dict, prov: dict) -> dict:
    values = [v for vs in measured["seen"].values() for v in vs]
    return {
        "what": t.what, "file": t.file, "test": t.test, "high": t.high, "low": t.low,
        "room": t.room, **(summary(values) if values else {}), "seen": measured["seen"],
        "failed_seeds": measured["failed_seeds"], "date": prov["date"], "torch": prov["torch"],
        "command": prov["command"],
    }  # fmt: skip


def _table(found: dict, doc: dict) -> str:
    rows = [("bound", "allowed", "reference: min / median / max", "seeds", "problems")]
    for t in found.values():
        e = doc["tolerances"].get(t.key)
        spread = (f"{e['min']:.2g} / {e['median']:.2g} / {e['max']:.2g}"
                  if e and "min" in e else "-")  # fmt: skip
        seeds = str(len([s for s, v in e["seen"].items() if v])) if e else "0"
        rows.append((t.key, t.bounds(), spread, seeds, str(len(problems(t, e))) or ""))
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
    made.add_argument("--impl", default="solutions", help="the folder measured (solutions)")
    made.add_argument("--out", default=str(RECORD), help=f"the record ({RECORD})")
    made.add_argument("--list", action="store_true", help="the bounds and the record's state")
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
    from course import lessons

    impl = lessons.resolve_impl(args.impl)
    start = time.monotonic()
    measured = measure(picked, impl, args.seeds)
    # The record's command makes every entry again; each entry names the one that made it.
    prov = provenance(f"python -m course tolerances --out {args.out}")
    doc["provenance"] = prov
    ran = dict(prov, command=" ".join(["python -m course tolerances", *(argv or sys.argv[1:])]))
    for t in picked:
        doc["tolerances"][t.key] = entry(t, measured[t.key], ran)
    doc["tolerances"] = dict(sorted(doc["tolerances"].items()))
    path = out if out.is_absolute() else REPO_ROOT / out
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(doc, path, indent=1)
    print(f"\n{_table({t.key: t for t in picked}, doc)}")
    print(f"\nwrote {out} in {time.monotonic() - start:.0f} s")
    wrong = [p for t in picked for p in problems(t, doc["tolerances"].get(t.key))]
    for p in wrong:
        print(f"problem: {p}")
    return 1 if wrong else 0
