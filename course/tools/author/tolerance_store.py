"""The tolerance record's rules: docs/results/tolerances/cpu.json, its entries and checks.

`python -m course tolerances` (course/tools/author/measure_tolerances.py) writes the
record; the pages' tables (docs/hooks/directives/tolerances.py) and
tests/course/grader/test_tolerances.py
read it through these functions: what an entry holds, what is wrong with it, and how far a
value lies outside a bound, on the reference's side and on the mistakes'.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
from pathlib import Path

import course
from course.grader import tolerances

KIND = "course-tolerances"
RECORD = Path("docs") / "results" / "tolerances" / "cpu.json"


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
    if entry.get("busy", 0) != t.busy:
        found.append(f"{t.key}: declared to be measured beside {t.busy} busy loops, measured "
                     f"beside {entry.get('busy', 0)}: measure it again")  # fmt: skip
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


def beyond(t: tolerances.Tolerance, value: float) -> float:
    """How far `value` lies outside t's bound, as a fraction of it (0 inside)."""
    return outside_by(t.low, t.high, value)


def outside_by(low: float | None, high: float | None, value: float) -> float:
    """How far `value` lies outside [low, high], as a fraction of the bound (0 inside):
    (v - high) / high over a `high`, (low - v) / low under a `low`, the distance over
    the band's width for a band."""
    scale = (high - low) if high is not None and low is not None else abs(
        high if high is not None else low) or 1.0  # fmt: skip
    over = value - high if high is not None and value > high else 0.0
    under = low - value if low is not None and value < low else 0.0
    return max(over, under) / scale


def farthest(t: tolerances.Tolerance, values: list[float]) -> float:
    """Of what a mistake's run saw (a test may note several values, one a schedule, say), the
    one farthest outside the bound: what rejected it; if none is outside, the worst inside."""
    out = max(values, key=lambda v: beyond(t, v))
    return out if beyond(t, out) > 0 else worst(t, values)


def entry(t: tolerances.Tolerance, measured: dict, prov: dict) -> dict:
    values = [v for vs in measured["seen"].values() for v in vs]
    return {
        "what": t.what, "file": t.file, "test": t.test, "high": t.high, "low": t.low,
        "room": t.room, "busy": t.busy, **(summary(values) if values else {}),
        "seen": measured["seen"],
        "failed_seeds": measured["failed_seeds"], "date": prov["date"], "torch": prov["torch"],
        "command": prov["command"],
    }  # fmt: skip


def nearest_mistake(t: tolerances.Tolerance, entry: dict) -> tuple[str, float] | None:
    """(name, value) of the recorded mistake nearest the bound from outside it, if any."""
    outside = {name: m["value"] for name, m in entry.get("mistakes", {}).items()
               if m["value"] is not None and beyond(t, m["value"]) > 0}  # fmt: skip
    if not outside:
        return None
    name = min(outside, key=lambda n: beyond(t, outside[n]))
    return name, outside[name]


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
