"""Every figure the site renders, and the command that makes it again: `python -m course figures`.

    python -m course figures                 # the list: record, what needs to run it, when, where
    python -m course figures --run           # make again every figure this machine can make
    python -m course figures --run --only outputs/01_cpu 05_allreduce/cpu-gloo
    python -m course figures --run --dry-run # the commands, without running them

A figure is a JSON record under docs/results/ (or an experiment's text output there), made
by one of the course's own commands, which the record names in its provenance:

- outputs/NAME.json: a reference solution's output, `python -m course record NAME` (CPU,
  or as many GPUs as its provenance's `gpu_count`);
- `course bench`, `course bandwidth` and `course timeline` records: the command in the
  record's provenance, with --out pointed at the record; they need as many GPUs as the
  record was measured on (provenance `gpu_count`);
- `course grading-cost` records: grading each lesson of the reference, timed (CPU);
- the `course tolerances` record: each test's bound, measured on the reference over many
  seeds (CPU);
- experiments/NAME.txt: the output of experiments/NAME.py, which says in its first line
  what it ran on.

The site's hook asks `recipe()` for every record it renders, so a page cannot show a figure
that this command does not know how to make (tests/course/tools/author/test_figures.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from course import REPO_ROOT, atomic

RESULTS = Path("docs") / "results"
MADE_BY = {  # a record's `kind` -> the course verb that writes it
    "course-bench": "bench",
    "course-bandwidth": "bandwidth",
    "course-timeline": "timeline",
    "course-schedules": "schedules",
    "course-compositions": "compositions",
    "course-plan": "plan",
    "course-record": "record",
    "course-grading-cost": "grading-cost",
    "course-tolerances": "tolerances",
    "course-mutation": "mutate",
}


CPU_TIMINGS = {"bandwidth", "timeline", "grading-cost", "schedules", "plan"}


class UnknownFigure(ValueError):
    """A record the course cannot make again."""


@dataclass(frozen=True)
class Figure:
    record: str  # relative to the repository: docs/results/...
    verb: str  # the course verb that writes it (or "experiment")
    command: tuple[str, ...]  # what makes it again, run from the repository's root
    gpus: int  # 0: runs on a CPU
    date: str
    machine: str
    torch: str
    cores: int = 0  # a timing on the CPU: made again only with as many cores (0: any)
    course: str = ""  # the course's version that made it ("": made before records said)

    @property
    def name(self) -> str:  # docs/results/outputs/01_cpu.json -> outputs/01_cpu
        return str(Path(self.record).relative_to(RESULTS).with_suffix(""))

    @property
    def needs(self) -> str:
        if self.gpus:
            return f"{self.gpus} GPU{'s' if self.gpus > 1 else ''}"
        return f"{self.cores} CPU cores" if self.cores else "CPU"


def _with_out(command: str, record: str) -> tuple[str, ...]:
    """The provenance's command, writing to the record's own path (it was measured
    elsewhere, --out /root/out/...), and without the `python -m course` it starts with."""
    words = shlex.split(command)
    if words[:3] != ["python", "-m", "course"]:
        raise UnknownFigure(f"{record}: its command is not a course command: {command!r}")
    words = words[3:]
    if "--out" in words:
        words[words.index("--out") + 1] = record
    else:
        words += ["--out", record]
    return ("python", "-m", "course", *words)


def _figure(path: Path, root: Path) -> Figure:
    record = path.relative_to(root).as_posix()
    if path.suffix == ".txt":  # an experiment's output: its script sits beside it
        script = path.with_suffix(".py")
        if not script.is_file():
            raise UnknownFigure(f"{record}: no {script.name} beside it makes it")
        first = path.read_text(encoding="utf-8").splitlines()[:1] or [""]
        made = re.match(r"# (?P<machine>.+?) x(?P<gpus>\d+), torch (?P<torch>\S+),.*, "
                        r"(?P<date>\d{4}-\d\d-\d\d[^,]*)$", first[0])  # fmt: skip
        if not made:
            raise UnknownFigure(f"{record}: its first line does not say where it ran")
        script_rel = script.relative_to(root).as_posix()
        return Figure(record, "experiment", ("python", script_rel), int(made["gpus"]),
                      made["date"], made["machine"], made["torch"])  # fmt: skip
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise UnknownFigure(f"{record}: not JSON: {exc}") from exc
    verb = MADE_BY.get(doc.get("kind")) if isinstance(doc, dict) else None
    if verb is None:
        raise UnknownFigure(f"{record}: no course command writes a record of kind "
                            f"{doc.get('kind') if isinstance(doc, dict) else None!r}")  # fmt: skip
    prov = doc.get("provenance") or {}
    if verb == "record":
        command = ("python", "-m", "course", "record", doc["name"])
        gpus = int(prov.get("gpu_count") or 0)  # a recording on GPUs names them
        machine = prov.get("device") or prov.get("processor") or prov.get("machine", "")
    else:
        command = _with_out(prov.get("command", ""), record)
        gpus = int(prov.get("gpu_count") or 0)
        if verb == "bench" and gpus and "--gpus" not in command:  # as many as it measured,
            gpus = int((doc.get("settings") or {}).get("gpus") or gpus)  # not all there are
            command += ("--gpus", str(gpus))
        machine = prov.get("device") or prov.get("processor") or ""
        if prov.get("interconnect"):
            machine += f", {prov['interconnect']}"
    # A time measured on the CPU says how fast this many cores are: made again elsewhere, it
    # would be another machine's figure under this one's name. Recorded outputs are not
    # timings (one thread per process, checked on any machine by the test suite).
    cores = int(prov.get("cpus") or 0) if not gpus and verb in CPU_TIMINGS else 0
    date, torch = prov.get("date", ""), prov.get("torch", "")
    return Figure(record, verb, command, gpus, date, machine, torch, cores, prov.get("course", ""))


def candidates(root: Path = REPO_ROOT) -> list[Path]:
    """Every file under docs/results that a page can show: records and experiments' outputs."""
    folder = root / RESULTS
    return sorted([*folder.rglob("*.json"), *folder.rglob("*.txt")])


def catalog(root: Path = REPO_ROOT) -> list[Figure]:
    """Every figure the course knows how to make again (UnknownFigure for one it does not)."""
    return [_figure(path, root) for path in candidates(root)]


def recipe(record: str | Path, root: Path = REPO_ROOT) -> Figure:
    """How to make the record a page is about to render; UnknownFigure if the course cannot."""
    path = (root / record).resolve()
    if path.is_relative_to(root.resolve()):  # said as the pages name it
        record = path.relative_to(root.resolve()).as_posix()
    if not path.is_file():
        raise UnknownFigure(f"{record}: no such record")
    if not path.is_relative_to((root / RESULTS).resolve()):
        raise UnknownFigure(f"{record}: a page renders figures from {RESULTS}/ only")
    return _figure(path, root.resolve())


def visible_gpus() -> int:
    try:
        from course.runtime import visible_gpus as visible  # torch, loaded here only
    except ImportError:  # no torch
        return 0
    return visible()


def _table(figures: list[Figure]) -> str:
    rows = [("figure", "made by", "needs", "date", "machine", "torch", "course")]
    rows += [(f.name, f.verb, f.needs, f.date, f.machine, f.torch, f.course or "-")
             for f in figures]  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    import subprocess

    parser = argparse.ArgumentParser(
        prog="python -m course figures",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--run", action="store_true", help="make again what this machine can")
    parser.add_argument("--only", nargs="+", default=[], metavar="FIGURE",
                        help="these figures (names as the list shows them)")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    figures = catalog()
    names = {f.name: f for f in figures}
    unknown = [n for n in args.only if n not in names]
    if unknown:
        parser.error(f"no figure {', '.join(unknown)}; `python -m course figures` lists them")
    chosen = [names[n] for n in args.only] or figures
    if not args.run:
        print(_table(chosen))
        print(f"\n{len(chosen)} figures; `--run` makes again those this machine can.")
        return 0
    gpus, cores = visible_gpus(), os.cpu_count()
    failed = []
    for figure in chosen:
        if figure.gpus > gpus:
            print(f"{figure.name}: skipped, needs {figure.needs} (this machine has {gpus})")
            continue
        if figure.cores and figure.cores != cores:
            print(f"{figure.name}: skipped, measured on {figure.needs} (this machine has {cores})")
            continue
        command = [sys.executable, *figure.command[1:]]
        shown = " ".join(figure.command)
        if figure.verb == "experiment":
            shown += f" > {figure.record}"
        print(f"{figure.name}: {shown}", flush=True)
        if args.dry_run:
            continue
        if figure.verb == "experiment":  # the old output stays until the new one is whole
            done = subprocess.run(command, cwd=REPO_ROOT, stdout=subprocess.PIPE)
            code = done.returncode
            if not code:
                atomic.write(REPO_ROOT / figure.record, lambda f, text=done.stdout: f.write(text))
        else:  # a CPU timing sees no GPU, as where it was measured
            hidden = {"CUDA_VISIBLE_DEVICES": ""} if figure.cores else {}
            code = subprocess.call(command, cwd=REPO_ROOT, env={**os.environ, **hidden})
        if code:
            failed.append(f"{figure.name} (exit {code})")
    if failed:
        print(f"python -m course figures: error: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
